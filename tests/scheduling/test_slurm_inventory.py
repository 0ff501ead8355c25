"""`import_inventory --from-slurm` against the real local cluster (devcluster/slurm_cluster.py)."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from devcluster.slurm_cluster import NodeShape
from scheduling import tasks
from scheduling.choices import ExecutionBackend, HealthSource
from scheduling.models import Device, HealthEvent, Node
from scheduling.slurm.services import VANISHED_REASON
from tenancy.models import AuditEvent
from tests import factories
from tests.devcluster_fixtures import cluster_for_tests

pytestmark = pytest.mark.django_db


@pytest.fixture
def a100():
    return factories.AcceleratorModelFactory(slug="a100-40gb", name="A100 40GB", memory_gb=40)


def import_from_slurm(*options: str) -> str:
    out = StringIO()
    call_command("import_inventory", "--from-slurm", *options, stdout=out)
    return out.getvalue()


def test_nodes_cpus_memory_and_gpus_are_imported_and_a_second_run_changes_nothing(slurm_settings, a100):
    first = import_from_slurm("--gpu-model", "a100=a100-40gb")

    assert "3 created" in first
    nodes = Node.objects.filter(name__in=slurm_settings.node_names)
    assert [(n.name, n.execution_backend, n.cpu_milli, n.memory_mib, n.schedulable) for n in nodes] == [
        (name, ExecutionBackend.SLURM, 32_000, 262_144, True) for name in slurm_settings.node_names
    ]
    devices = Device.objects.filter(node__in=nodes)
    assert sorted((d.node.name, d.index, d.model_id, d.memory_gb) for d in devices) == [
        (name, index, a100.pk, 40) for name in slurm_settings.node_names for index in (0, 1)
    ]
    audit_rows = AuditEvent.objects.count()

    second = import_from_slurm("--gpu-model", "a100=a100-40gb")

    assert "0 created, 0 updated, 3 unchanged" in second and "Health events: 0" in second
    assert AuditEvent.objects.count() == audit_rows
    assert list(Device.objects.filter(node__in=nodes).values_list("uuid", flat=True)) == [d.uuid for d in devices]


def test_a_gres_type_named_like_a_catalog_model_needs_no_mapping(slurm_settings):
    model = factories.AcceleratorModelFactory(slug="a100", name="A100 (Slurm)")

    import_from_slurm()

    assert Device.objects.filter(node__name__in=slurm_settings.node_names, model=model).count() == 6


def test_an_unknown_gres_type_is_named_with_its_nodes_and_nothing_is_imported(slurm_settings):
    with pytest.raises(CommandError) as refusal:
        import_from_slurm()

    message = str(refusal.value)
    assert f"a100 (on {', '.join(slurm_settings.node_names)})" in message
    assert "--gpu-model TYPE=SLUG" in message
    assert not Node.objects.exists()


def test_a_slurm_node_that_vanished_is_cordoned_not_deleted(slurm_settings, a100):
    gone = Node.objects.create(
        name="retired-slurm-node",
        serial_number="sn-retired",
        cpu_milli=1000,
        memory_mib=1024,
        execution_backend=ExecutionBackend.SLURM,
    )
    simulated = Node.objects.create(name="demo-node", serial_number="sn-demo", cpu_milli=1000, memory_mib=1024)

    output = import_from_slurm("--gpu-model", "a100=a100-40gb")

    gone.refresh_from_db()
    assert (gone.schedulable, gone.cordon_reason) == (False, VANISHED_REASON)
    assert f"Cordoned retired-slurm-node: {VANISHED_REASON}" in output
    assert Node.objects.get(pk=simulated.pk).schedulable
    assert "Cordoned" not in import_from_slurm("--gpu-model", "a100=a100-40gb")


def test_slurms_drain_becomes_a_cordon_and_health_events_and_its_resume_lifts_them(slurm_settings, a100):
    node_name = slurm_settings.node_names[0]
    import_from_slurm("--gpu-model", "a100=a100-40gb")
    slurm_settings.scontrol("update", f"nodename={node_name}", "state=drain", "reason=fan failure")

    output = import_from_slurm("--gpu-model", "a100=a100-40gb")

    node = Node.objects.get(name=node_name)
    assert node.cordon_reason == "Slurm reports the node IDLE+DRAIN: fan failure"
    assert "Health events: 2" in output
    events = HealthEvent.objects.filter(device__node=node, source=HealthSource.SLURM)
    assert sorted(events.values_list("device__index", "value")) == [
        (0, "IDLE+DRAIN: fan failure"),
        (1, "IDLE+DRAIN: fan failure"),
    ]
    assert "Health events: 0" in import_from_slurm("--gpu-model", "a100=a100-40gb")

    slurm_settings.resume_all()
    slurm_settings.wait_for_node_state(node_name, "idle")
    output = import_from_slurm("--gpu-model", "a100=a100-40gb")

    node.refresh_from_db()
    assert node.schedulable and f"Uncordoned {node_name}" in output
    assert events.first().value == "IDLE"


def test_a_down_node_is_cordoned_with_slurms_reason(slurm_settings, a100):
    node_name = slurm_settings.node_names[2]
    slurm_settings.scontrol("update", f"nodename={node_name}", "state=down", "reason=PSU failed")

    import_from_slurm("--gpu-model", "a100=a100-40gb")

    node = Node.objects.get(name=node_name)
    assert not node.schedulable
    assert node.cordon_reason.startswith("Slurm reports the node DOWN") and node.cordon_reason.endswith("PSU failed")
    assert Node.objects.filter(name__in=slurm_settings.node_names, schedulable=True).count() == 2


def test_an_unreachable_slurmrestd_is_a_clear_error(settings, slurm_settings):
    settings.SLURM_REST_URL = "http://127.0.0.1:9"

    with pytest.raises(CommandError) as refusal:
        import_from_slurm()

    assert str(refusal.value).startswith("Slurm: nothing imported. slurmrestd at http://127.0.0.1:9 unreachable")


@pytest.fixture(scope="module")
def untyped_cluster():
    """A second, small cluster whose GPUs have no GRES type (gpu:2): started for this module only (about 2 s)."""
    with cluster_for_tests(node_count=1, node_shape=NodeShape(gpu_type=""), name_prefix="untyped") as cluster:
        yield cluster


def test_untyped_gpus_are_imported_through_the_gpu_mapping(untyped_cluster, settings):
    settings.SLURM_REST_URL, settings.SLURM_JWT = untyped_cluster.rest_url, untyped_cluster.token
    settings.SLURM_USER_NAME, settings.SLURM_JWT_FILE = untyped_cluster.user_name, ""
    settings.SLURM_GPU_MODELS = {"gpu": "T4 16GB"}
    t4 = factories.AcceleratorModelFactory(slug="t4-16gb", name="T4 16GB", memory_gb=16)

    import_from_slurm()

    [node_name] = untyped_cluster.node_names
    assert untyped_cluster.run("sinfo", "--noheader", "--format=%G").stdout.strip() == "gpu:2"
    assert sorted(Device.objects.filter(node__name=node_name).values_list("index", "model_id")) == [
        (0, t4.pk),
        (1, t4.pk),
    ]


def test_the_periodic_import_uses_the_settings(slurm_settings, settings, a100):
    settings.SLURM_GPU_MODELS, settings.SLURM_SITE = {"a100": "a100-40gb"}, "slurm-lab"

    summary = tasks.import_from_slurm()

    assert summary.startswith("3 created, 0 updated")
    assert set(Node.objects.values_list("rack__site__name", flat=True)) == {"slurm-lab"}


def test_the_periodic_import_does_nothing_without_a_cluster(settings):
    settings.SLURM_REST_URL = ""

    assert tasks.import_from_slurm() == "Slurm not configured (SLURM_REST_URL is empty)"
    assert not Node.objects.exists()


def test_the_periodic_import_logs_a_refusal_and_writes_nothing(slurm_settings, settings, caplog):
    settings.SLURM_GPU_MODELS = {}

    summary = tasks.import_from_slurm()

    assert summary.startswith("refused: Slurm GPU types with no catalog accelerator model: a100")
    assert "Slurm inventory import refused" in caplog.text
    assert not Node.objects.exists()
