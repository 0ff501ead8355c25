from django import forms

from tenancy.choices import PERSONAL_DEFAULT_SCOPES, SERVICE_ACCOUNT_SCOPES, Role, TokenScope
from tenancy.team import TEAM_ROLES

ROLE_CHOICES = [(role, Role(role).label) for role in TEAM_ROLES]


class TeamAddForm(forms.Form):
    identifier = forms.CharField(
        label="Username or e-mail",
        max_length=254,
        help_text="People of your tenant are added at once; anyone else gets an e-mail invitation to accept.",
    )
    role = forms.ChoiceField(choices=ROLE_CHOICES, initial=Role.MEMBER)


class TeamRoleForm(forms.Form):
    role = forms.ChoiceField(choices=ROLE_CHOICES)


class InvitationAcceptForm(forms.Form):
    username = forms.CharField(max_length=150)
    first_name = forms.CharField(max_length=150, required=False)
    last_name = forms.CharField(max_length=150, required=False)
    password = forms.CharField(widget=forms.PasswordInput, max_length=128)
    password_again = forms.CharField(label="Password again", widget=forms.PasswordInput, max_length=128)

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("password") and cleaned.get("password") != cleaned.get("password_again"):
            self.add_error("password_again", "The two passwords differ.")
        return cleaned


class ServiceAccountForm(forms.Form):
    name = forms.CharField(max_length=40, help_text="What runs as it, e.g. nightly-ci (lowercase, digits, hyphens).")
    description = forms.CharField(max_length=200, required=False)


class SshKeyForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="Which machine holds the private key, e.g. work laptop.")
    public_key = forms.CharField(
        label="Public key",
        max_length=20000,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "autocomplete": "off"}),
        help_text="The line of your .pub file, e.g. ssh-ed25519 AAAA... me@laptop. Never the private key.",
    )


class PersonalTokenForm(forms.Form):
    """A person's own token (the `cc` command line, a script): every scope offered, the reading ones and ordering
    checked at first."""

    token_name = forms.CharField(label="Token name", max_length=80, help_text="What uses it, e.g. my laptop's cc.")
    scopes = forms.MultipleChoiceField(
        choices=[(scope, f"{scope}: {TokenScope(scope).label}") for scope in TokenScope.values],
        initial=PERSONAL_DEFAULT_SCOPES,
        widget=forms.CheckboxSelectMultiple,
        help_text="Give it only what it needs; it acts with your rights within them.",
    )
    expires_in_days = forms.IntegerField(
        label="Expires in (days)", min_value=1, required=False, help_text="Empty: the platform's default."
    )


class ServiceTokenForm(forms.Form):
    token_name = forms.CharField(label="Token name", max_length=80, help_text="Where it is kept, e.g. GitLab CI.")
    scopes = forms.MultipleChoiceField(
        choices=[(scope, f"{scope}: {TokenScope(scope).label}") for scope in SERVICE_ACCOUNT_SCOPES],
        widget=forms.CheckboxSelectMultiple,
        help_text="Give only what the pipeline needs.",
    )
    expires_in_days = forms.IntegerField(
        label="Expires in (days)", min_value=1, required=False, help_text="Empty: the platform's default."
    )


class DeviceCodeForm(forms.Form):
    """The code `cc login` shows, typed on /device/; `decision` is which button confirmed it."""

    user_code = forms.CharField(
        label="Code from your terminal", max_length=20, help_text="As `cc login` shows it, e.g. BDFG-HJKL."
    )
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("deny", "Deny")], required=False)
