"""The notifications page: each role sees the kinds of mail it may get and turns them off; constant queries."""

import pytest
from django.urls import reverse

from requests import notifications
from requests.choices import NotificationKind
from requests.models import NotificationPreference
from tenancy.models import AuditEvent

pytestmark = pytest.mark.django_db


def test_notifications_page_role_matrix(client, roles, django_assert_max_num_queries):
    url = reverse("portal:notifications")
    assert client.get(url).status_code == 302  # anonymous: to the sign-in page
    expected = {
        "developer": ("About my requests", ()),
        "other_developer": ("About my requests", ()),
        "approver": ("As an approver", ("As an operator",)),
        "lead": ("As an approver", ("As an operator",)),
        "operator": ("As an operator", ()),
    }
    for role, (shown, hidden) in expected.items():
        client.force_login(getattr(roles, role))
        with django_assert_max_num_queries(10):
            page = client.get(url)
        assert page.status_code == 200, role
        body = page.content.decode()
        assert shown in body, role
        assert all(heading not in body for heading in hidden), role
    client.force_login(roles.developer)
    assert "As an approver" not in client.get(url).content.decode()


def test_saving_preferences_redirects_turns_off_what_is_unticked_and_is_audited(client, roles):
    client.force_login(roles.approver)
    url = reverse("portal:notifications")
    response = client.post(url, {"enabled": [NotificationKind.REQUEST_APPROVED, "not-a-kind"]})
    assert response.status_code == 302 and response["Location"] == url
    current = notifications.preferences_of(roles.approver)
    assert current[NotificationKind.REQUEST_APPROVED] is True
    assert current[NotificationKind.APPROVAL_DIGEST] is False
    assert current[NotificationKind.REQUEST_ACTIVE] is False
    assert current[NotificationKind.OPERATOR_ISOLATION] is True  # not shown to an approver: left as it was
    page = client.get(url).content.decode()
    assert 'value="request_approved" id="kind-request_approved" checked' in page
    assert 'value="approval_digest" id="kind-approval_digest" >' in page
    audit = AuditEvent.objects.get(action="notifications.preferences_changed")
    assert audit.actor == roles.approver and audit.data[NotificationKind.APPROVAL_DIGEST] is False
    client.post(url, {"enabled": [NotificationKind.REQUEST_APPROVED]})  # the same again: nothing changes
    assert AuditEvent.objects.filter(action="notifications.preferences_changed").count() == 1


def test_notification_page_query_count_does_not_grow_with_preferences(client, roles, django_assert_max_num_queries):
    client.force_login(roles.operator)
    url = reverse("portal:notifications")
    for kind in NotificationKind.values:
        NotificationPreference.objects.create(user=roles.operator, kind=kind, enabled=False)
    with django_assert_max_num_queries(10):
        assert client.get(url).status_code == 200
