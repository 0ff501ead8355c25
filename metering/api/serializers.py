"""Query parameters and rows of the usage API."""

from datetime import date

from django.utils import timezone
from rest_framework import serializers

from config.api import IdField
from metering.choices import Grouping
from metering.periods import parse_month, report_months


class MonthField(serializers.Field):
    default_error_messages = {"invalid": "Use a month as YYYY-MM."}

    def to_internal_value(self, data) -> date:
        try:
            return parse_month(str(data))
        except ValueError:
            self.fail("invalid")

    def to_representation(self, value: date) -> str:
        return f"{value:%Y-%m}"


class PeriodQuerySerializer(serializers.Serializer):
    """`from` and `to` months (YYYY-MM, both included); by default the last six months up to this one."""

    def get_fields(self):
        return {"from": MonthField(required=False), "to": MonthField(required=False)}

    def validate(self, data):
        try:
            first, last = report_months(data.get("from"), data.get("to"), timezone.now().date())
        except ValueError as error:
            raise serializers.ValidationError({"from": str(error)}) from error
        return {**data, "first": first, "last": last}


class ReportQuerySerializer(PeriodQuerySerializer):
    def get_fields(self):
        return {
            **super().get_fields(),
            "group_by": serializers.CharField(
                required=False, default="project,month", help_text=f"Comma-separated: {', '.join(Grouping.values)}."
            ),
            "project": IdField(required=False),
            "tenant": IdField(required=False),
        }

    def validate_group_by(self, value: str) -> list[str]:
        keys = list(dict.fromkeys(key.strip() for key in value.split(",") if key.strip()))
        unknown = [key for key in keys if key not in Grouping.values]
        if unknown or not keys:
            raise serializers.ValidationError(
                f"Group by one or more of {', '.join(Grouping.values)}; not {', '.join(unknown) or 'nothing'}."
            )
        return keys


class ProjectQuerySerializer(serializers.Serializer):
    project = IdField(required=False)


class MemberUsageSerializer(serializers.Serializer):
    member = serializers.IntegerField(help_text="The member's number in its gang (0 leads).")
    node = serializers.CharField()
    card_hours = serializers.DecimalField(max_digits=18, decimal_places=4)
    cost = serializers.DecimalField(max_digits=18, decimal_places=2)


class UsageRowSerializer(serializers.Serializer):
    project = serializers.CharField(required=False)
    tenant = serializers.CharField(required=False)
    accelerator_model = serializers.CharField(required=False)
    spec = serializers.CharField(required=False)
    month = serializers.CharField(required=False)
    request = serializers.IntegerField(required=False)
    nodes = serializers.IntegerField(required=False, help_text="Grouped by request: the nodes it ran on at once.")
    members = MemberUsageSerializer(
        many=True, required=False, help_text="Grouped by request, a multi-node one: each member's node and figures."
    )
    card_hours = serializers.DecimalField(max_digits=18, decimal_places=4)
    cost = serializers.DecimalField(max_digits=18, decimal_places=2)
    currency = serializers.CharField()
    energy_kwh = serializers.FloatField()


class BudgetAlertSerializer(serializers.Serializer):
    level = serializers.CharField()
    message = serializers.CharField()
    card_hours = serializers.DecimalField(max_digits=14, decimal_places=4)
    limit = serializers.DecimalField(max_digits=12, decimal_places=2)
    created_at = serializers.DateTimeField()


class BudgetSerializer(serializers.Serializer):
    project = serializers.CharField()
    project_name = serializers.CharField()
    tenant = serializers.CharField()
    month = serializers.CharField()
    limit = serializers.DecimalField(
        max_digits=12, decimal_places=2, allow_null=True, help_text="Monthly card-hours; null means no budget."
    )
    used = serializers.DecimalField(max_digits=14, decimal_places=4, help_text="Metered this month (the ledger).")
    projected = serializers.DecimalField(
        max_digits=14,
        decimal_places=4,
        allow_null=True,
        help_text="Used plus what committed work will still use (this month only).",
    )
    used_pct = serializers.FloatField(allow_null=True)
    level = serializers.CharField(allow_null=True)
    alerts = BudgetAlertSerializer(many=True)


class SuggestionSerializer(serializers.Serializer):
    spec = serializers.CharField()
    label = serializers.CharField()
    cards = serializers.DecimalField(max_digits=10, decimal_places=4)
    memory_gb = serializers.IntegerField()
    slice = serializers.BooleanField()
    hourly_saving = serializers.DecimalField(max_digits=12, decimal_places=2)


class RecommendationSerializer(serializers.Serializer):
    project = serializers.CharField()
    spec = serializers.CharField()
    requested = serializers.CharField()
    requests = serializers.IntegerField()
    mean_utilization_pct = serializers.FloatField()
    p95_utilization_pct = serializers.FloatField()
    idle_card_hours = serializers.FloatField(help_text="Card-hours idle detection saw idle in the window.")
    p95_busy_cards = serializers.FloatField()
    p95_memory_gb = serializers.FloatField()
    mean_memory_gb = serializers.FloatField()
    suggestions = SuggestionSerializer(many=True)
    message = serializers.CharField()


class ZeroTouchRowSerializer(serializers.Serializer):
    service = serializers.CharField()
    service_name = serializers.CharField()
    month = serializers.CharField()
    delivered = serializers.IntegerField(help_text="Requests that became active for the first time that month.")
    zero_touch = serializers.IntegerField(help_text="Of those, requests without any manual operator intervention.")
    interventions = serializers.IntegerField()
    zero_touch_pct = serializers.FloatField()


class TokenUsageRowSerializer(serializers.Serializer):
    month = serializers.CharField()
    project = serializers.CharField()
    model = serializers.CharField()
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()


class IdleUsageLineSerializer(serializers.Serializer):
    project = serializers.CharField()
    card_hours = serializers.FloatField(help_text="Requested: held, whether used or not.")
    idle_card_hours = serializers.FloatField(help_text="Of those, idle (idle episodes that ended).")
    used_card_hours = serializers.FloatField()


class IdleUsageRequestSerializer(IdleUsageLineSerializer):
    request = serializers.IntegerField()


class IdleUsageSerializer(serializers.Serializer):
    projects = IdleUsageLineSerializer(many=True)
    requests = IdleUsageRequestSerializer(many=True)


class SlurmBooksRowSerializer(serializers.Serializer):
    request = serializers.IntegerField()
    project = serializers.CharField()
    jobs = serializers.ListField(child=serializers.IntegerField(), help_text="The Slurm job ids read.")
    slurm_card_hours = serializers.FloatField(help_text="GPUs x elapsed of its jobs in Slurm's books (sacct).")
    platform_card_hours = serializers.FloatField(help_text="What the platform metered for the same allocations.")
    difference_card_hours = serializers.FloatField(help_text="Slurm's card-hours minus the platform's.")
    final = serializers.BooleanField(help_text="Every job ended and every allocation released: not read again.")
    read_at = serializers.DateTimeField()


class ReservedIdleRowSerializer(serializers.Serializer):
    project = serializers.CharField()
    reservations = serializers.IntegerField(help_text="Advance reservations that held cards in the months.")
    reserved_card_hours = serializers.FloatField(help_text="Card-hours they held, from the window's start.")
    reserved_idle_card_hours = serializers.FloatField(
        help_text="Of those, held with nothing running: before the workload started, or until a no-show's release."
    )
