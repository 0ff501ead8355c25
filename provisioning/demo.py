"""Demo: the simulated nodes' serving replicas run on this host, so they can run what it has installed (llama.cpp
and SmolLM2 after `make llama`); probed on every seed, so a `make llama` is picked up by the next `make run`."""

from provisioning.runtimes import serving_runtimes_report
from scheduling.choices import ExecutionBackend
from scheduling.models import Node


def seed(context: dict) -> None:
    serving_runtimes_report(nodes=list(Node.objects.filter(execution_backend=ExecutionBackend.SIMULATED)))
