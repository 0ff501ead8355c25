"""Fixtures: the Redfish emulator and its stand-ins; compute and bare-metal shops on simulated hardware."""

import contextlib
import os
import signal
from decimal import Decimal
from types import SimpleNamespace

import pytest
import redis

from catalog.choices import ServiceKind
from requests import services as request_services
from requests.choices import RequestState
from scheduling import cycle
from scheduling.models import Device, Node
from tests import factories

# Fixtures from their own modules: the Ansible test hosts, the podman service, the gateway processes and the Redfish
# BMC stand-ins (the sushy-tools emulator, its image server and the fault-injecting stand-in).
from tests.devcluster_fixtures import (  # noqa: F401  (fixtures)
    in_band,
    podman_service,
    test_hosts,
)
from tests.provisioning.gateway_process import gateway_redis, gateways  # noqa: F401  (fixtures)
from tests.provisioning.redfish_emulator import (  # noqa: F401  (fixtures)
    elsewhere,
    image_server,
    redfish_stand_in,
    sushy_emulator,
    sushy_emulator_with_auth,
    sushy_static,
)
from tests.requests import conftest as request_fixtures
from tests.requests.conftest import GENEROUS_QUOTA, make_order


@pytest.fixture
def redis_db(request):
    """The test module's own Redis database (its REDIS_URL: each module names a different one), empty at the start
    and flushed again at the end; no other database is touched."""
    store = redis.from_url(request.module.REDIS_URL)
    store.flushdb()
    yield store
    store.flushdb()
    store.close()


# --- Pipelines: a compute shop and a bare-metal shop on simulated hardware ---------------------------------------

shop, team = request_fixtures.shop, request_fixtures.team
BARE_METAL_QUOTA = {
    **GENEROUS_QUOTA,
    "gpus": Decimal(32),
    "cpu_cores": 512,
    "memory_gb": 8192,
    "accelerator_memory_gb": 4096,
}


def add_node(accelerator, name="n1", cards=4, cpu_cores=64, memory_gb=512, **fields) -> Node:
    node = Node.objects.create(
        name=name, serial_number=f"sn-{name}", cpu_milli=cpu_cores * 1000, memory_mib=memory_gb * 1024, **fields
    )
    for index in range(cards):
        Device.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}", model=accelerator, memory_gb=80)
    return node


@pytest.fixture
def run_on_commit(django_capture_on_commit_callbacks):
    """Run a callable with after-commit work executed, as it is in production (signals, then tasks inline)."""

    def run(action, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return action(*args, **kwargs)

    return run


@pytest.fixture
def compute(shop, team, run_on_commit):
    """A 4-card node and a helper that orders the 2-card spec and lets the scheduler and provisioning run."""
    node = add_node(shop.accelerator)

    def order(**overrides):
        request = run_on_commit(
            request_services.request_submit, order=make_order(shop, team.project, **overrides), requester=team.developer
        )
        assert request.state == RequestState.QUEUED
        run_on_commit(cycle.run_cycle)
        request.refresh_from_db()
        return request

    return SimpleNamespace(shop=shop, team=team, node=node, order=order)


@pytest.fixture
def bare_metal(team, run_on_commit):
    """A bare-metal service with one profile (validation, driver, agent, cluster) and an 8-card server."""
    accelerator = factories.AcceleratorModelFactory(memory_gb=80)
    os_image = factories.ImageFactory(reference="http://images.test/ubuntu-22.04-gpu.iso")
    profile = factories.BareMetalProfileFactory(
        accelerator_model=accelerator,
        os_image=os_image,
        cpu_cores=96,
        memory_gb=1024,
        validation_suite=["bmc_reachable", "system_health", "inventory_match", "accelerator_burn_in"],
    )
    service = factories.ServiceFactory(kind=ServiceKind.BARE_METAL, specs=[], images=[])
    service.bare_metal_profiles.set([profile])
    from tenancy.services import quota_set

    quota_set(quota=team.project.quota, limits=BARE_METAL_QUOTA, actor=None)
    node = add_node(accelerator, name="bm1", cards=8, cpu_cores=112, memory_gb=2048)

    def order(**parameters):
        from requests.orders import Order

        request = run_on_commit(
            request_services.request_submit,
            requester=team.developer,
            order=Order(
                service=service,
                project=team.project,
                duration_hours=24,
                bare_metal_profile=profile,
                parameters=parameters,
            ),
        )
        assert request.state == RequestState.QUEUED
        run_on_commit(cycle.run_cycle)
        request.refresh_from_db()
        return request

    return SimpleNamespace(team=team, node=node, profile=profile, service=service, order=order)


@pytest.fixture
def on_redfish(settings, bare_metal, image_server):  # noqa: F811  (the imported fixture)
    """The bare-metal shop on the `redfish` driver, its OS image served by the image server."""
    settings.PROVISIONING_BMC_DRIVER = "redfish"
    settings.REDFISH_VERIFY_TLS = False
    image = bare_metal.profile.os_image
    image.reference = f"{image_server}/installer-a.iso"
    image.save(update_fields=["reference"])
    return bare_metal


@pytest.fixture
def serving(shop, team, run_on_commit):
    """A model-serving service (1 card a replica, 2 replicas) on a 4-card node, and an order helper. Inference
    servers the tests start are stopped at the end."""
    from requests.orders import Order
    from serving.models import ServingReplica

    one_card = factories.ResourceSpecFactory(
        accelerator_models=[shop.accelerator], accelerator_count=1, cpu_cores=4, memory_gb=32
    )
    template = factories.ServingTemplateFactory(spec=one_card, replicas=2, context_length=4096, max_tokens=256)
    model = factories.ServingModelFactory(name="llama-3-8b-instruct", templates=[template])
    service = factories.ServiceFactory(kind=ServiceKind.MODEL_SERVING, specs=[one_card], images=[])
    service.serving_models.set([model])
    add_node(shop.accelerator)

    def order(**parameters):
        request = run_on_commit(
            request_services.request_submit,
            requester=team.developer,
            order=Order(
                service=service,
                project=team.project,
                duration_hours=8,
                spec=template.spec,
                serving_model=model,
                serving_template=template,
                parameters=parameters,
            ),
        )
        assert request.state == RequestState.QUEUED
        run_on_commit(cycle.run_cycle)
        request.refresh_from_db()
        return request

    yield SimpleNamespace(team=team, model=model, template=template, service=service, order=order)
    for pid in ServingReplica.objects.exclude(pid=None).values_list("pid", flat=True):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
