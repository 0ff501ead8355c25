"""Portal forms. They collect and clean input; services decide (and refuse with reasons)."""

import uuid
from collections import defaultdict
from decimal import Decimal

from django import forms
from django.conf import settings
from django.forms.utils import pretty_name
from django.http import QueryDict

from catalog import selectors as catalog_selectors
from catalog.choices import ServiceKind
from catalog.durations import default_duration_hours, max_duration_hours
from catalog.models import ResourceSpec, Service, Vendor
from catalog.parameters import MAX_STRING_LENGTH, ParameterInvalid, parameters_clean
from config.session_end import RESUME_PARAMETER
from requests import serving_choices
from requests.choices import IfUnplaceable, OverQuota, PriorityClass, RequestState
from requests.models import ResourceRequest
from requests.orders import Order
from tenancy.choices import ProjectPermission, QuotaDimension
from tenancy.models import User
from tenancy.selectors import project_list_visible_to, projects_with_permission

_ALL_OFFERINGS = ("spec", "image", "bare_metal_profile", "serving_model", "serving_template")
_OFFERINGS = {
    ServiceKind.COMPUTE: ("spec", "image"),
    ServiceKind.BARE_METAL: ("bare_metal_profile",),
    ServiceKind.MODEL_SERVING: ("serving_model", "serving_template"),  # each replica runs on the template's spec
}


# What a catalog link may name in the order form's query string: the form's own field names, and these shorter
# ones people read in a URL.
PREFILL_ALIASES = {
    "profile": "bare_metal_profile",
    "model": "serving_model",
    "template": "serving_template",
    "duration": "duration_hours",
}


def orderable_projects(user: User):
    return (
        projects_with_permission(user=user, permission=ProjectPermission.REQUEST)
        .filter(active=True)
        .select_related("tenant")
        .order_by("tenant__name", "name")
    )


def working_project(user: User, projects: list):
    """Of the projects the user may order on, the one of their latest order (what they are working on), else the
    first: where the catalog and the order form start."""
    latest = (
        ResourceRequest.objects.filter(requester=user, project__in=[project.pk for project in projects])
        .order_by("-created_at", "-id")
        .values_list("project_id", flat=True)
        .first()
    )
    return next((project for project in projects if project.pk == latest), projects[0] if projects else None)


def _profile_choice(profile) -> str:
    return f"{profile.name} — {profile.get_slurm_membership_display()}"


class OrderForm(forms.Form):
    """The order form: the service's offerings, a duration within the one limit that applies, and a field per
    parameter the service declares (catalog.parameters), checked by the same function the API uses."""

    project = forms.ModelChoiceField(queryset=None, empty_label=None)
    spec = forms.ModelChoiceField(queryset=None, required=False, label="Resource spec")
    image = forms.ModelChoiceField(queryset=None, required=False)
    bare_metal_profile = forms.ModelChoiceField(
        queryset=None,
        required=False,
        label="Server profile",
        help_text="Each profile says how the server joins Slurm: in the shared cluster you get no root; with root "
        "the server runs its own cluster, or none.",
    )
    serving_model = forms.ModelChoiceField(queryset=None, required=False, label="Model")
    serving_template = forms.ModelChoiceField(queryset=None, required=False, label="Serving template")
    duration_hours = forms.IntegerField(min_value=1, label="Duration (hours)")
    start_at = forms.DateTimeField(
        required=False,
        label="Reserve from (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    priority = forms.ChoiceField(
        choices=PriorityClass.choices,
        initial=PriorityClass.STANDARD,
        help_text="Above the project's priority entitlement (see the preview), it needs an approved quota exception.",
    )
    justification = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="What it is for. Needed for a quota exception.",
    )
    over_quota = forms.ChoiceField(
        choices=OverQuota.choices,
        initial=OverQuota.REJECT,
        widget=forms.RadioSelect,
        label="If it does not fit the quota or the priority entitlement",
    )
    # One per rendered form: sent again (Back, then Submit once more), it names the request it made.
    idempotency_key = forms.CharField(
        widget=forms.HiddenInput, required=False, max_length=255, initial=lambda: uuid.uuid4().hex
    )
    if_unplaceable = forms.ChoiceField(
        choices=IfUnplaceable.choices,
        initial=IfUnplaceable.WARN,
        required=False,
        widget=forms.RadioSelect,
        label="If no node could ever hold it",
        help_text="It needs more cards, cores or memory on one node than the largest compatible node has; "
        "the preview says so before you submit.",
    )

    def __init__(self, *args, user: User, service: Service, settle: bool = False, **kwargs):
        """`settle`: a template the chosen model does not have (the model just changed in the live form) becomes
        the model's first one, named in `settled`, instead of an error."""
        super().__init__(*args, **kwargs)
        self.service, self.user, self.settled = service, user, []
        self.fields["project"].queryset = orderable_projects(user)
        if not self.is_bound and "project" not in self.initial:
            self.initial["project"] = working_project(user, list(self.fields["project"].queryset))
        self.fields["spec"].queryset = catalog_selectors.spec_list(user=user).filter(services=service)
        self.fields["image"].queryset = catalog_selectors.image_list(user=user).filter(services=service)
        self.fields["bare_metal_profile"].queryset = catalog_selectors.bare_metal_profile_list(user=user).filter(
            services=service
        )
        self.fields["bare_metal_profile"].label_from_instance = _profile_choice
        self.fields["serving_model"].queryset = serving_choices.model_queryset(service, user)
        for name in set(_ALL_OFFERINGS) - set(_OFFERINGS[service.kind]):
            del self.fields[name]
        for name in _OFFERINGS[service.kind]:
            self.fields[name].required = True
            self.fields[name].empty_label = None
        if "serving_template" in self.fields:
            self._offer_templates_of_the_model(user, settle)
        self.fields["duration_hours"] = self._duration_field()
        if service.kind != ServiceKind.COMPUTE:
            del self.fields["start_at"]  # only compute orders reserve a window (requests/reservations.py)
        else:
            self.fields["start_at"].help_text = (
                "Optional: reserve this window (it lasts the duration), ending within "
                f"{settings.RESERVATION_HORIZON_DAYS} days. On Slurm nodes whole nodes are reserved (Slurm reserves "
                "nodes, not single cards). Empty: it runs as soon as it can."
            )
        self.parameter_names = [entry["name"] for entry in service.parameter_schema]
        for entry in service.parameter_schema:
            self.fields[entry["name"]] = parameter_field(entry)
        last = ["justification", "over_quota", "if_unplaceable", "idempotency_key"]
        self.order_fields([name for name in self.fields if name not in last] + last)

    def _offer_templates_of_the_model(self, user: User, settle: bool) -> None:
        """Only the chosen model's templates, those that can run here first, and one of them chosen: the submitted
        one, else the one a link chose, else the first."""
        model = self._chosen("serving_model")
        choices = serving_choices.template_choices(self.service, model, user)
        field = self.fields["serving_template"]
        field.queryset, field.label_from_instance = choices.queryset(), choices.label
        field.error_messages["invalid_choice"] = "That template does not serve the chosen model; pick one of its own."
        name = self.add_prefix("serving_template")
        if not self.is_bound:
            linked = getattr(self.initial.get("serving_template"), "pk", self.initial.get("serving_template"))
            if linked not in {template.pk for template in choices.templates}:
                self.initial["serving_template"] = choices.first
        elif settle and choices.first is not None and self._chosen("serving_template") is None:
            self.data = self.data.copy()
            self.data[name] = str(choices.first.pk)
            self.settled.append("serving_template")

    def _chosen(self, name: str):
        """The value of a choice field as the form shows it: submitted (None when the field refuses it), else the
        initial one, else the first choice."""
        field = self.fields[name]
        if self.is_bound:
            try:
                return field.clean(self.data.get(self.add_prefix(name)))
            except forms.ValidationError:
                return None
        return self.initial.get(name) or field.queryset.first()

    @classmethod
    def prefilled(cls, query: QueryDict, *, user: User, service: Service) -> tuple["OrderForm", list[str]]:
        """An unbound form with what the query string chose, each value cleaned by its field as a POST would be;
        values the form cannot take are left out, each with a sentence saying so."""
        probe = cls(user=user, service=service)
        initial, notices, duration, served_on = {}, [], None, None
        for key, values in query.lists():
            if key == RESUME_PARAMETER:  # the page's script puts back what was typed before a sign-in: not a choice
                continue
            name = PREFILL_ALIASES.get(key, key)
            if name == "spec" and "serving_template" in probe.fields:  # a catalog row of a serving service
                served_on = values[-1]
            elif name not in probe.fields:
                notices.append(f"The link's “{key}” is not an option of {service.name}; it was left out.")
            elif name == "duration_hours":  # its limit depends on the offering chosen: checked once that is known
                duration = values[-1]
            else:
                try:
                    initial[name] = probe.fields[name].clean(values[-1])
                except forms.ValidationError as error:
                    notices.append(_left_out(name, probe.fields[name], error))
        if served_on is not None and "serving_template" not in initial:
            pair = probe.served_on_spec(initial.get("serving_model"), served_on)
            if pair is None:
                whose = "the chosen model's templates" if initial.get("serving_model") else "the models' templates"
                notices.append(f"None of {whose} runs on the link's resource spec; it was left out.")
            else:
                initial["serving_model"], initial["serving_template"] = pair
        form = cls(user=user, service=service, initial=initial)
        if duration is not None:
            try:
                form.initial["duration_hours"] = form.fields["duration_hours"].clean(duration)
            except forms.ValidationError as error:
                notices.append(_left_out("duration_hours", form.fields["duration_hours"], error))
        return form, notices

    def served_on_spec(self, model, spec_id: str):
        """(model, template) of the first template on that spec: of the model a link chose, else of the first model
        that has one; None when there is none."""
        for candidate in [model] if model else self.fields["serving_model"].queryset:
            choices = serving_choices.template_choices(self.service, candidate, self.user)
            template = next((t for t in choices.templates if str(t.spec_id) == str(spec_id)), None)
            if template is not None:
                return candidate, template
        return None

    def as_data(self) -> dict:
        """The values the form shows, as a POST of it would send them (to preview what is on screen)."""
        data = {}
        for bound in self:
            value = bound.value()
            if (
                value in (None, "")
                and isinstance(bound.field, forms.ModelChoiceField)
                and bound.field.empty_label is None
            ):
                value = _first_choice(bound.field)  # a select without a blank shows, and a browser sends, its first
            if value not in (None, ""):
                data[bound.html_name] = value
        return data

    def with_new_key(self) -> "OrderForm":
        """The same form as posted, with a key of its own: the form of a second submission of the same order."""
        data = self.data.copy()
        data[self.add_prefix("idempotency_key")] = uuid.uuid4().hex
        form = type(self)(data, user=self.user, service=self.service)
        form.is_valid()
        return form

    def clean_if_unplaceable(self) -> str:
        return self.cleaned_data["if_unplaceable"] or IfUnplaceable.WARN  # left unchosen: the API's default

    def _chosen_offering(self) -> dict:
        """The spec, template or profile the form has selected: the submitted one, else the one a link chose, else
        the first (the one the page shows selected)."""
        chosen = {}
        for name in ("spec", "serving_template", "bare_metal_profile"):
            field = self.fields.get(name)
            if field is None:
                continue
            try:
                chosen[name] = (
                    field.clean(self.data.get(self.add_prefix(name)))
                    if self.is_bound
                    else self.initial.get(name) or field.queryset.first()
                )
            except forms.ValidationError:
                chosen[name] = None
        return chosen

    def _duration_field(self) -> forms.IntegerField:
        offering = self._chosen_offering()
        maximum = max_duration_hours(self.service, **offering)
        return forms.IntegerField(
            min_value=1,
            max_value=maximum,
            label="Duration (hours)",
            initial=default_duration_hours(self.service, **offering),
            help_text=f"Up to {maximum} hours.{self._limits_by_choice()}",
        )

    def _limits_by_choice(self) -> str:
        """When the choices this form offers have different limits, which has which (the most common as 'the
        others'), so the hint stays true after another choice is picked."""
        kind = next(name for name in ("bare_metal_profile", "serving_template", "spec") if name in self.fields)
        names_by_hours = defaultdict(list)
        for offer in self.fields[kind].queryset:
            names_by_hours[max_duration_hours(self.service, **{kind: offer})].append(offer.name)
        if len(names_by_hours) < 2:
            return ""
        common = max(names_by_hours, key=lambda hours: len(names_by_hours[hours]))
        parts = [f"{'; '.join(names)}: {hours} h" for hours, names in names_by_hours.items() if hours != common]
        others = "the others" if len(names_by_hours[common]) > 1 else names_by_hours[common][0]
        return f" By choice: {'; '.join(parts)}; {others}: {common} h."

    def clean(self):
        cleaned = super().clean()
        supplied = {name: cleaned[name] for name in self.parameter_names if cleaned.get(name) not in (None, "")}
        try:
            cleaned["parameters"] = parameters_clean(self.service.parameter_schema, supplied)
        except ParameterInvalid as refusal:
            parameter = refusal.details.get("parameter")
            self.add_error(parameter if parameter in self.fields else None, refusal.message)
        return cleaned

    def order(self) -> Order:
        data = self.cleaned_data
        template = data.get("serving_template")
        return Order(
            service=self.service,
            project=data["project"],
            duration_hours=data["duration_hours"],
            spec=template.spec if template else data.get("spec"),
            image=data.get("image"),
            bare_metal_profile=data.get("bare_metal_profile"),
            serving_model=data.get("serving_model"),
            serving_template=data.get("serving_template"),
            priority=data["priority"],
            justification=data["justification"],
            parameters=data["parameters"],
            start_at=data.get("start_at"),
        )


def _first_choice(field: forms.ModelChoiceField):
    first = field.queryset.first()
    return None if first is None else first.pk


def _left_out(name: str, field: forms.Field, error: forms.ValidationError) -> str:
    label = (field.label or pretty_name(name)).lower()
    return f"The link's {label} was left out: {' '.join(error.messages)}"


def parameter_field(entry: dict) -> forms.Field:
    """The form field of one declared parameter. It only parses and renders (HTML min, max, maxlength);
    whether the value is allowed is parameters_clean's call, in clean()."""
    common = {
        "label": entry.get("label") or entry["name"].replace("_", " ").capitalize(),
        "required": False,
        "help_text": entry.get("help", ""),
        "initial": entry.get("default"),
    }
    kind = entry["type"]
    if kind == "enum":
        choices = [(choice, choice) for choice in entry["choices"]]
        return forms.ChoiceField(choices=choices if "default" in entry else [("", "—"), *choices], **common)
    if kind == "bool":
        return forms.BooleanField(**common)
    if kind == "string":
        return forms.CharField(
            widget=forms.TextInput(attrs={"maxlength": entry.get("max_length", MAX_STRING_LENGTH)}), **common
        )
    bounds = {key: entry[key] for key in ("min", "max") if key in entry}
    if kind == "int":
        return forms.IntegerField(widget=forms.NumberInput(attrs={**bounds, "step": 1}), **common)
    return forms.FloatField(widget=forms.NumberInput(attrs={**bounds, "step": "any"}), **common)


class DecisionForm(forms.Form):
    comment = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))


class QuotaChangeForm(forms.Form):
    """Starts from the project's current limits (a link may propose others); what differs from them is asked for.
    An empty field is no limit."""

    justification = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(self, *args, current: dict, **kwargs):
        kwargs["initial"] = {**{key: _plain(value) for key, value in current.items()}, **kwargs.get("initial", {})}
        super().__init__(*args, **kwargs)
        self.current = current
        for dimension in QuotaDimension:
            self.fields[dimension.value] = forms.DecimalField(
                label=dimension.label,
                required=False,
                min_value=0,
                max_digits=12,
                decimal_places=2,
                help_text=_now(current[dimension.value]),
            )
        self.order_fields([*QuotaDimension.values, "justification"])

    @classmethod
    def prefill_from(cls, query: QueryDict) -> dict:
        """Initial values from a link (the order page's "ask for a larger quota"): each value its field takes;
        others are dropped, since the lead reviews the form before sending it anyway."""
        fields = cls(current=dict.fromkeys(QuotaDimension.values)).fields
        initial = {}
        for name, field in fields.items():
            try:
                value = field.clean(query.get(name))
            except forms.ValidationError:
                continue
            if value not in (None, ""):
                initial[name] = value
        return initial

    def clean(self):
        cleaned = super().clean()
        if not self.errors and not self.limits():
            raise forms.ValidationError("These are the current limits: change at least one.", code="no_change")
        return cleaned

    def limits(self) -> dict:
        """The limits sent that differ from the current ones (an empty field: no limit; a field not sent at all is
        left as it is)."""
        return {
            dimension: self.cleaned_data.get(dimension)
            for dimension in QuotaDimension.values
            if dimension in self.data and self.cleaned_data.get(dimension) != self.current[dimension]
        }


def _plain(limit):
    """A limit as a person writes it: 16 rather than 16.00, 0.5 rather than 0.50."""
    if not isinstance(limit, Decimal):
        return limit
    return int(limit) if limit == limit.to_integral_value() else limit.normalize()


def _now(limit) -> str:
    return "Now: no limit." if limit is None else f"Now: {_plain(limit)}."


class ReasonForm(forms.Form):
    """The confirm step of releasing or cancelling a request: an optional reason for the timeline."""

    reason = forms.CharField(required=False, max_length=500, widget=forms.TextInput(attrs={"placeholder": "Optional"}))


class ExtendForm(forms.Form):
    hours = forms.IntegerField(label="Extend by (hours)", min_value=1, initial=24)
    justification = forms.CharField(label="Why", max_length=2000)


class CatalogFilterForm(forms.Form):
    """The catalog's search and filters; every field is optional and a value the form cannot take is no filter."""

    q = forms.CharField(required=False, max_length=100, label="Search")
    vendor = forms.ModelChoiceField(
        queryset=Vendor.objects.order_by("name"), to_field_name="slug", required=False, empty_label="Any vendor"
    )
    min_accelerator_memory = forms.IntegerField(required=False, min_value=0, label="Accelerator memory at least (GiB)")
    max_hourly_price = forms.DecimalField(required=False, min_value=0, max_digits=12, decimal_places=2)
    fits_quota = forms.BooleanField(required=False, label="Fits my project's remaining quota")

    def __init__(self, *args, currency: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["max_hourly_price"].label = f"Price per hour at most ({currency})"

    def filters(self) -> dict:
        """The filters that hold a value (none when the form is invalid: the whole catalog is shown)."""
        if not self.is_valid():
            return {}
        return {name: value for name, value in self.cleaned_data.items() if value not in (None, "", False)}


class RequestListFilterForm(forms.Form):
    """The request list's search and filters. Every field is optional and a value the form cannot take is no filter;
    `mine` starts as the role's default (requests.selectors.request_list_starts_with_own)."""

    q = forms.CharField(required=False, max_length=100, label="Search", help_text="#id, service, spec, person, project")
    state = forms.ChoiceField(required=False, choices=[("", "Any state"), *RequestState.choices])
    project = forms.ModelChoiceField(queryset=None, required=False, empty_label="All projects")
    spec = forms.ModelChoiceField(queryset=None, required=False, empty_label="Any spec", label="Spec")
    mine = forms.ChoiceField(required=False, choices=[("1", "Mine"), ("0", "All I can see")], label="Show")

    def __init__(self, data, *, user: User, own_first: bool):
        data = data.copy()
        data.setdefault("mine", "1" if own_first else "0")
        super().__init__(data)
        self.own_first = own_first
        self.fields["project"].queryset = project_list_visible_to(user=user).select_related("tenant")
        self.fields["spec"].queryset = ResourceSpec.objects.order_by("name")

    def filters(self) -> dict:
        """What to narrow the list to: state, project, spec, search text and whether only the user's own."""
        cleaned = self.cleaned_data if self.is_valid() else {}
        return {
            "mine": cleaned.get("mine", "1" if self.own_first else "0") == "1",
            "state": cleaned.get("state", ""),
            "project": cleaned.get("project"),
            "spec": cleaned.get("spec"),
            "text": cleaned.get("q", ""),
        }

    def narrows(self) -> bool:
        """Whether the list shows less than the role's default view: a filter, a search, or only the user's own
        when the default is everything (the default itself is no filter)."""
        filters = self.filters()
        return any(filters[key] for key in ("state", "project", "spec", "text")) or filters["mine"] != self.own_first
