"""What this host can serve, reported onto the nodes whose replicas it runs (catalog/runtimes.py has the vocabulary).

The serving drivers start replicas as local processes on the control-plane host, so what that host has installed is
what those nodes can run: `manage.py report_serving_runtimes` (and `seed_demo`, for the demo's simulated nodes)
probes it and records it on the nodes, where the placement engine reads it. Probed: llama.cpp's engine in its venv
and, for every approved model with a local artifact (`pypi:` or `file:`), its file with the catalog's checksum.
"""

from catalog.choices import ServingRuntime
from catalog.models import ServingModel
from provisioning.drivers import llamacpp
from scheduling.services import node_serving_runtimes_report

PROBED = frozenset({ServingRuntime.LLAMACPP})
LOCAL_ARTIFACTS = ("pypi:", "file:")


def local_serving_runtimes() -> dict[str, list[str]]:
    """{runtime: the model files this host holds for it} for the probed runtimes that are installed here."""
    if not llamacpp.engine_installed():
        return {}
    models = ServingModel.objects.filter(approved=True).values_list("artifact_uri", "checksum_sha256")
    return {
        ServingRuntime.LLAMACPP: sorted(
            {uri for uri, checksum in models if uri.startswith(LOCAL_ARTIFACTS) and llamacpp.holds_model(uri, checksum)}
        )
    }


def serving_runtimes_report(*, nodes, actor=None) -> tuple[dict[str, list[str]], list]:
    """Probe this host and record what it found on `nodes`: (what it found, the nodes that changed)."""
    found = local_serving_runtimes()
    return found, node_serving_runtimes_report(nodes=nodes, runtimes=found, probed=PROBED, actor=actor)
