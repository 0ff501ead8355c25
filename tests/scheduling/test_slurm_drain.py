"""Cordons and isolations of slurm-backed nodes drain the Slurm node (scontrol, after the commit, in a task);
clearing them resumes it. Against the real local cluster (devcluster/slurm_cluster.py)."""

from io import StringIO

import pytest
from django.core.management import call_command

from requests import approvals
from requests.models import ApprovalAssignment
from scheduling import services
from scheduling.models import Node
from tenancy.models import AuditEvent
from tests import factories
from tests.scheduling.inventory_helpers import clearance_holder

pytestmark = pytest.mark.django_db


@pytest.fixture
def slurm_node(slurm_settings, settings):
    """The first cluster node, imported (execution_backend=slurm) with its two GPUs."""
    factories.AcceleratorModelFactory(slug="a100")
    call_command("import_inventory", "--from-slurm", stdout=StringIO())
    return Node.objects.get(name=slurm_settings.node_names[0])


@pytest.fixture
def after_commit(django_capture_on_commit_callbacks):
    """Run an action with its after-commit work executed (signal, then the task, inline: Q_SYNC)."""

    def run(action, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return action(*args, **kwargs)

    return run


def outcomes(node) -> list[tuple[str, str]]:
    rows = AuditEvent.objects.filter(target_id=str(node.pk), action__startswith="node.slurm_").order_by("id")
    return list(rows.values_list("action", "reason"))


def test_a_cordon_drains_the_slurm_node_with_its_reason_and_the_uncordon_resumes_it(slurm_node, slurm, after_commit):
    operator = factories.operator()

    after_commit(services.node_cordon, slurm_node, "Replacing a DIMM", operator)

    assert slurm.node_states()[slurm_node.name] == "drained"
    assert slurm.node_reason(slurm_node.name) == "Replacing a DIMM"
    assert outcomes(slurm_node) == [("node.slurm_drained", "Replacing a DIMM")]

    after_commit(services.node_uncordon, Node.objects.get(pk=slurm_node.pk), "DIMM replaced", operator)

    slurm.wait_for_node_state(slurm_node.name, "idle")
    assert outcomes(slurm_node)[-1] == ("node.slurm_resumed", "Resumed; it was drained for: Replacing a DIMM")


def test_isolating_a_card_drains_the_node_and_clearing_it_resumes(slurm_node, slurm, after_commit):
    device = slurm_node.devices.get(index=1)

    after_commit(services.device_isolate, device, "XID 79: fell off the bus")

    assert slurm.node_states()[slurm_node.name] == "drained"
    assert slurm.node_reason(slurm_node.name) == "XID 79: fell off the bus"
    alice, bob = clearance_holder(username="alice"), clearance_holder(username="bob")
    clearance = services.isolation_clearance_request(device, "Card reseated", alice)
    assignment = ApprovalAssignment.objects.get(stage__approval__subject_id=clearance.pk, approver=bob)

    after_commit(approvals.approval_decide, assignment=assignment, decision="approve", comment="ok", actor=bob)

    slurm.wait_for_node_state(slurm_node.name, "idle")
    assert [action for action, _ in outcomes(slurm_node)] == ["node.slurm_drained", "node.slurm_resumed"]


def test_our_own_drain_read_back_by_the_import_is_no_health_event(slurm_node, slurm, after_commit):
    after_commit(services.node_cordon, slurm_node, "Rack maintenance", None)

    call_command("import_inventory", "--from-slurm", stdout=StringIO())

    node = Node.objects.get(pk=slurm_node.pk)
    assert node.cordon_reason == "Rack maintenance"
    assert not node.devices.filter(health_events__isnull=False).exists()


def test_a_drain_someone_else_set_in_slurm_is_not_resumed(slurm_node, slurm, after_commit):
    after_commit(services.node_cordon, slurm_node, "Rack maintenance", None)
    slurm.scontrol("update", f"nodename={slurm_node.name}", "state=drain", "reason=admin: bad fan")

    after_commit(services.node_uncordon, Node.objects.get(pk=slurm_node.pk), "done", None)

    assert slurm.node_states()[slurm_node.name] == "drained"
    assert slurm.node_reason(slurm_node.name) == "admin: bad fan"
    assert outcomes(slurm_node)[-1] == (
        "node.slurm_resume_skipped",
        "Drained in Slurm by someone else (admin: bad fan); left drained",
    )


def test_an_outage_keeps_the_cordon_records_the_failure_and_the_next_import_drains(
    slurm_node, slurm, settings, after_commit
):
    settings.SLURM_REST_URL = "http://127.0.0.1:9"

    after_commit(services.node_cordon, slurm_node, "Replacing a DIMM", None)

    assert not Node.objects.get(pk=slurm_node.pk).schedulable
    [(action, reason)] = outcomes(slurm_node)
    assert action == "node.slurm_sync_failed" and "unreachable" in reason
    assert slurm.node_states()[slurm_node.name] == "idle"

    settings.SLURM_REST_URL = slurm.rest_url
    after_commit(call_command, "import_inventory", "--from-slurm", stdout=StringIO())

    assert slurm.node_states()[slurm_node.name] == "drained"
    assert outcomes(slurm_node)[-1] == ("node.slurm_drained", "Replacing a DIMM")


def test_a_node_on_another_backend_is_left_to_it(after_commit):
    node = Node.objects.create(name="demo-node", serial_number="sn-demo", cpu_milli=1000, memory_mib=1024)

    after_commit(services.node_cordon, node, "Replacing a DIMM", None)

    assert outcomes(node) == []
