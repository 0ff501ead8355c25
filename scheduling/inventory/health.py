"""Health ingestion: signals from dcgm-exporter, BMCs and agents, matched against operator-editable rules.

The evaluation is pure (no database): `HealthSample` is one signal about a device or a node, `parse_dcgm_text`
turns dcgm-exporter's Prometheus text exposition into samples, `rule_matches`/`evaluate` match a sample against
rules (any objects with source, signal, comparison, threshold, action, active; `HealthRule` rows in production).

Numbers must be usable: `invalid_samples` names every sample whose number is NaN, infinite or beyond any counter
dcgm-exporter has (`scheduling.readings`), and `health_ingest` refuses the whole batch when there is one,
before it touches anything.

`health_ingest(samples, actor)` is the service: in one transaction it resolves each sample to devices, records a
`HealthEvent` per device for every sample that matched a rule, and applies the strongest action per device
(isolate beats degrade) through `device_isolate` / `device_set_health`. Repeating a sample changes nothing more:
a device already isolated (or already degraded) is left alone, so no second isolation and no second audit row.
A degraded card recovers on its own when its degrading rule says how (`recovery_step`): its signal must read clear
for the rule's minutes, judged as readings arrive (no reading, no evidence, no recovery); isolated cards never do.
After the commit it sends `health_changed` for the scheduling cycle to pick up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from config.errors import DomainError
from scheduling.choices import Comparison, DeviceHealth, HealthAction, HealthSource
from scheduling.inventory.agents import ANY_NODE, NOT_YOUR_NODE, NodeScope
from scheduling.models import Device, HealthEvent, HealthRule, Node
from scheduling.readings import number_problem, usable_number
from scheduling.services import device_isolate, device_set_health
from scheduling.signals import device_readings, health_changed

ACTION_RANK = {HealthAction.DEGRADE: 1, HealthAction.ISOLATE: 2}
MAX_SAMPLES = 20_000
MAX_PROBLEMS_LISTED = 20

# Outcomes per event, as the API reports them (NOT_YOUR_NODE: about a node the sender does not speak for).
MATCHED, NO_RULE, UNKNOWN_DEVICE = "matched", "no_rule", "unknown_device"
# A device's outcome when its degrading signal read clear long enough (besides the rules' actions).
RECOVER = "recover"


# ------------------------------------------------------------------------------------------------ pure part


@dataclass(frozen=True)
class HealthSample:
    """One signal: a device by UUID, a device by node name + index, or (no index, no UUID) every device of a node."""

    source: str
    signal: str
    value: Any
    device_uuid: str = ""
    node: str = ""
    index: int | None = None

    @property
    def node_wide(self) -> bool:
        return not self.device_uuid and bool(self.node) and self.index is None

    def target(self) -> dict:
        target = {}
        if self.device_uuid:
            target["device_uuid"] = self.device_uuid
        if self.node:
            target["node"] = self.node
        if self.index is not None:
            target["index"] = self.index
        return target


class RuleLike(Protocol):
    name: str
    source: str
    signal: str
    comparison: str
    threshold: str
    action: str


class RecoverableRule(RuleLike, Protocol):
    recovery_threshold: str  # "" for none
    recover_after_minutes: int | None  # None: the rule never recovers a card on its own


def value_text(value: Any) -> str:
    """A value as stored and shown: 79.0 -> "79", True -> "true"."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _equal(value: Any, expected: str) -> bool:
    number, wanted = usable_number(value), usable_number(expected)
    if number is not None and wanted is not None:
        return number == wanted
    return value_text(value).casefold() == expected.strip().casefold()


def rule_matches(rule: RuleLike, sample: HealthSample) -> bool:
    """Does the sample meet the rule? gt/gte compare numbers; eq and in compare numbers, else text (any case)."""
    if rule.source != sample.source or rule.signal != sample.signal:
        return False
    if rule.comparison == Comparison.IN:
        return any(_equal(sample.value, item) for item in rule.threshold.split(",") if item.strip())
    if rule.comparison == Comparison.EQ:
        return _equal(sample.value, rule.threshold)
    number, threshold = usable_number(sample.value), usable_number(rule.threshold)
    if number is None or threshold is None:
        return False
    if rule.comparison == Comparison.GT:
        return number > threshold
    if rule.comparison == Comparison.GTE:
        return number >= threshold
    return False


def _shown(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else value_text(value)[:40]


def invalid_samples(samples: Sequence[HealthSample]) -> list[dict]:
    """Every sample whose value cannot be used as a number, with its position in the batch and the problem."""
    problems = []
    for position, sample in enumerate(samples):
        problem = number_problem(sample.value)
        if problem is not None:
            problems.append(
                {
                    "position": position,
                    "source": sample.source,
                    "signal": sample.signal,
                    "target": sample.target(),
                    "value": _shown(sample.value),
                    "problem": problem,
                }
            )
    return problems


def evaluate(sample: HealthSample, rules: Iterable[RuleLike]) -> RuleLike | None:
    """The strongest active rule the sample meets (isolate beats degrade; among equals, the first), or None."""
    matched = [rule for rule in rules if getattr(rule, "active", True) and rule_matches(rule, sample)]
    return max(matched, key=lambda rule: ACTION_RANK[rule.action], default=None)


def reads_clear(rule: RecoverableRule, sample: HealthSample) -> bool:
    """Does the sample show the rule's condition gone? Its own signal, not meeting the rule, and for > and ≥ rules a
    number, below the recovery threshold when the rule has one (hysteresis: degrade at ≥ 90, clear below 85)."""
    if rule.source != sample.source or rule.signal != sample.signal or rule_matches(rule, sample):
        return False
    if rule.comparison not in (Comparison.GT, Comparison.GTE):
        return True
    number, recovery = usable_number(sample.value), usable_number(rule.recovery_threshold)
    return number is not None and (recovery is None or number < recovery)


@dataclass(frozen=True)
class RecoveryStep:
    clear_since: datetime | None  # the recovery clock after the samples (None: stopped)
    recovered: bool


def recovery_step(
    rule: RecoverableRule, samples: Iterable[HealthSample], clear_since: datetime | None, now: datetime
) -> RecoveryStep | None:
    """What the samples mean for a card the rule degraded; None when they say nothing (no reading of its signal,
    or the rule has no recovery). The card recovers once the signal has read clear for the rule's minutes, every
    reading in between included: one reading that is not clear stops the clock."""
    minutes = rule.recover_after_minutes
    readings = [sample for sample in samples if (sample.source, sample.signal) == (rule.source, rule.signal)]
    if minutes is None or not readings:
        return None
    if not all(reads_clear(rule, sample) for sample in readings):
        return RecoveryStep(None, False)
    since = clear_since or now
    return RecoveryStep(since, now - since >= timedelta(minutes=minutes))


def strongest(actions: Iterable[str]) -> str | None:
    return max(actions, key=ACTION_RANK.__getitem__, default=None)


_SAMPLE_NAME = re.compile(r"\s*([^\s{]+)")


def parse_dcgm_text(text: str) -> list[HealthSample]:
    """Samples from Prometheus text exposition (format 0.0.4) as NVIDIA dcgm-exporter prints it.

    The signal is the metric name as written on the wire (prometheus_client renames counters, e.g. it reports
    DCGM_FI_DEV_ECC_DBE_VOL_TOTAL samples as ..._TOTAL_total). Devices are named by the UUID label, with
    Hostname + gpu as the fallback. Raises ValueError for text that is not the exposition format.
    """
    wire_names = set()
    for line in text.splitlines():
        stripped = line.strip()
        # A line without a metric name is not a sample: the parser below refuses it.
        if stripped and not stripped.startswith("#") and (name := _SAMPLE_NAME.match(stripped)):
            wire_names.add(name.group(1))
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"Not Prometheus text exposition format: {exc or type(exc).__name__}.") from exc
    samples = []
    for family in families:
        for sample in family.samples:
            labels = sample.labels
            gpu = labels.get("gpu", "")
            samples.append(
                HealthSample(
                    source=HealthSource.DCGM,
                    signal=sample.name if sample.name in wire_names else family.name,
                    value=sample.value,
                    device_uuid=labels.get("UUID", "") or labels.get("uuid", ""),
                    node=labels.get("Hostname", "") or labels.get("hostname", ""),
                    index=int(gpu) if gpu.isdigit() else None,
                )
            )
    if not samples:
        raise ValueError("The text holds no samples.")
    if len(samples) > MAX_SAMPLES:
        raise ValueError(f"At most {MAX_SAMPLES} samples per request; got {len(samples)}.")
    return samples


# --------------------------------------------------------------------------------------------------- service


class InvalidTelemetry(DomainError):
    """A batch holding a number that cannot be used; nothing of it is applied."""

    status_code = 400
    code = "invalid_telemetry"


def _refuse_invalid(samples: Sequence[HealthSample]) -> None:
    problems = invalid_samples(samples)
    if not problems:
        return
    first = problems[0]
    raise InvalidTelemetry(
        f"{len(problems)} of {len(samples)} samples carry a number that cannot be used, e.g. {first['signal']} "
        f"{first['value']} {first['problem']}; nothing was applied.",
        details={"invalid": len(problems), "samples": problems[:MAX_PROBLEMS_LISTED]},
    )


@dataclass
class EventOutcome:
    sample: HealthSample
    outcome: str  # MATCHED, NO_RULE, UNKNOWN_DEVICE or NOT_YOUR_NODE
    devices: list[str] = field(default_factory=list)  # UUIDs the sample applied to
    rule: str | None = None
    action: str | None = None


@dataclass
class DeviceOutcome:
    uuid: str
    node: str
    index: int
    action: str  # the strongest action the batch asked for, or RECOVER
    changed: bool  # False when the device was already in that state
    health: str
    isolated: bool


@dataclass
class IngestReport:
    events: list[EventOutcome]
    devices: list[DeviceOutcome]

    @property
    def unknown(self) -> list[dict]:
        seen, unknown = set(), []
        for event in self.events:
            key = tuple(sorted(event.sample.target().items()))
            if event.outcome == UNKNOWN_DEVICE and key not in seen:
                seen.add(key)
                unknown.append(event.sample.target())
        return unknown

    @property
    def refused(self) -> list[EventOutcome]:
        return [event for event in self.events if event.outcome == NOT_YOUR_NODE]


def _resolve(samples: Sequence[HealthSample]) -> list[list[int] | None]:
    """Device ids per sample (None: no such device or node), from two queries whatever the batch size."""
    uuids = {sample.device_uuid for sample in samples if sample.device_uuid}
    node_names = {sample.node for sample in samples if sample.node}
    by_uuid, by_position, by_node = {}, {}, {}
    rows = (
        Device.objects.filter(Q(uuid__in=uuids) | Q(node__name__in=node_names))
        .values_list("pk", "uuid", "node__name", "index")
        .order_by("node__name", "index")
    )
    for pk, uuid, node_name, index in rows:
        by_uuid[uuid] = pk
        by_position[(node_name, index)] = pk
        by_node.setdefault(node_name, []).append(pk)
    node_wide = {sample.node for sample in samples if sample.node_wide}
    known_nodes = set(Node.objects.filter(name__in=node_wide).values_list("name", flat=True)) if node_wide else set()
    resolved = []
    for sample in samples:
        if sample.device_uuid in by_uuid:
            resolved.append([by_uuid[sample.device_uuid]])
        elif sample.node and sample.index is not None and (sample.node, sample.index) in by_position:
            resolved.append([by_position[(sample.node, sample.index)]])
        elif sample.node_wide and sample.node in known_nodes:
            resolved.append(by_node.get(sample.node, []))
        else:
            resolved.append(None)
    return resolved


def _outside_scope(samples: Sequence[HealthSample], resolved: list[list[int] | None], scope: NodeScope) -> set[int]:
    """Positions of the samples about a node the sender does not speak for (one query, none for an operator)."""
    if scope.nodes is None:
        return set()
    device_ids = {pk for ids in resolved if ids for pk in ids}
    node_of = dict(Device.objects.filter(pk__in=device_ids).values_list("pk", "node_id")) if device_ids else {}
    names = set(scope.nodes.values())
    return {
        position
        for position, (sample, ids) in enumerate(zip(samples, resolved, strict=True))
        if (sample.node_wide and ids is not None and sample.node not in names)
        or any(node_of.get(pk) not in scope.nodes for pk in ids or ())
    }


def _detail(rule: RuleLike, sample: HealthSample) -> str:
    return f"{sample.source} {sample.signal}={value_text(sample.value)} (rule: {rule.name})"[:300]


def _apply(device: Device, action: str, detail: str, actor, degraded_by: HealthRule | None) -> bool:
    """Bring the device to the action's state through the services; False when it already was there.

    Isolation is the flag placement reads; it leaves `health` alone, so a four-eyes clearance alone makes the
    card placeable again. Degrading an isolated card records its health and leaves it isolated.
    """
    if action == HealthAction.ISOLATE and not device.isolated:
        device_isolate(device=device, reason=detail, actor=actor)
        return True
    if action == HealthAction.DEGRADE and device.health == DeviceHealth.HEALTHY:
        device_set_health(
            device=device, health=DeviceHealth.DEGRADED, detail=detail, actor=actor, degraded_by=degraded_by
        )
        return True
    return False


def _rematched(device: Device, degrade_rule: HealthRule | None) -> bool:
    """A degraded card meeting a rule again: its recovery clock stops, and the newest degrade rule it met is the one
    that must clear. True when that changed the device (in memory; the caller saves)."""
    if device.health != DeviceHealth.DEGRADED:
        return False
    degraded_by_id = degrade_rule.pk if degrade_rule is not None else device.degraded_by_id
    if device.clear_since is None and device.degraded_by_id == degraded_by_id:
        return False
    device.degraded_by_id, device.clear_since = degraded_by_id, None
    return True


def _recover(device: Device, samples: list[HealthSample], now: datetime, actor) -> bool | None:
    """Move a degraded card's recovery clock on the samples that met no rule, and return it to healthy once its
    degrading signal has read clear long enough. True: recovered; False: only the clock moved; None: nothing.

    Isolated cards never recover on their own (clearing an isolation needs four eyes), nor cards whose degrading
    rule is unknown or has no recovery: an operator marks those healthy.
    """
    rule = device.degraded_by
    if device.isolated or device.health != DeviceHealth.DEGRADED or rule is None:
        return None
    step = recovery_step(rule, samples, device.clear_since, now)
    if step is None or (not step.recovered and step.clear_since == device.clear_since):
        return None
    if not step.recovered:
        device.clear_since = step.clear_since
        return False
    device_set_health(
        device=device,
        health=DeviceHealth.HEALTHY,
        actor=actor,
        detail=f"Recovered: {rule.signal} read clear for {rule.recover_after_minutes} min (rule: {rule.name})",
        data={
            "code": "recovered",
            "rule": rule.name,
            "signal": rule.signal,
            "clear_since": step.clear_since.isoformat(),
            "recover_after_minutes": rule.recover_after_minutes,
        },
    )
    return True


def health_ingest(samples: Sequence[HealthSample], actor=None, scope: NodeScope = ANY_NODE) -> IngestReport:
    """Record what matched, apply the strongest action per device, and tell the scheduler after the commit.

    Each HealthEvent carries the action its rule asks for; whether that changed the device is in the report.
    Samples that met no rule are recovery evidence: a degraded card whose degrading signal reads clear long
    enough returns to healthy (reported with the action "recover").
    Samples about nodes outside the sender's `scope` are reported NOT_YOUR_NODE and change nothing.
    A batch with any unusable number is refused whole (InvalidTelemetry) before anything is read or written.
    """
    _refuse_invalid(samples)
    rules = list(HealthRule.objects.filter(active=True))
    with transaction.atomic():
        now = timezone.now()
        resolved = _resolve(samples)
        outside = _outside_scope(samples, resolved, scope)
        resolved = [None if position in outside else ids for position, ids in enumerate(resolved)]
        wanted_ids = sorted({pk for ids in resolved if ids for pk in ids})
        devices = {
            device.pk: device
            for device in Device.objects.select_for_update(of=("self",))
            .select_related("node", "model", "degraded_by")
            .filter(pk__in=wanted_ids)
            .order_by("pk")
        }
        events, health_events = [], []
        wanted: dict[int, tuple[str, str]] = {}  # device id -> (action, detail) of the strongest match
        degrading: dict[int, HealthRule] = {}  # device id -> the last degrade rule it met
        unmatched: dict[int, list[HealthSample]] = {}  # device id -> its samples that met no rule
        for position, (sample, ids) in enumerate(zip(samples, resolved, strict=True)):
            if position in outside:
                events.append(EventOutcome(sample, NOT_YOUR_NODE))
                continue
            if ids is None:
                events.append(EventOutcome(sample, UNKNOWN_DEVICE))
                continue
            ids = [pk for pk in ids if pk in devices]  # a device deleted since _resolve is simply gone
            rule = evaluate(sample, rules)
            uuids = [devices[pk].uuid for pk in ids]
            if rule is None:
                events.append(EventOutcome(sample, NO_RULE, uuids))
                for pk in ids:
                    unmatched.setdefault(pk, []).append(sample)
                continue
            events.append(EventOutcome(sample, MATCHED, uuids, rule.name, rule.action))
            for pk in ids:
                health_events.append(
                    HealthEvent(
                        device_id=pk,
                        rule=rule,
                        source=sample.source,
                        signal=sample.signal,
                        value=value_text(sample.value)[:200],
                        action=rule.action,
                    )
                )
                if rule.action == HealthAction.DEGRADE:
                    degrading[pk] = rule
                if pk not in wanted or ACTION_RANK[rule.action] > ACTION_RANK[wanted[pk][0]]:
                    wanted[pk] = (rule.action, _detail(rule, sample))
        HealthEvent.objects.bulk_create(health_events)
        readings = _device_readings(samples, resolved)
        outcomes, changed_ids, isolated_ids, clocks = [], [], [], []
        for pk in sorted(wanted):
            device, (action, detail) = devices[pk], wanted[pk]
            was_isolated = device.isolated
            changed = _apply(device, action, detail, actor, degrading.get(pk))
            if changed:
                device.refresh_from_db(fields=["health", "isolated", "degraded_by", "clear_since"])
                changed_ids.append(pk)
                if device.isolated and not was_isolated:
                    isolated_ids.append(pk)
            if _rematched(device, degrading.get(pk)):
                clocks.append(device)
            outcomes.append(
                DeviceOutcome(
                    device.uuid, device.node.name, device.index, action, changed, device.health, device.isolated
                )
            )
        for pk in sorted(unmatched.keys() - wanted.keys()):
            device = devices[pk]
            recovered = _recover(device, unmatched[pk], now, actor)
            if recovered:
                changed_ids.append(pk)
                outcomes.append(
                    DeviceOutcome(
                        device.uuid,
                        device.node.name,
                        device.index,
                        RECOVER,
                        True,
                        DeviceHealth.HEALTHY,
                        device.isolated,
                    )
                )
            elif recovered is False:
                clocks.append(device)
        Device.objects.bulk_update(clocks, ["degraded_by", "clear_since"])
        if changed_ids:
            transaction.on_commit(
                lambda: health_changed.send(sender=HealthEvent, device_ids=changed_ids, isolated_ids=isolated_ids)
            )
        if readings:
            transaction.on_commit(lambda: device_readings.send(sender=HealthEvent, readings=readings, at=now))
    return IngestReport(events, outcomes)


def _device_readings(samples: Sequence[HealthSample], resolved: list[list[int] | None]) -> dict[int, dict[str, float]]:
    """{device id: {signal: number}} of the samples about one device each (out-of-scope ones resolve to None)."""
    readings: dict[int, dict[str, float]] = {}
    for sample, ids in zip(samples, resolved, strict=True):
        number = usable_number(sample.value)
        if ids and len(ids) == 1 and not sample.node_wide and number is not None:
            readings.setdefault(ids[0], {})[sample.signal] = number
    return readings
