"""Mails through a real SMTP server (aiosmtpd on the loopback, tests/smtp_server.py): what requesters, approvers and
operators are told, once each, unless they turned it off; and the notifications page."""

from datetime import timedelta

import pytest

from requests import approvals, notifications, tasks
from requests import services as request_services
from requests.choices import ApprovalMode, EventCode, NotificationKind, RequestState
from requests.models import NotificationDelivery, NotificationPreference
from requests.schedules import DIGEST_TASK, ensure_schedules
from requests.selectors import approval_inbox
from scheduling import reclaim
from scheduling.models import Allocation, Device
from scheduling.services import device_isolate
from tests import factories
from tests.requests.conftest import approval_rule, approver_stage, make_order
from tests.smtp_server import html_of, text_of

pytestmark = pytest.mark.django_db


def _subjects(mails):
    return [mail["Subject"] for mail in mails]


def test_a_request_s_life_reaches_its_requester_by_mail_with_links_and_how_to_connect(compute, mailbox, run_on_commit):
    request = compute.order()  # auto-approved (no rule), placed and provisioned: active
    assert request.state == RequestState.ACTIVE
    [ready] = mailbox.wait_for(1)
    assert ready["To"] == compute.team.developer.email
    assert ready["Subject"] == f"Request #{request.pk} is ready: how to connect"
    text, html = text_of(ready), html_of(ready)
    link = f"https://compute.example.org/requests/{request.pk}/"
    assert link in text and f'href="{link}"' in html
    assert "How to connect:" in text and "ssh " in text  # the delivered access, in words and as a table
    assert "<th" in html and "ssh " in html
    assert "https://compute.example.org/notifications/" in text

    run_on_commit(request_services.request_release, request=request, actor=compute.team.developer, reason="done")
    mails = mailbox.wait_for(2)
    assert mails[1]["Subject"] == f"Request #{request.pk} released"
    assert mails[1]["To"] == compute.team.developer.email
    # Nothing else was mailed: no automatic approval, no queue or provisioning chatter.
    assert len(mailbox.messages) == 2


def test_approved_and_rejected_requests_are_told_and_approvers_get_one_digest(shop, team, mailbox, run_on_commit):
    approval_rule(approver_stage(mode=ApprovalMode.ANY))
    first, second = (
        run_on_commit(request_services.request_submit, order=make_order(shop, team.project), requester=team.developer)
        for _ in range(2)
    )
    assert first.state == second.state == RequestState.PENDING_APPROVAL
    assert mailbox.messages == []  # nothing per item: approvers hear in the digest

    assert tasks.send_approval_digests() == 1
    [digest] = mailbox.wait_for(1)
    assert digest["To"] == team.approver.email
    assert digest["Subject"] == "2 waiting for your approval (2 new)"
    assert "https://compute.example.org/approvals/" in text_of(digest)
    assert text_of(digest).count("[new]") == 2
    assert tasks.send_approval_digests() == 0  # nothing new since: no mail

    third = run_on_commit(
        request_services.request_submit, order=make_order(shop, team.project), requester=team.developer
    )
    assert tasks.send_approval_digests() == 1
    later = mailbox.wait_for(2)[1]
    assert later["Subject"] == "3 waiting for your approval (1 new)"
    items = [line for line in text_of(later).splitlines() if line.startswith("- ")]
    assert len(items) == 3 and "[new]" in items[-1]  # the newest, third, is the one new since the last digest
    assert third.pk

    mailbox.clear()
    by_request = {task.stage.approval.subject_id: task for task in approval_inbox(user=team.approver)}
    run_on_commit(
        approvals.approval_decide,
        assignment=by_request[first.pk],
        decision="approve",
        comment="ok",
        actor=team.approver,
    )
    run_on_commit(
        approvals.approval_decide,
        assignment=by_request[second.pk],
        decision="reject",
        comment="use the slice",
        actor=team.approver,
    )
    approved, rejected = mailbox.wait_for(2)
    assert approved["Subject"] == f"Request #{first.pk} approved" and approved["To"] == team.developer.email
    assert rejected["Subject"] == f"Request #{second.pk} rejected"
    assert "use the slice" in text_of(rejected) and "use the slice" in html_of(rejected)


def test_a_kind_turned_off_is_not_sent_and_the_others_still_are(shop, team, mailbox, run_on_commit):
    notifications.notification_preferences_set(
        user=team.developer,
        enabled=[kind for kind in NotificationKind.values if kind != NotificationKind.REQUEST_REJECTED],
        shown=NotificationKind.values,
    )
    NotificationPreference.objects.create(user=team.approver, kind=NotificationKind.APPROVAL_DIGEST, enabled=False)
    approval_rule(approver_stage(mode=ApprovalMode.ANY))
    first, second = (
        run_on_commit(request_services.request_submit, order=make_order(shop, team.project), requester=team.developer)
        for _ in range(2)
    )
    assert tasks.send_approval_digests() == 0
    by_request = {task.stage.approval.subject_id: task for task in approval_inbox(user=team.approver)}
    run_on_commit(
        approvals.approval_decide, assignment=by_request[first.pk], decision="reject", comment="no", actor=team.approver
    )
    run_on_commit(
        approvals.approval_decide, assignment=by_request[second.pk], decision="approve", comment="", actor=team.approver
    )
    [only] = mailbox.wait_for(1)
    assert only["Subject"] == f"Request #{second.pk} approved"
    assert _subjects(mailbox.messages) == [only["Subject"]]


def test_a_failed_run_tells_the_requester_and_every_operator_once(compute, settings, mailbox):
    settings.PROVISIONING_FAULTS = [
        {"op": "start_workload", "code": "image_pull_failed", "message": "manifest unknown", "retryable": False}
    ]
    other_operator = factories.operator()
    request = compute.order()
    assert request.state == RequestState.FAILED
    mails = mailbox.wait_for(3)
    by_address = {mail["To"]: mail for mail in mails}
    assert set(by_address) == {compute.team.developer.email, compute.team.operator.email, other_operator.email}
    requester = by_address[compute.team.developer.email]
    assert requester["Subject"] == f"Request #{request.pk} failed"
    assert "The software image could not be downloaded to the node." in text_of(requester)
    assert "Operators have been told and can retry it" in text_of(requester)
    assert "manifest unknown" not in text_of(requester) and "image_pull_failed" not in text_of(requester)
    operator = by_address[other_operator.email]
    assert "manifest unknown" in text_of(operator)  # the backend's words, for operators
    assert operator["Subject"] == f"Provisioning failed for request #{request.pk}"
    assert f"https://compute.example.org/admin/requests/resourcerequest/{request.pk}/change/" in text_of(operator)

    failed = request.events.get(code=EventCode.FAILED)
    assert tasks.notify_request_events([failed.pk]) == 0  # the task run again sends nothing twice
    assert len(mailbox.messages) == 3
    assert NotificationDelivery.objects.filter(key=f"event:{failed.pk}").count() == 3


def test_isolating_a_busy_card_tells_operators_who_it_requeued_and_the_developer_that_it_waits_again(
    compute, mailbox, run_on_commit
):
    request = compute.order()
    mailbox.wait_for(1)  # the developer's "ready"
    mailbox.clear()
    run_on_commit(
        device_isolate, device=Device.objects.get(uuid="GPU-n1-0"), reason="XID 79 storm", actor=compute.team.operator
    )
    request.refresh_from_db()
    mailbox.wait_for(3)
    [isolation] = mailbox.to(compute.team.operator.email)
    assert isolation["Subject"] == "Device n1/gpu0 isolated"
    body = text_of(isolation)
    assert "XID 79 storm" in body and "Requeued for healthy hardware" in body
    assert f"#{request.pk}" in body and compute.team.developer.username in body
    assert "https://compute.example.org/admin/scheduling/device/" in body
    # The developer hears that it went back to the queue, then (the node has 3 healthy cards) that it runs again.
    requeued, ready = mailbox.to(compute.team.developer.email)
    assert requeued["Subject"] == f"Request #{request.pk} is back in the queue"
    assert "isolated" in text_of(requeued)
    assert ready["Subject"] == f"Request #{request.pk} is ready: how to connect"
    assert request.state == RequestState.ACTIVE


def test_an_expiring_request_is_told_once_per_warning(compute, mailbox, run_on_commit):
    request = compute.order()
    mailbox.wait_for(1)
    allocation = Allocation.objects.get(request=request)
    soon = allocation.expires_at - timedelta(hours=1)
    assert run_on_commit(reclaim.warn_expiring, now=soon) == 1
    assert run_on_commit(reclaim.warn_expiring, now=soon) == 0
    mails = mailbox.wait_for(2)
    assert mails[1]["Subject"] == f"Request #{request.pk} expires soon"
    assert "extension" in text_of(mails[1])
    assert len(mailbox.messages) == 2


def test_the_digest_schedule_is_created_once():
    ensure_schedules()
    ensure_schedules()
    from django_q.models import Schedule

    [schedule] = Schedule.objects.filter(func=DIGEST_TASK)
    assert (schedule.schedule_type, schedule.minutes, schedule.repeats) == (Schedule.MINUTES, 15, -1)


def test_a_mail_the_smtp_server_refused_is_not_marked_sent_and_goes_out_on_the_retry(
    shop, team, mailbox, settings, run_on_commit
):
    approval_rule(approver_stage(mode=ApprovalMode.ANY))
    request = run_on_commit(
        request_services.request_submit, order=make_order(shop, team.project), requester=team.developer
    )
    [task] = approval_inbox(user=team.approver)
    working_port = settings.EMAIL_PORT
    settings.EMAIL_PORT = 1  # nothing listens there: the send fails
    with pytest.raises(OSError):  # the task (inline in tests) fails after the decision's commit
        run_on_commit(approvals.approval_decide, assignment=task, decision="reject", comment="no", actor=team.approver)
    request.refresh_from_db()
    assert request.state == RequestState.REJECTED  # the decision stands
    rejected = request.events.get(code=EventCode.REJECTED)
    assert not NotificationDelivery.objects.filter(key=f"event:{rejected.pk}").exists()
    with pytest.raises(OSError):
        tasks.notify_request_events([rejected.pk])  # django-q retries a task that raised
    assert mailbox.messages == []
    settings.EMAIL_PORT = working_port
    assert tasks.notify_request_events([rejected.pk]) == 1
    [mail] = mailbox.wait_for(1)
    assert mail["Subject"] == f"Request #{request.pk} rejected"
