"""Shapes of health ingestion: structured events in, per-event and per-device outcomes out."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from config.api import ErrorSerializer
from scheduling.choices import HealthAction, HealthSource
from scheduling.inventory.agents import ANY_NODE, NOT_YOUR_NODE
from scheduling.inventory.health import MAX_SAMPLES, RECOVER, HealthSample

# --- Input -------------------------------------------------------------------------------------------------


@extend_schema_field({"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]})
class SignalValueField(serializers.Field):
    """A signal's value: a number (metric), a string (BMC Status.Health, agent state) or a boolean."""

    default_error_messages = {"invalid": "Must be a number, a string or a boolean."}

    def to_internal_value(self, data):
        if not isinstance(data, str | int | float | bool):
            self.fail("invalid")
        if isinstance(data, str) and len(data) > 200:
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class HealthEventInSerializer(serializers.Serializer):
    """One signal, about a device (device_uuid, or node + index) or, with node alone, every device of a node."""

    device_uuid = serializers.CharField(max_length=80, required=False)
    node = serializers.CharField(max_length=120, required=False)
    index = serializers.IntegerField(min_value=0, max_value=32767, required=False)
    source = serializers.ChoiceField(choices=HealthSource.choices)
    signal = serializers.CharField(max_length=120)
    value = SignalValueField()

    def validate(self, attrs):
        if "device_uuid" in attrs and ("node" in attrs or "index" in attrs):
            raise serializers.ValidationError("Name a device by device_uuid or by node and index, not both.")
        if "device_uuid" not in attrs and "node" not in attrs:
            raise serializers.ValidationError("Give device_uuid, or node (with index for one device).")
        if "index" in attrs and "node" not in attrs:
            raise serializers.ValidationError({"node": "index needs the node it counts on."})
        return attrs

    def sample(self, data: dict) -> HealthSample:
        return HealthSample(
            source=data["source"],
            signal=data["signal"],
            value=data["value"],
            device_uuid=data.get("device_uuid", ""),
            node=data.get("node", ""),
            index=data.get("index"),
        )


class HealthEventsInSerializer(serializers.Serializer):
    events = HealthEventInSerializer(many=True, allow_empty=False, max_length=MAX_SAMPLES)

    def samples(self) -> list[HealthSample]:
        return [HealthEventInSerializer().sample(event) for event in self.validated_data["events"]]


# --- Output ------------------------------------------------------------------------------------------------


class HealthTargetSerializer(serializers.Serializer):
    device_uuid = serializers.CharField(required=False)
    node = serializers.CharField(required=False)
    index = serializers.IntegerField(required=False)


class EventOutcomeSerializer(serializers.Serializer):
    source = serializers.CharField(source="sample.source")
    signal = serializers.CharField(source="sample.signal")
    value = SignalValueField(source="sample.value")
    target = HealthTargetSerializer(source="sample.target")
    outcome = serializers.ChoiceField(
        choices=["matched", "no_rule", "unknown_device", NOT_YOUR_NODE],
        help_text="matched a rule, matched none, named no known device/node, or "
        "named a node the agent token does not speak for (ignored).",
    )
    devices = serializers.ListField(child=serializers.CharField(), help_text="UUIDs of the devices it applied to.")
    rule = serializers.CharField(allow_null=True, help_text="The strongest rule it met.")
    action = serializers.ChoiceField(choices=HealthAction.choices, allow_null=True)


class DeviceOutcomeSerializer(serializers.Serializer):
    uuid = serializers.CharField()
    node = serializers.CharField()
    index = serializers.IntegerField()
    action = serializers.ChoiceField(
        choices=[*HealthAction.choices, (RECOVER, "Returned to healthy")],
        help_text="The strongest action asked for, or recover: its degrading signal read clear long enough.",
    )
    changed = serializers.BooleanField(help_text="False when the device already was in that state.")
    health = serializers.CharField()
    isolated = serializers.BooleanField()


class IngestReportSerializer(serializers.Serializer):
    received = serializers.SerializerMethodField()
    matched = serializers.SerializerMethodField()
    unknown_devices = HealthTargetSerializer(source="unknown", many=True)
    devices = DeviceOutcomeSerializer(many=True)
    events = EventOutcomeSerializer(many=True)
    refused = serializers.SerializerMethodField(
        help_text="One {code: not_your_node, message, details: {target, your_nodes}} per event about another node."
    )

    def get_received(self, report) -> int:
        return len(report.events)

    def get_matched(self, report) -> int:
        return sum(1 for event in report.events if event.outcome == "matched")

    @extend_schema_field(ErrorSerializer(many=True))
    def get_refused(self, report) -> list[dict]:
        scope = self.context.get("scope", ANY_NODE)
        return [scope.refusal({"target": event.sample.target()}) for event in report.refused]
