"""A month of ordering history for the API load benchmark (bench/report/api_load.py), written fast.

The people and the catalog go through the services (a few thousand rows: tenants, projects with their quotas,
memberships with their object permissions); the history itself, N requests and M timeline events, is written with
PostgreSQL's COPY, never through the services one by one. Shape (docs/benchmarks/history.md):

- the openb node list once (1,213 nodes, 6,212 GPUs) as the inventory, so previews and the cycle place for real;
- one compute service with whole-card specs of 1, 2, 4 and 8 cards on every openb model (weights 50/25/15/10 %),
  orders of 4 cards or more go to the project's approvers (one ANY stage);
- 20 tenants of 10 projects; each project a lead, three developers and an approver (1,000 users); requests spread
  over the projects with Zipf weights 1/(rank + 1) (the busiest project holds about a sixth of them);
- requests submitted uniformly over the last 30 days, durations 4-168 h: the newest 6 % still queued, those
  whose duration has not run out active, the rest released (88 %), cancelled (6 %), rejected (4 %, never
  approved) or failed (2 %); every approved one carries the snapshot submission freezes;
- the events spread over the requests as their state paths write them (submitted, admitted, approved, queued,
  allocated, provisioning, active, releasing, released...), topped up with queue-wait notes to the total asked.

Seeded history has no approval records or allocations of its own (the requests that went through an approval
would have them; the load run's approvals and the one scheduling cycle after seeding write real ones).
"""

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, models
from django.utils import timezone
from guardian.models import UserObjectPermission

from bench.scale import freeze_like, import_fleet, queued_row
from catalog.choices import ServiceKind
from catalog.models import AcceleratorModel, Image, ResourceSpec, Service, Vendor
from config.tokens import prefixed_secret_new, secret_hash
from requests.choices import PRIORITY_RANK, ApprovalMode, ApprovalSubject, ApproverSource, EventCode, RequestState
from requests.models import ApprovalPolicy, ApprovalRule, ApprovalRuleStage, RequestEvent, ResourceRequest
from requests.services import approved_snapshot
from scheduling.choices import AllocationState
from scheduling.models import Allocation, AllocationDevice, Device
from tenancy.api_tokens import TOKEN_KIND
from tenancy.choices import ROLE_PERMISSIONS, PriorityClass, Role, TokenScope
from tenancy.models import ApiToken, Membership, Project, ProjectQuota, Tenant, User

S = RequestState
TENANTS_OF = 10  # projects per tenant
DEVELOPERS_PER_PROJECT = 3  # besides the lead
CARDS = [(1, 50), (2, 25), (4, 15), (8, 10)]  # whole cards per spec, weight
APPROVAL_FROM_CARDS = 4
DURATIONS = [4, 8, 24, 72, 168]
DAYS = 30
QUEUED_SHARE = 0.06
ENDINGS = [(S.RELEASED, 88), (S.CANCELLED, 6), (S.REJECTED, 4), (S.FAILED, 2)]
QUOTA = {"gpus": Decimal(5000), "concurrent_tasks": 5000, "monthly_card_hours": Decimal(10**8)}
WAIT_NOTE = {"code": "capacity_in_use", "message": "Every matching card is in use.", "numbers": {"free": 0}}

# The events each final state's path writes, in order (code, from, to); queue-wait notes go after `queued`.
_SUBMIT = [(EventCode.SUBMITTED, "", S.SUBMITTED), (EventCode.ADMITTED, S.SUBMITTED, S.SUBMITTED)]
_APPROVE = [(EventCode.AUTO_APPROVED, S.SUBMITTED, S.APPROVED), (EventCode.QUEUED, S.APPROVED, S.QUEUED)]
_RUN = [
    (EventCode.ALLOCATED, S.QUEUED, S.ALLOCATED),
    (EventCode.PROVISIONING, S.ALLOCATED, S.PROVISIONING),
    (EventCode.ACTIVE, S.PROVISIONING, S.ACTIVE),
]
PATHS = {
    S.QUEUED: _SUBMIT + _APPROVE,
    S.ACTIVE: _SUBMIT + _APPROVE + _RUN,
    S.RELEASED: _SUBMIT
    + _APPROVE
    + _RUN
    + [
        (EventCode.EXPIRY_WARNING, S.ACTIVE, S.ACTIVE),
        (EventCode.RELEASING, S.ACTIVE, S.RELEASING),
        (EventCode.RELEASED, S.RELEASING, S.RELEASED),
    ],
    S.CANCELLED: [*_SUBMIT, *_APPROVE, (EventCode.CANCELLED, S.QUEUED, S.CANCELLED)],
    S.REJECTED: [
        *_SUBMIT,
        (EventCode.ROUTED, S.SUBMITTED, S.PENDING_APPROVAL),
        (EventCode.REJECTED, S.PENDING_APPROVAL, S.REJECTED),
    ],
    S.FAILED: [*_SUBMIT, *_APPROVE, *_RUN[:2], (EventCode.FAILED, S.PROVISIONING, S.FAILED)],
}


@dataclass
class Seeded:
    service: Service
    image: Image
    specs: list[ResourceSpec]
    projects: list[Project]
    developers: dict[int, list[User]]  # project id -> lead and developers
    approvers: dict[int, User]  # project id -> its approver
    requests: int
    events: int


def seed(*, nodes_csv: Path, requests: int, events: int, projects: int, seed_value: int = 42) -> Seeded:
    rng = random.Random(seed_value)
    import_fleet(nodes_csv, 1)
    service, image, specs = _catalog()
    project_list, developers, approvers = _people(projects)
    weights = [1 / (rank + 1) for rank in range(len(project_list))]
    chosen = rng.choices(project_list, weights=weights, k=requests)
    rows = _requests(rng, chosen, developers, service, image, specs)
    _copy(ResourceRequest, rows)
    first_event = (RequestEvent.objects.aggregate(top=models.Max("id"))["top"] or 0) + 1
    event_count = _copy(RequestEvent, _numbered(_events(rng, rows, events), first_event))
    allocations, bindings = _allocations(rng, rows)
    _copy(Allocation, allocations)
    first_binding = (AllocationDevice.objects.aggregate(top=models.Max("id"))["top"] or 0) + 1
    _copy(AllocationDevice, _numbered(bindings, first_binding))
    with connection.cursor() as cursor:
        for table in (
            ResourceRequest._meta.db_table,
            RequestEvent._meta.db_table,
            Allocation._meta.db_table,
            AllocationDevice._meta.db_table,
        ):
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
            cursor.execute(f"ANALYZE {table}")
    return Seeded(service, image, specs, project_list, developers, approvers, len(rows), event_count)


def _catalog() -> tuple[Service, Image, list[ResourceSpec]]:
    models_in_fleet = list(AcceleratorModel.objects.filter(devices__isnull=False).distinct())
    specs = []
    for cards, _weight in CARDS:
        spec = ResourceSpec.objects.create(
            slug=f"load-{cards}x",
            name=f"{cards} whole card{'s' if cards > 1 else ''}",
            accelerator_count=cards,
            cpu_cores=8 * cards,
            memory_gb=32 * cards,
            hourly_price=Decimal("2.00") * cards,
            max_duration_hours=720,
        )
        spec.accelerator_models.set(models_in_fleet)
        specs.append(spec)
    image = Image.objects.create(name="load-cuda", version="12.4", reference="load/cuda:12.4", approved=True)
    image.compatible_vendors.set(Vendor.objects.all())
    service = Service.objects.create(
        slug="load-compute",
        name="GPU workspace",
        kind=ServiceKind.COMPUTE,
        description="The API load benchmark's service",
        default_duration_hours=24,
        max_duration_hours=720,
    )
    service.specs.set(specs)
    service.images.set([image])
    policy = ApprovalPolicy.objects.create(name="load: large orders", subject=ApprovalSubject.RESOURCE_REQUEST)
    rule = ApprovalRule.objects.create(policy=policy, name="4 cards or more", min_accelerator_count=APPROVAL_FROM_CARDS)
    ApprovalRuleStage.objects.create(
        rule=rule, name="project approver", source=ApproverSource.PROJECT_ROLE, mode=ApprovalMode.ANY,
        project_role=Role.APPROVER,
    )  # fmt: skip
    return service, image, specs


def _people(count: int) -> tuple[list[Project], dict[int, list[User]], dict[int, User]]:
    """Users, tenants, projects with their quotas, memberships and the object permissions each role holds
    (ROLE_PERMISSIONS, which visibility reads), in bulk: what project_create and membership_grant would write,
    less their audit rows. No password hashing: the load signs in with tokens."""
    unusable = make_password(None)
    roles = [("lead", Role.LEAD), *((f"dev{d}", Role.MEMBER) for d in range(DEVELOPERS_PER_PROJECT))]
    roles.append(("approver", Role.APPROVER))
    User.objects.bulk_create(
        [
            User(username=f"load-p{p:03d}-{name}", email=f"load-p{p:03d}-{name}@example.com", password=unusable)
            for p in range(count)
            for name, _role in roles
        ]
    )
    users = {user.username: user for user in User.objects.filter(username__startswith="load-p")}
    tenants = Tenant.objects.bulk_create(
        [
            Tenant(name=f"Load tenant {t:02d}", slug=f"load-t{t:02d}")
            for t in range((count + TENANTS_OF - 1) // TENANTS_OF)
        ]
    )
    project_list = Project.objects.bulk_create(
        [
            Project(
                tenant=tenants[p // TENANTS_OF],
                name=f"Load project {p:03d}",
                slug=f"load-p{p:03d}",
                lead=users[f"load-p{p:03d}-lead"],
                cost_centre=f"CC-{p:03d}",
            )
            for p in range(count)
        ]
    )
    ProjectQuota.objects.bulk_create(
        [ProjectQuota(project=project, max_priority=PriorityClass.HIGH, **QUOTA) for project in project_list]
    )
    memberships = [
        Membership(project=project, user=users[f"{project.slug}-{name}"], role=role)
        for project in project_list
        for name, role in roles
    ]
    Membership.objects.bulk_create(memberships)
    project_type = ContentType.objects.get_for_model(Project)
    permissions = dict(Permission.objects.filter(content_type=project_type).values_list("codename", "pk"))
    UserObjectPermission.objects.bulk_create(
        [
            UserObjectPermission(
                user=membership.user,
                permission_id=permissions[codename],
                content_type=project_type,
                object_pk=str(membership.project.pk),
            )
            for membership in memberships
            for codename in ROLE_PERMISSIONS[membership.role]
        ]
    )
    developers = {
        project.pk: [users[f"{project.slug}-{name}"] for name, _role in roles[:-1]] for project in project_list
    }
    approvers = {project.pk: users[f"{project.slug}-approver"] for project in project_list}
    return project_list, developers, approvers


def _requests(rng, chosen: list[Project], developers, service, image, specs) -> list[ResourceRequest]:
    now = timezone.now()
    start = now - timedelta(days=DAYS)
    created = sorted(start + timedelta(seconds=rng.uniform(0, DAYS * 86400)) for _ in chosen)
    queued_from = int(len(chosen) * (1 - QUEUED_SHARE))
    # A spec's demand properties read its models: worked out once per spec, with the snapshot it freezes.
    templates = {spec.pk: queued_row(spec, chosen[0], None, service, image) for spec in specs}
    snapshots = {pk: approved_snapshot(template) for pk, template in templates.items()}
    demand = ("gpu_equivalents", "accelerator_count", "accelerator_memory_gb", "cpu_cores", "memory_gb", "hourly_cost")
    first_id = (ResourceRequest.objects.aggregate(top=models.Max("id"))["top"] or 0) + 1
    spec_weights = [weight for _cards, weight in CARDS]
    ending_states, ending_weights = zip(*ENDINGS, strict=True)
    rows = []
    for n, (project, at) in enumerate(zip(chosen, created, strict=True)):
        template = templates[rng.choices(specs, weights=spec_weights)[0].pk]
        hours = rng.choice(DURATIONS)
        if n >= queued_from:
            state = S.QUEUED
        elif at + timedelta(hours=hours) > now:
            state = S.ACTIVE
        else:
            state = rng.choices(ending_states, weights=ending_weights)[0]
        request = ResourceRequest(
            id=first_id + n,
            tenant_id=project.tenant_id,
            project=project,
            requester=rng.choice(developers[project.pk]),
            service=service,
            spec_id=template.spec_id,
            image=image,
            duration_hours=hours,
            card_hours=template.gpu_equivalents * hours,
            cost_estimate=template.hourly_cost * hours,
            state=state,
            created_at=at,
            updated_at=at,
            **{field: getattr(template, field) for field in demand},
        )
        if state != S.REJECTED:
            freeze_like(request, snapshots[template.spec_id])
            request.approved_at = at
        rows.append(request)
    return rows


def _events(rng, requests: list[ResourceRequest], total: int):
    """The timeline rows: each request's path (cut short if the total asks for fewer), then wait notes to the total."""
    paths = [PATHS[request.state] for request in requests]
    base = sum(len(path) for path in paths)
    extra, each = max(0, total - base), min(1.0, total / base) if base else 0.0
    for n, (request, path) in enumerate(zip(requests, paths, strict=True)):
        kept = path[: max(1, round(len(path) * each))]
        notes = extra // len(requests) + (1 if n < extra % len(requests) else 0)
        codes = [code for code, _from, _to in kept]
        # Notes wait in the queue after `queued`; a request never queued gets approval reminders instead.
        after = codes.index(EventCode.QUEUED) if EventCode.QUEUED in codes else len(kept) - 1
        note = (
            (EventCode.QUEUE_REASON, S.QUEUED, WAIT_NOTE)
            if EventCode.QUEUED in codes
            else (EventCode.REMINDER, S.PENDING_APPROVAL, {})
        )
        at = request.created_at
        for position, (code, from_state, to_state) in enumerate(kept):
            at += timedelta(seconds=rng.uniform(1, 120))
            yield _event(request, code, from_state, to_state, at, {})
            for _ in range(notes if position == after else 0):
                at += timedelta(seconds=60)
                yield _event(request, note[0], note[1], note[1], at, note[2])


def _allocations(rng, requests: list[ResourceRequest]) -> tuple[list[Allocation], list[AllocationDevice]]:
    """What the requests that ran held: a released allocation of their cards on one node for every one that ended
    after running (released, or failed while provisioning), and an active one for each active request while free
    cards remain, first come first served (the openb fleet holds a fraction of a month's active demand; the rest
    stay without). History does not check that released allocations overlapped in time."""
    cards_of: dict[int, list[int]] = {}
    for node_id, device_id in Device.objects.order_by("node_id", "index").values_list("node_id", "pk"):
        cards_of.setdefault(node_id, []).append(device_id)
    free = {pk: list(cards) for pk, cards in cards_of.items()}
    with_at_least = {count: [pk for pk, cards in cards_of.items() if len(cards) >= count] for count, _ in CARDS}
    allocations, bindings = [], []
    first_id = (Allocation.objects.aggregate(top=models.Max("id"))["top"] or 0) + 1
    for request in requests:
        if request.state not in (S.RELEASED, S.FAILED, S.ACTIVE):
            continue
        count, active = request.accelerator_count, request.state == S.ACTIVE
        if active:
            node = next((pk for pk in with_at_least[count] if len(free[pk]) >= count), None)
            if node is None:
                continue
            cards, free[node] = free[node][:count], free[node][count:]
        else:
            node = rng.choice(with_at_least[count])
            cards = cards_of[node][:count]
        allocation = _allocation(first_id + len(allocations), request, node)
        allocations.append(allocation)
        bindings += [AllocationDevice(allocation_id=allocation.id, device_id=card, milli=1000) for card in cards]
    return allocations, bindings


def _allocation(pk: int, request: ResourceRequest, node: int) -> Allocation:
    started = request.created_at + timedelta(minutes=2)
    ended = {S.RELEASED: started + timedelta(hours=request.duration_hours), S.FAILED: started + timedelta(minutes=6)}
    return Allocation(
        id=pk,
        request_id=request.pk,
        node_id=node,
        state=AllocationState.ACTIVE if request.state == S.ACTIVE else AllocationState.RELEASED,
        cpu_milli=request.cpu_cores * 1000,
        memory_mib=request.memory_gb * 1024,
        priority=PRIORITY_RANK[request.priority],
        started_at=started,
        term_started_at=started,
        released_at=ended.get(request.state),
        release_reason={S.RELEASED: "duration ended", S.FAILED: "provisioning failed"}.get(request.state, ""),
    )


def _numbered(objects, first_id: int):
    for pk, obj in enumerate(objects, start=first_id):
        obj.pk = pk
        yield obj


def _event(request, code, from_state, to_state, at: datetime, data: dict) -> RequestEvent:
    return RequestEvent(
        request_id=request.pk,
        actor_id=request.requester_id if code == EventCode.SUBMITTED else None,
        from_state=from_state,
        to_state=to_state,
        code=code,
        message=EventCode(code).label,
        data=data,
        created_at=at,
    )


def _copy(model, objects) -> int:
    """COPY the unsaved instances, their ids included, into the model's table; the number of rows."""
    fields = model._meta.concrete_fields
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    count = 0
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {model._meta.db_table} ({columns}) FROM STDIN") as copy,
    ):
        for obj in objects:
            copy.write_row([field.get_db_prep_save(getattr(obj, field.attname), connection) for field in fields])
            count += 1
    return count


def tokens_for(users: list[User]) -> list[str]:
    """One API token per user, as signing in would issue it (a person's: every scope), in one INSERT."""
    issued = [(user, *prefixed_secret_new(TOKEN_KIND)) for user in users]
    expires_at = timezone.now() + timedelta(days=30)
    ApiToken.objects.bulk_create(
        [
            ApiToken(
                user=user,
                name="bench",
                prefix=prefix,
                hashed=secret_hash(secret),
                scopes=list(TokenScope.values),
                expires_at=expires_at,
            )
            for user, prefix, secret in issued
        ]
    )
    return [secret for _, _, secret in issued]
