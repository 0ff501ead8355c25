"""Portal pages: catalog, order form with live preview, requests, approval inbox, project quota panel.

Views parse input, call selectors and services, and render; refusals come back as DomainErrors with a code and
a sentence, which the pages show as they are.
"""

from itertools import groupby
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import OuterRef, Subquery
from django.http import Http404, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from catalog import selectors as catalog_selectors
from catalog.choices import ServiceKind
from catalog.durations import longest_duration_hours
from catalog.parameters import parameters_in_words
from config.errors import DomainError
from config.session_end import RESUME_PARAMETER
from config.words import counted
from requests import approvals, extensions, failures, hooks, inbox, quota_changes, reorder, selectors, services
from requests.catalog_offers import mark_never_fitting, offer_rows, passes, shown_without_offers
from requests.choices import TERMINAL_STATES, Decision, RequestState
from requests.forms import (
    CatalogFilterForm,
    DecisionForm,
    ExtendForm,
    OrderForm,
    QuotaChangeForm,
    ReasonForm,
    RequestListFilterForm,
    orderable_projects,
    working_project,
)
from requests.models import RequestEvent
from requests.orders import order_fingerprint
from requests.quota_breakdown import quota_breakdown
from requests.refusals import next_steps
from tenancy.choices import ProjectPermission
from tenancy.selectors import project_list_visible_to, projects_with_permission, user_has_project_permission


def landing_url(user) -> str:
    """Where a role starts: operators in the console, people who approve but cannot order in their inbox, everyone
    else in the catalog."""
    if user.is_staff:
        return reverse("admin:index")
    can_order = projects_with_permission(user=user, permission=ProjectPermission.REQUEST).exists()
    if not can_order and projects_with_permission(user=user, permission=ProjectPermission.APPROVE).exists():
        return reverse("portal:approval-inbox")
    return reverse("portal:catalog")


class SignInView(LoginView):
    """Django's sign-in, sending each role to its page when no `next` asks for another; after a session ended
    (`next` carries resume=1) it says so."""

    def get_default_redirect_url(self):
        return landing_url(self.request.user)

    def get_context_data(self, **kwargs):
        from tenancy.sign_in_backends import sign_in_options

        context = super().get_context_data(**kwargs)
        resumed = urlsplit(self.get_redirect_url() or "").query
        return {**context, **sign_in_options(), "resuming": QueryDict(resumed).get(RESUME_PARAMETER) == "1"}


@login_required
def catalog(request):
    projects = list(orderable_projects(request.user))
    chosen = next((p for p in projects if str(p.pk) == request.GET.get("project")), None)
    project = chosen or working_project(request.user, projects)
    usage = selectors.project_quota_usage(project) if project else []
    filter_form = CatalogFilterForm(request.GET, currency=settings.CATALOG_CURRENCY)
    filters = filter_form.filters()
    services_by_kind = []
    visible = catalog_selectors.service_list(user=request.user).order_by("kind", "name")
    for kind, group in groupby(visible, key=lambda service: service.kind):
        rows = []
        for service in group:
            offers = [row for row in offer_rows(service, project, usage) if passes(row, filters)]
            if offers or shown_without_offers(service, filters):
                rows.append((service, offers, longest_duration_hours(service)))
        if rows:
            services_by_kind.append((ServiceKind(kind).label, rows))
    mark_never_fitting([row for _, rows in services_by_kind for _, offers, _ in rows for row in offers])
    context = {
        "projects": projects,
        "project": project,
        "usage": usage,
        "services_by_kind": services_by_kind,
        "filter_form": filter_form,
        "filtered": bool(filters),
        "filter_count": len(filters),
    }
    return render(request, "requests/catalog.html", context)


def _order_form(request, service):
    return OrderForm(request.POST, user=request.user, service=service)


def _orderable_service(request, slug):
    service = catalog_selectors.service_list(user=request.user).filter(slug=slug, active=True).first()
    if service is None:
        raise Http404("No such service in your catalog.")
    return service


@login_required
def order(request, slug):
    service = _orderable_service(request, slug)
    if request.method != "POST":
        return _order_page(request, service, *OrderForm.prefilled(request.GET, user=request.user, service=service))
    form = _order_form(request, service)
    if not form.is_valid():
        return _order_page(request, service, form, status=400)
    key = form.cleaned_data["idempotency_key"]
    fingerprint = order_fingerprint(form.order())
    if request.POST.get("confirm_duplicate") != "1":
        earlier = selectors.order_sent_before(requester=request.user, key=key, fingerprint=fingerprint)
        if earlier is not None:
            return _sent_before_page(request, service, form, earlier, same=earlier.order_fingerprint == fingerprint)
    try:
        created = services.request_submit(
            order=form.order(),
            requester=request.user,
            over_quota=form.cleaned_data["over_quota"],
            if_unplaceable=form.cleaned_data["if_unplaceable"],
            idempotency_key=key,
        )
    except DomainError as refusal:
        return _refused_order_page(request, service, form, refusal)
    if getattr(created, "resubmitted", False):  # the same form sent twice at once (a double click)
        return _sent_before_page(request, service, form, created, same=True)
    messages.success(request, f"Request #{created.pk} submitted: {created.get_state_display().lower()}.")
    return redirect("portal:request-detail", pk=created.pk)


def _sent_before_page(request, service, form, earlier, *, same: bool):
    """This form, or the same order, was submitted already: say which request it made and offer to submit another
    (with a key of its own, so that sending this page again is caught too). Nothing is stored."""
    sent_before = {"request": earlier, "same": same}
    return _order_page(request, service, form.with_new_key(), status=409, sent_before=sent_before)


def _order_page(
    request, service, form, notices=(), *, status=200, preview=None, refusal=None, next_steps=(), sent_before=None
):
    """The order form with its preview: on first load (a catalog link's choices in `form.initial`) the preview of
    what the form shows, so that it is there before anything is changed."""
    for notice in notices:
        messages.warning(request, notice)
    if preview is None:
        shown = form if form.is_bound else OrderForm(form.as_data(), user=request.user, service=service)
        preview = _preview(request, shown)
    context = {
        "service": service,
        "form": form,
        "refusal": refusal,
        "next_steps": next_steps,
        "preview": preview,
        "sent_before": sent_before,
    }
    return render(request, "requests/order.html", context, status=status)


def _refused_order_page(request, service, form, refusal: DomainError):
    """The service's refusal at the field it names (the summary on top links there), with the next steps."""
    preview = _preview(request, form)
    steps = next_steps(refusal, form=form, user=request.user, rightsizing=preview.get("rightsizing", []))
    field = refusal.details.get("field") if isinstance(refusal.details, dict) else None
    form.add_error(field if field in form.fields else None, refusal.message)
    return _order_page(request, service, form, status=422, preview=preview, refusal=refusal, next_steps=steps)


def _preview(request, form) -> dict:
    if not form.is_bound or not form.is_valid():
        return {}
    order = form.order()
    try:
        data = services.request_preview(order=order, requester=request.user, over_quota=form.cleaned_data["over_quota"])
    except DomainError as error:
        return {"refusal": error}
    advice = hooks.ask(hooks.RIGHTSIZING_ADVICE, request.user, order.project, order.spec) or []
    return {"data": data, "rightsizing": advice}


@login_required
@require_POST
def order_preview(request, slug):
    """The live preview (htmx): cost, quota impact and approval route for the form as it stands."""
    service = _orderable_service(request, slug)
    form = OrderForm(request.POST, user=request.user, service=service, settle=True)
    preview = _preview(request, form)
    # A field the form settled (the template, once the model changed) is swapped in beside the preview.
    swapped = [form[name] for name in form.settled]
    return render(request, "requests/_preview.html", {"form": form, "preview": preview, "swapped": swapped})


# A list row shows its latest message while the request is still under way; finished requests and failed ones
# (which wait on an operator's retry, not on their requester) stay quiet.
QUIET_STATES = TERMINAL_STATES | {RequestState.FAILED}


# A page of the request list: enough to scan, few enough to read at once.
REQUEST_LIST_PAGE_SIZE = 50


@login_required
def request_list(request):
    """The requests the user may see, newest first: searched, filtered by state, project and spec, paginated (a count
    and a page: the same queries however many there are). Whose requests it starts with depends on the role."""
    own_first = selectors.request_list_starts_with_own(request.user)
    form = RequestListFilterForm(request.GET, user=request.user, own_first=own_first)
    latest = RequestEvent.objects.filter(request=OuterRef("pk")).order_by("-created_at", "-id")
    queryset = selectors.request_list_filtered(user=request.user, **form.filters()).annotate(
        latest_message=Subquery(latest.values("message")[:1])
    )
    page = Paginator(queryset, REQUEST_LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "requests/request_list.html",
        {
            "form": form,
            "page": page,
            "page_numbers": page.paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1),
            "requests": page.object_list,
            "quiet": QUIET_STATES,
            "filtered": form.narrows(),
            "can_order": projects_with_permission(user=request.user, permission=ProjectPermission.REQUEST).exists(),
        },
    )


# The status area of a request page polls itself until the request is final: quickly while it is on its way,
# slowly once it has settled (active, or failed and waiting for an operator), not at all when it is over.
SETTLED_STATES = frozenset({RequestState.ACTIVE, RequestState.FAILED})
POLL_SECONDS_MOVING = 3
POLL_SECONDS_SETTLED = 15
HOLDING_STATES = frozenset({RequestState.ALLOCATED, RequestState.PROVISIONING, RequestState.ACTIVE})
# What a higher app hands to the next render of a request page once (e.g. a new API key after its POST redirected).
SHOWN_ONCE_SESSION_KEY = "request_page_shown_once"


def show_once_on_request_page(request, request_id: int, **values) -> None:
    """Keep `values` in the (server-side) session for the next render of the request page, which drops them."""
    request.session[SHOWN_ONCE_SESSION_KEY] = {"request": request_id, **values}


def _pop_shown_once(request, request_id: int) -> dict:
    shown = request.session.get(SHOWN_ONCE_SESSION_KEY)
    if not shown or shown.get("request") != request_id:
        return {}
    del request.session[SHOWN_ONCE_SESSION_KEY]
    return shown


@login_required
@never_cache  # the requester's page holds the secrets that open their workload
def request_detail(request, pk):
    resource_request = selectors.request_get(user=request.user, pk=pk)
    context = {**request_page_context(request, resource_request), "shown_once": _pop_shown_once(request, pk)}
    return render(request, "requests/request_detail.html", context)


@login_required
@never_cache
def request_status(request, pk):
    """The status area alone (badge, actions, connect, queue, approval, provisioning, allocation, timeline), polled
    by the request page; one render from one read, so its parts never disagree."""
    resource_request = selectors.request_get(user=request.user, pk=pk)
    return render(request, "requests/_status.html", request_page_context(request, resource_request))


def request_page_context(request, resource_request) -> dict:
    """What the request page shows, read once per render."""
    state = resource_request.state
    provisioning = hooks.ask(hooks.PROVISIONING_DETAILS, resource_request)
    endpoint = hooks.ask(hooks.ENDPOINT_DETAILS, resource_request, request.build_absolute_uri("/"))
    allocation = hooks.ask(hooks.ALLOCATION_DETAILS, resource_request)
    may_act = services.can_cancel(request.user, resource_request)
    failure = failures.failure_of(resource_request)
    return {
        "r": resource_request,
        "parameters": parameters_in_words(resource_request.service.parameter_schema, resource_request.parameters),
        "failure": failure,
        "failure_step": _step_label(provisioning, failure.step) if failure else "",
        "order_again": reorder.form_link(resource_request)
        if reorder.may_order_again(request.user, resource_request)
        else None,
        "timeline": selectors.timeline_of(resource_request),
        "approval": selectors.approval_of(resource_request),
        "allocation": allocation,
        "endpoint": endpoint,
        "provisioning": provisioning,
        "usage": hooks.ask(hooks.REQUEST_USAGE, resource_request) if allocation is not None else None,
        "backend_wait": selectors.backend_wait_of(resource_request) if state == RequestState.PROVISIONING else None,
        "connect": _connect_items(provisioning, endpoint, _connect_secrets(request, resource_request))
        if state == RequestState.ACTIVE
        else [],
        "poll_seconds": _poll_seconds(state),
        "can_cancel": resource_request.is_cancellable and may_act,
        "can_release": state in HOLDING_STATES and may_act,
        "idle": hooks.ask(hooks.IDLE_STATUS, resource_request, request.user) if state == RequestState.ACTIVE else None,
    }


def _step_label(provisioning: dict | None, name: str) -> str:
    """What the provisioning step called `name` is called on the page (its latest run's)."""
    for run in reversed((provisioning or {}).get("runs", [])):
        for step in run["steps"]:
            if step["name"] == name:
                return step["label"]
    return "the workload" if name == "workload" else ""


def _poll_seconds(state: str) -> int | None:
    if state in TERMINAL_STATES:
        return None
    return POLL_SECONDS_SETTLED if state in SETTLED_STATES else POLL_SECONDS_MOVING


# A whole card in the allocation's shares (requests cannot import scheduling's MILLI).
MILLI_PER_CARD = 1000
ACCESS_LABELS = {"ssh": "SSH", "jupyter": "Jupyter", "attach": "Attach (Slurm)"}
# A workspace reached by SSH also opens in an IDE (provisioning.ide): the block for ~/.ssh/config and the links.
IDE_LABELS = {"ssh_config": "ssh_config", "vscode": "Open in VS Code", "jetbrains_gateway": "JetBrains Gateway"}


def _connect_secrets(request, resource_request) -> dict:
    """The secrets that open the workload (a Jupyter token): the requester's alone, nobody else gets any."""
    if resource_request.state != RequestState.ACTIVE:
        return {}
    return hooks.ask(hooks.CONNECT_SECRETS, resource_request, request.user) or {}


def _connect_items(provisioning, endpoint, secrets: dict) -> list[dict]:
    """How to reach what was delivered, each with a value to copy and a link where a browser can open it. An entry
    opened with a secret carries it for the requester (and may be changed); everyone else sees it without."""
    if endpoint is not None:
        return [
            {"name": "endpoint", "label": "Endpoint", "value": endpoint["url"]},
            {"name": "curl", "label": "Try it", "value": endpoint["curl"]},
        ]
    delivered = (provisioning or {}).get("delivered") or {}
    guarded = set(delivered.get("connect_secrets") or [])
    items = []
    for name, value in delivered.get("access", {}).items():
        secret = secrets.get(name) if name in guarded else None
        shown = (secret or {}).get("access") or value
        items.append(
            {
                "name": name,
                "label": ACCESS_LABELS.get(name, name),
                "value": shown,
                "link": shown.startswith("http"),
                "secret": secret,
                "secret_withheld": name in guarded and secret is None,
            }
        )
    ide = delivered.get("ide") or {}
    items += [
        {"name": name, "label": label, "value": ide[name], "link": name != "ssh_config", "block": name == "ssh_config"}
        for name, label in IDE_LABELS.items()
        if name in ide
    ]
    return items


@login_required
def request_endpoint_health(request, pk):
    """A serving endpoint's replica health and tokens alone, polled by the request page."""
    resource_request = selectors.request_get(user=request.user, pk=pk)
    endpoint = hooks.ask(hooks.ENDPOINT_DETAILS, resource_request, request.build_absolute_uri("/"))
    if endpoint is None:
        raise Http404("This request has no endpoint.")
    return render(request, "requests/_endpoint_health.html", {"r": resource_request, "endpoint": endpoint})


def _act_on_request(request, pk: int, act, done: str):
    """Run one service on a request the user may see; the outcome or the refusal is a message on its page, which
    the answer redirects to (a reload repeats nothing)."""
    try:
        act(selectors.request_get(user=request.user, pk=pk))
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Request #{pk} {done}.")
    return redirect("portal:request-detail", pk=pk)


def _confirmed_action(*, allowed, form_class, question, consequences, confirm_label, act, done: str, danger=True):
    """A request action behind a confirmation: GET asks (a page, or the dialog's content for htmx), POST acts.
    People who may see the request but not do this get 403 (the service would refuse them too)."""

    @login_required
    @require_http_methods(["GET", "POST"])
    def view(request, pk):
        target = selectors.request_get(user=request.user, pk=pk)
        if not allowed(request.user, target):
            raise PermissionDenied("You may see this request but not do this.")
        form = form_class(request.POST or None)
        if request.method == "POST" and form.is_valid():
            return _act_on_request(request, pk, lambda locked: act(locked, request.user, form.cleaned_data), done)
        return confirmation(
            request,
            title=question(target),
            consequences=consequences(target),
            form=form,
            confirm_label=confirm_label,
            back_url=reverse("portal:request-detail", args=[pk]),
            danger=danger,
            status=400 if form.is_bound else 200,
        )

    return view


def confirmation(request, *, title, consequences, form, confirm_label, back_url, danger=True, status=200):
    """The confirm step of a destructive action: what it will do, in words, and a form that posts to this URL.
    Opened in the page's dialog by htmx, or as a page of its own without JavaScript."""
    template = "requests/_confirm.html" if request.headers.get("HX-Request") else "requests/confirm.html"
    context = {
        "title": title,
        "consequences": consequences,
        "form": form,
        "confirm_label": confirm_label,
        "back_url": back_url,
        "danger": danger,
    }
    return render(request, template, context, status=status)


def _release_consequences(target) -> list[str]:
    allocation = hooks.ask(hooks.ALLOCATION_DETAILS, target)
    held = (
        [
            f"Stops the workload on {', '.join(dict.fromkeys(allocation.get('nodes') or [allocation['node']]))} and "
            f"gives back {_devices_in_words(allocation['devices'])}."
        ]
        if allocation
        else []
    )
    return [*held, "Whatever was delivered (SSH, Jupyter, endpoint) stops answering.", "This cannot be undone."]


def _devices_in_words(devices: list[dict]) -> str:
    names = ", ".join(_device_in_words(device) for device in devices)
    return f"{counted(len(devices), 'device')} ({names})" if devices else "its share"


def _device_in_words(device: dict) -> str:
    """A MIG slice as its slice, a share as its part of the card, a card as itself."""
    card = f"{device['model']} #{device['index']}"
    if device.get("mig_instance"):
        return f"the MIG {device['mig_instance']['profile']} slice of {card}"
    if device["milli"] < MILLI_PER_CARD:
        return f"{round(device['milli'] / 10)}% of {card}"
    return card


def _cancel_consequences(target) -> list[str]:
    return [
        f"Withdraws the request (now {target.get_state_display().lower()}); nothing was allocated to it yet.",
        "This cannot be undone: ordering again starts over.",
    ]


request_release = _confirmed_action(
    allowed=services.can_release,
    form_class=ReasonForm,
    question=lambda target: f"Release request #{target.pk}?",
    consequences=_release_consequences,
    confirm_label="Release now",
    act=lambda target, actor, data: services.request_release(
        request=target, actor=actor, reason=data["reason"] or "released early"
    ),
    done="is being released",
)
request_cancel = _confirmed_action(
    allowed=services.can_cancel,
    form_class=ReasonForm,
    question=lambda target: f"Cancel request #{target.pk}?",
    consequences=_cancel_consequences,
    confirm_label="Cancel request",
    act=lambda target, actor, data: services.request_cancel(request=target, actor=actor, reason=data["reason"]),
    done="cancelled",
)
request_extend = _confirmed_action(
    allowed=services.can_release,
    form_class=ExtendForm,
    question=lambda target: f"Ask for more time for request #{target.pk}?",
    consequences=lambda target: [
        "The extra hours are checked against the monthly card-hour budget and approved by the same rules as an "
        "order; the expiry moves once they are approved."
    ],
    confirm_label="Ask for more time",
    act=lambda target, actor, data: extensions.request_extension_submit(
        request=target, hours=data["hours"], justification=data["justification"], actor=actor
    ),
    done="extension sent",
    danger=False,
)


@login_required
def approval_inbox(request):
    """What waits for the user's decision (filters, sort, bulk decisions, errors on their rows), or with
    `?tab=decided` what the user decided."""
    if request.GET.get("tab") == "decided":
        context = {"tab": "decided", "decided": inbox.decided_rows(request.user), "page": inbox.DECIDED_PAGE}
        return render(request, "requests/approval_inbox.html", context)
    row_errors = request.session.pop(inbox.ROW_ERRORS_SESSION_KEY, {})
    context = {
        "tab": "pending",
        **inbox.pending_rows(request.user, params=request.GET, row_errors=row_errors),
        "form": DecisionForm(),
        "sorts": inbox.SORTS,
        "kinds": inbox.KINDS,
        "flags": inbox.FLAGS,
        "chosen": {key: request.GET.get(key, "") for key in ("project", "kind", "flag", "sort")},
        "filtered": any(request.GET.get(key) for key in ("project", "kind", "flag")),
    }
    return render(request, "requests/approval_inbox.html", context)


def _back_to_inbox(request):
    """Back to the inbox as the user had it (filters and sort), never to another site."""
    query = request.POST.get("back", "")
    return redirect(reverse("portal:approval-inbox") + (f"?{query}" if query and "//" not in query else ""))


@login_required
@require_POST
def approval_decide(request, pk):
    task = selectors.approval_task_get(user=request.user, pk=pk)
    decision = request.POST.get("decision")
    form = DecisionForm(request.POST)
    form.is_valid()
    try:
        approvals.approval_decide(
            assignment=task, decision=decision, comment=form.cleaned_data.get("comment", ""), actor=request.user
        )
    except DomainError as error:
        request.session[inbox.ROW_ERRORS_SESSION_KEY] = {str(task.pk): error.message}
        messages.error(request, f"{task.stage.approval.summary}: {error.message}")
    else:
        verb = "Approved" if decision == Decision.APPROVE else "Rejected"
        messages.success(request, f"{verb}: {task.stage.approval.summary}")
    return _back_to_inbox(request)


@login_required
@require_POST
def approval_bulk_decide(request):
    """Approve or reject the selected tasks, each through the approval service on its own; a refusal is shown on
    its row (and summed up on top), the others go through."""
    task_ids = [int(pk) for pk in request.POST.getlist("task") if pk.isdigit()]
    decision = request.POST.get("decision", Decision.APPROVE)
    if not task_ids:
        messages.warning(request, "Select the items to decide first.")
        return _back_to_inbox(request)
    form = DecisionForm(request.POST)
    form.is_valid()
    results = approvals.approvals_bulk_decide(
        task_ids=task_ids, decision=decision, comment=form.cleaned_data.get("comment", ""), actor=request.user
    )
    done = sum(result["ok"] for result in results)
    verb = "Rejected" if decision == Decision.REJECT else "Approved"
    if done:
        messages.success(request, f"{verb} {done} item{'s' if done != 1 else ''}.")
    failed = {str(result["id"]): result["message"] for result in results if not result["ok"]}
    if failed:
        request.session[inbox.ROW_ERRORS_SESSION_KEY] = failed
        messages.error(request, f"{len(failed)} item{'s' if len(failed) != 1 else ''} not decided: see the rows.")
    return _back_to_inbox(request)


# The name the inbox's bulk form posted to before rejecting in bulk existed.
approval_bulk_approve = approval_bulk_decide


@login_required
def project_list(request):
    return render(request, "requests/project_list.html", {"projects": project_list_visible_to(user=request.user)})


@login_required
def project_quota(request, pk):
    """A project's quota: what uses each dimension (running, queued, reserved, approved exceptions, metered) with the
    requests behind it, and for its lead a change form that starts from the current limits."""
    project = get_object_or_404(project_list_visible_to(user=request.user).select_related("quota", "lead"), pk=pk)
    is_lead = user_has_project_permission(user=request.user, project=project, permission=ProjectPermission.MANAGE)
    form = QuotaChangeForm(
        request.POST or None, current=project.quota.limits(), initial=QuotaChangeForm.prefill_from(request.GET)
    )
    if request.method == "POST" and is_lead and form.is_valid():
        try:
            change = quota_changes.quota_change_request_submit(
                project=project,
                limits=form.limits(),
                justification=form.cleaned_data["justification"],
                actor=request.user,
            )
        except DomainError as error:
            form.add_error(None, error.message)
        else:
            messages.success(request, f"Quota change #{change.pk} sent for approval.")
            return redirect("portal:project-quota", pk=pk)
    return render(
        request,
        "requests/project_quota.html",
        {
            "project": project,
            "breakdown": quota_breakdown(project),
            "form": form,
            "is_lead": is_lead,
            "changes": selectors.quota_change_list_visible_to(user=request.user).filter(project=project)[:20],
        },
    )
