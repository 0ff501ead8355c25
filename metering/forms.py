"""The usage page's filter: a project (or all one may see) and a span of months."""

from datetime import date

from django import forms
from django.utils import timezone

from metering.periods import parse_month, report_months
from metering.selectors import visible_projects
from tenancy.models import Project, User


class MonthInput(forms.CharField):
    widget = forms.TextInput(attrs={"type": "month", "placeholder": "YYYY-MM"})

    def to_python(self, value) -> date | None:
        value = super().to_python(value)
        if not value:
            return None
        try:
            return parse_month(value)
        except ValueError as error:
            raise forms.ValidationError("Use a month as YYYY-MM.") from error


class UsageFilterForm(forms.Form):
    project = forms.ModelChoiceField(queryset=Project.objects.none(), required=False, empty_label="All my projects")

    def __init__(self, *args, user: User, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = (
            visible_projects(user=user).select_related("tenant", "quota").order_by("tenant__name", "name")
        )
        self.fields["from"] = MonthInput(required=False, label="From")
        self.fields["to"] = MonthInput(required=False, label="To")

    def clean(self):
        cleaned = super().clean()
        try:
            cleaned["first"], cleaned["last"] = report_months(
                cleaned.get("from"), cleaned.get("to"), timezone.now().date()
            )
        except ValueError as error:
            raise forms.ValidationError(str(error)) from error
        return cleaned
