"""Portal forms. They collect and clean input; services decide (and refuse with reasons)."""

from django import forms

from catalog import selectors as catalog_selectors
from catalog.choices import ServiceKind
from catalog.models import Service
from requests.choices import IfUnplaceable, OverQuota, PriorityClass
from requests.orders import SERVING_LIMITS, Order
from tenancy.choices import ProjectPermission, QuotaDimension
from tenancy.models import User
from tenancy.selectors import projects_with_permission

ENVIRONMENTS = [("development", "Development"), ("staging", "Staging"), ("production", "Production")]
_OFFERINGS = {
    ServiceKind.COMPUTE: ("spec", "image"),
    ServiceKind.BARE_METAL: ("bare_metal_profile",),
    ServiceKind.MODEL_SERVING: ("serving_model", "serving_template", "spec"),
}


def orderable_projects(user: User):
    return projects_with_permission(user=user, permission=ProjectPermission.REQUEST).filter(active=True) \
        .select_related("tenant").order_by("tenant__name", "name")


class OrderForm(forms.Form):
    project = forms.ModelChoiceField(queryset=None, empty_label=None)
    spec = forms.ModelChoiceField(queryset=None, required=False, label="Resource spec")
    image = forms.ModelChoiceField(queryset=None, required=False)
    bare_metal_profile = forms.ModelChoiceField(queryset=None, required=False, label="Server profile")
    serving_model = forms.ModelChoiceField(queryset=None, required=False, label="Model")
    serving_template = forms.ModelChoiceField(queryset=None, required=False, label="Serving template")
    duration_hours = forms.IntegerField(min_value=1, label="Duration (hours)")
    priority = forms.ChoiceField(choices=PriorityClass.choices, initial=PriorityClass.STANDARD,
                                 help_text="Above the project's priority entitlement (see the preview), it needs an "
                                           "approved quota exception.")
    environment = forms.ChoiceField(choices=ENVIRONMENTS, initial="development")
    rate_limit_per_minute = forms.IntegerField(min_value=1, required=False, label="Rate limit (requests/minute)",
                                               help_text="Per API key. Empty: the platform default.")
    monthly_token_budget = forms.IntegerField(min_value=1, required=False, label="Monthly token budget",
                                              help_text="Input + output tokens a month. Empty: no budget.")
    parameters = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                 help_text="Extra fields, one key=value per line.")
    justification = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                                    help_text="What it is for. Needed for a quota exception.")
    over_quota = forms.ChoiceField(choices=OverQuota.choices, initial=OverQuota.REJECT,
                                   widget=forms.RadioSelect,
                                   label="If it does not fit the quota or the priority entitlement")
    if_unplaceable = forms.ChoiceField(
        choices=IfUnplaceable.choices, initial=IfUnplaceable.WARN, required=False, widget=forms.RadioSelect,
        label="If no node could ever hold it",
        help_text="It needs more cards, cores or memory on one node than the largest compatible node has; "
                  "the preview says so before you submit.")

    def __init__(self, *args, user: User, service: Service, **kwargs):
        super().__init__(*args, **kwargs)
        self.service = service
        self.fields["project"].queryset = orderable_projects(user)
        self.fields["spec"].queryset = catalog_selectors.spec_list(user=user).filter(services=service)
        self.fields["image"].queryset = catalog_selectors.image_list(user=user).filter(services=service)
        self.fields["bare_metal_profile"].queryset = catalog_selectors.bare_metal_profile_list(user=user).filter(
            services=service)
        self.fields["serving_model"].queryset = catalog_selectors.serving_model_list(user=user).filter(
            services=service)
        self.fields["serving_template"].queryset = catalog_selectors.serving_template_list(user=user).filter(
            models__services=service).distinct()
        self.fields["duration_hours"].max_value = service.max_duration_hours
        self.fields["duration_hours"].initial = service.default_duration_hours
        self.fields["duration_hours"].help_text = f"Up to {service.max_duration_hours} hours."
        for name in {"spec", "image", "bare_metal_profile", "serving_model", "serving_template"} - set(
                _OFFERINGS[service.kind]):
            del self.fields[name]
        for name in _OFFERINGS[service.kind]:
            self.fields[name].required = True
            self.fields[name].empty_label = None
        if service.kind != ServiceKind.MODEL_SERVING:
            for name in SERVING_LIMITS:
                del self.fields[name]

    def clean_if_unplaceable(self) -> str:
        return self.cleaned_data["if_unplaceable"] or IfUnplaceable.WARN  # left unchosen: the API's default

    def clean_parameters(self) -> dict[str, str]:
        parameters = {}
        for number, line in enumerate(self.cleaned_data["parameters"].splitlines(), start=1):
            if not line.strip():
                continue
            key, separator, value = line.partition("=")
            if not separator or not key.strip():
                raise forms.ValidationError(f"Line {number} is not key=value: {line.strip()!r}")
            parameters[key.strip()] = value.strip()
        return parameters

    def order(self) -> Order:
        data = self.cleaned_data
        return Order(
            service=self.service, project=data["project"], duration_hours=data["duration_hours"],
            spec=data.get("spec"), image=data.get("image"), bare_metal_profile=data.get("bare_metal_profile"),
            serving_model=data.get("serving_model"), serving_template=data.get("serving_template"),
            priority=data["priority"], justification=data["justification"],
            parameters={"environment": data["environment"], **data["parameters"],
                        **{name: str(data[name]) for name in SERVING_LIMITS if data.get(name)}},
        )


class DecisionForm(forms.Form):
    comment = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))


class QuotaChangeForm(forms.Form):
    """Only the dimensions the lead fills in are asked for."""

    justification = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for dimension in QuotaDimension:
            self.fields[dimension.value] = forms.DecimalField(label=dimension.label, required=False, min_value=0,
                                                              max_digits=12, decimal_places=2)

    def limits(self) -> dict:
        return {dimension: self.cleaned_data[dimension] for dimension in QuotaDimension.values
                if self.cleaned_data.get(dimension) is not None}
