"""The Team page of a project (its lead and operators manage it) and the invitation's sign-up page."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from config.errors import DomainError, NotFound
from tenancy import api_tokens, device_flow, selectors, service_accounts, ssh_keys, team
from tenancy.choices import TokenScope
from tenancy.forms import (
    DeviceCodeForm,
    InvitationAcceptForm,
    PersonalTokenForm,
    ServiceAccountForm,
    ServiceTokenForm,
    SshKeyForm,
    TeamAddForm,
    TeamRoleForm,
)
from tenancy.models import ApiToken, Invitation, Membership, ServiceAccount


def _project(request, pk):
    """The project when the user may see it (404 otherwise, also for another tenant's developers)."""
    return get_object_or_404(selectors.project_list_visible_to(user=request.user), pk=pk)


def _managed_project(request, pk):
    project = _project(request, pk)
    if not team.can_manage_team(request.user, project):
        raise PermissionDenied("Only the project's lead or an operator can change its team.")
    return project


def _refusal_on(form, error: DomainError) -> None:
    field = (error.details or {}).get("field") if isinstance(error.details, dict) else None
    form.add_error(field if field in form.fields else None, error.message)


def _token_form(account_id: int, data=None) -> ServiceTokenForm:
    """Each service account's token form, its fields' ids its own (several accounts share the page)."""
    return ServiceTokenForm(data, auto_id=f"id_svc{account_id}_%s")


def _team_context(request, project, can_manage, *, refused_token_form=None, **extra) -> dict:
    accounts = service_accounts.service_accounts_of(project) if can_manage else []
    for account in accounts:
        refused_here = refused_token_form is not None and refused_token_form.account_id == account.pk
        account.token_form = refused_token_form if refused_here else _token_form(account.pk)
    return {
        "project": project,
        "memberships": selectors.team_of(project),
        "invitations": list(selectors.invitations_open(project)) if can_manage else [],
        "service_accounts": accounts,
        "can_manage": can_manage,
        "form": TeamAddForm(),
        "account_form": ServiceAccountForm(),
        "role_choices": TeamRoleForm.base_fields["role"].choices,
        **extra,
    }


@login_required
@require_http_methods(["GET", "POST"])
def team_page(request, pk):
    project = _project(request, pk)
    can_manage = team.can_manage_team(request.user, project)
    form = TeamAddForm(request.POST or None)
    if request.method == "POST":
        if not can_manage:
            raise PermissionDenied("Only the project's lead or an operator can change its team.")
        if form.is_valid():
            try:
                added = team.team_member_add(
                    project=project,
                    identifier=form.cleaned_data["identifier"],
                    role=form.cleaned_data["role"],
                    actor=request.user,
                )
            except DomainError as error:
                _refusal_on(form, error)
            else:
                if isinstance(added, Invitation):
                    messages.success(request, f"Invitation sent to {added.email}.")
                else:
                    messages.success(request, f"{added.user.username} is now {added.get_role_display().lower()}.")
                return redirect("team:team", pk=project.pk)
    return render(
        request,
        "tenancy/team.html",
        _team_context(request, project, can_manage, form=form),
        status=422 if form.errors else 200,
    )


@login_required
@require_POST
def service_account_create(request, pk):
    project = _managed_project(request, pk)
    form = ServiceAccountForm(request.POST)
    if form.is_valid():
        try:
            account = service_accounts.service_account_create(
                project=project,
                name=form.cleaned_data["name"],
                description=form.cleaned_data["description"],
                actor=request.user,
            )
        except DomainError as error:
            _refusal_on(form, error)
        else:
            messages.success(request, f"Service account {account.user.username} created; issue it a token.")
            return redirect("team:team", pk=project.pk)
    context = _team_context(request, project, True, account_form=form)
    return render(request, "tenancy/team.html", context, status=422)


def _service_account(project, account_id) -> ServiceAccount:
    return get_object_or_404(ServiceAccount.objects.select_related("user", "project"), project=project, pk=account_id)


@login_required
@require_POST
def service_token_issue(request, pk, account_id):
    """The new token's secret is in this response only (201): never stored, never in a redirect or a message."""
    project = _managed_project(request, pk)
    account = _service_account(project, account_id)
    form = _token_form(account.pk, request.POST)
    form.account_id = account.pk
    if form.is_valid():
        try:
            issued = service_accounts.service_token_issue(
                account=account,
                name=form.cleaned_data["token_name"],
                scopes=form.cleaned_data["scopes"],
                expires_in_days=form.cleaned_data["expires_in_days"],
                actor=request.user,
            )
        except DomainError as error:
            _refusal_on(form, error)
        else:
            context = _team_context(request, project, True, issued=issued, issued_for=account)
            response = render(request, "tenancy/team.html", context, status=201)
            response["Cache-Control"] = "no-store"
            return response
    context = _team_context(request, project, True, refused_token_form=form)
    return render(request, "tenancy/team.html", context, status=422)


@login_required
@require_POST
def service_token_revoke(request, pk, token_id):
    project = _managed_project(request, pk)
    token = get_object_or_404(ApiToken, project=project, pk=token_id, user__service_account__project=project)
    try:
        service_accounts.service_token_revoke(token=token, actor=request.user)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Token {token.prefix}… revoked; it stopped working at once.")
    return redirect("team:team", pk=project.pk)


@login_required
@require_POST
def service_account_deactivate(request, pk, account_id):
    project = _managed_project(request, pk)
    account = _service_account(project, account_id)
    try:
        service_accounts.service_account_deactivate(account=account, actor=request.user)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"{account.user.username} is switched off; its tokens stopped working.")
    return redirect("team:team", pk=project.pk)


def _membership(project, user_id) -> Membership:
    return get_object_or_404(Membership.objects.select_related("user"), project=project, user_id=user_id)


@login_required
@require_POST
def team_role(request, pk, user_id):
    project = _managed_project(request, pk)
    membership = _membership(project, user_id)
    form = TeamRoleForm(request.POST)
    try:
        if not form.is_valid():
            raise DomainError("Choose member or approver.", code="invalid_role")
        team.team_role_change(project=project, user=membership.user, role=form.cleaned_data["role"], actor=request.user)
    except DomainError as error:
        messages.error(request, f"{membership.user.username}: {error.message}")
    else:
        messages.success(request, f"{membership.user.username} is now {form.cleaned_data['role']}.")
    return redirect("team:team", pk=project.pk)


@login_required
@require_POST
def team_remove(request, pk, user_id):
    project = _managed_project(request, pk)
    membership = _membership(project, user_id)
    try:
        team.team_member_remove(project=project, user=membership.user, actor=request.user)
    except DomainError as error:
        messages.error(request, f"{membership.user.username}: {error.message}")
    else:
        messages.success(request, f"{membership.user.username} was removed from {project.name}.")
    return redirect("team:team", pk=project.pk)


@login_required
@require_POST
def invitation_revoke(request, pk, invitation_id):
    project = _managed_project(request, pk)
    invitation = get_object_or_404(Invitation, project=project, pk=invitation_id)
    try:
        team.invitation_revoke(invitation=invitation, actor=request.user)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"The invitation of {invitation.email} was withdrawn.")
    return redirect("team:team", pk=project.pk)


@require_http_methods(["GET", "POST"])
def invitation_accept(request, token):
    """Anyone holding the link: signed in, they join with their account; otherwise they sign in first or create an
    account here, which signs them in."""
    invitation = team.invitation_for_token(token)
    if invitation is None:
        return render(request, "tenancy/invitation_invalid.html", status=404)
    if request.user.is_authenticated:
        return _join_as_signed_in(request, token, invitation)
    if not settings.LOCAL_PASSWORD_SIGN_IN:  # people sign in with the company's identity, then join
        if request.method == "POST":
            raise PermissionDenied("Sign in with your company account to join.")
        return render(request, "tenancy/invitation_accept.html", {"invitation": invitation, "local_accounts": False})
    form = InvitationAcceptForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = team.invitation_accept(
                token=token,
                username=form.cleaned_data["username"],
                password=form.cleaned_data["password"],
                first_name=form.cleaned_data["first_name"],
                last_name=form.cleaned_data["last_name"],
            )
        except DomainError as error:
            _refusal_on(form, error)
        else:
            login(request, user, backend="tenancy.sign_in_backends.LocalPasswordBackend")
            return _welcome(request, invitation)
    return render(
        request,
        "tenancy/invitation_accept.html",
        {"invitation": invitation, "form": form, "local_accounts": True},
        status=422 if form.errors else 200,
    )


def _join_as_signed_in(request, token, invitation):
    refusal = None
    if request.method == "POST":
        try:
            team.invitation_accept_as(token=token, user=request.user)
        except DomainError as error:
            refusal = error.message
        else:
            return _welcome(request, invitation)
    return render(
        request,
        "tenancy/invitation_accept.html",
        {"invitation": invitation, "refusal": refusal},
        status=409 if refusal else 200,
    )


def _welcome(request, invitation):
    messages.success(
        request, f"Welcome! You are now {invitation.get_role_display().lower()} of {invitation.project.name}."
    )
    return redirect("portal:catalog")


# --- a person's own API tokens -------------------------------------------------------------------------------------


def _tokens_page(request, form, *, issued=None, status=200):
    context = {
        "section": "api-tokens",
        "tokens": api_tokens.personal_tokens_working(user=request.user),
        "form": form,
        "issued": issued,
        "company_sign_in": device_flow.company_sign_in_on(),
    }
    response = render(request, "tenancy/api_tokens.html", context, status=status)
    if issued is not None:
        response["Cache-Control"] = "no-store"  # the secret is in this response only
    return response


@login_required
@require_http_methods(["GET", "POST"])
def api_tokens_page(request):
    """The signed-in person's API tokens (for `cc login` and scripts): issue one, shown once in the 201 that issues
    it (never stored, never in a redirect or a message), and revoke."""
    if request.method == "GET":
        return _tokens_page(request, PersonalTokenForm())
    form = PersonalTokenForm(request.POST)
    if form.is_valid():
        try:
            issued = api_tokens.api_token_issue(
                user=request.user,
                name=form.cleaned_data["token_name"],
                actor=request.user,
                expires_in_days=form.cleaned_data["expires_in_days"],
                scopes=form.cleaned_data["scopes"],
            )
        except DomainError as error:
            _refusal_on(form, error)
        else:
            return _tokens_page(request, PersonalTokenForm(), issued=issued, status=201)
    return _tokens_page(request, form, status=422)


@login_required
@require_POST
def api_token_revoke(request, token_id):
    try:
        token = api_tokens.personal_token_revoke(token_id=token_id, actor=request.user)
    except NotFound as error:
        raise Http404(error.message) from error
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Token {token.name} ({token.prefix}…) revoked; it stopped working at once.")
    return redirect("team:api-tokens")


# --- a person's SSH keys ---------------------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def ssh_keys_page(request):
    """The signed-in person's SSH public keys, which every container workspace they order starts with."""
    form = SshKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            key = ssh_keys.ssh_key_add(user=request.user, actor=request.user, **form.cleaned_data)
        except DomainError as error:
            _refusal_on(form, error)
        else:
            messages.success(request, f"Key {key.name} added ({key.fingerprint}); your next workspaces accept it.")
            return redirect("team:ssh-keys")
    context = {"section": "ssh-keys", "keys": ssh_keys.ssh_keys_of(user=request.user), "form": form}
    return render(request, "tenancy/ssh_keys.html", context, status=422 if form.errors else 200)


@login_required
@require_POST
def ssh_key_remove(request, key_id):
    try:
        key = ssh_keys.ssh_key_remove(user=request.user, key_id=key_id, actor=request.user)
    except NotFound as error:
        raise Http404(error.message) from error
    messages.success(request, f"Key {key.name} removed; workspaces started from now on do not accept it.")
    return redirect("team:ssh-keys")


# --- `cc login`'s device sign-in -------------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def device_page(request):
    """Where the person, signed in however this server signs people in, types the code `cc login` shows (or follows
    its link with the code filled in), sees what the terminal asks for and approves or denies it."""
    form = DeviceCodeForm(request.POST if request.method == "POST" else request.GET or None)
    if not form.is_bound or not form.is_valid():
        return _device_page(request, form, status=422 if form.is_bound else 200)
    try:
        authorization = device_flow.device_authorization_for_user_code(
            typed=form.cleaned_data["user_code"], person=request.user
        )
        decision = form.cleaned_data["decision"] if request.method == "POST" else ""
        if decision:
            authorization = device_flow.device_authorization_decide(
                authorization=authorization, approve=decision == "approve", actor=request.user
            )
    except DomainError as error:
        _refusal_on(form, error)
        return _device_page(request, form, status=error.status_code)
    return _device_page(request, form, authorization=authorization, decided=bool(decision))


def _device_page(request, form, *, authorization=None, decided=False, status=200):
    context = {
        "section": "api-tokens",
        "form": form,
        "authorization": authorization,
        "decided": decided,
        "scope_labels": [(scope, TokenScope(scope).label) for scope in authorization.scopes] if authorization else [],
    }
    return render(request, "tenancy/device.html", context, status=status)
