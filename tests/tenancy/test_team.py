"""The Team page: a project's lead (and operators) add people, change roles and remove them through the membership
services, audited; someone without an account is invited by a mail (real SMTP) with a one-time sign-up link."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from config.errors import NotPermitted
from tenancy import team
from tenancy.choices import ProjectPermission, Role
from tenancy.models import AuditEvent, Invitation, Membership, User
from tenancy.selectors import user_has_project_permission
from tests import factories
from tests.smtp_server import html_of, text_of

pytestmark = pytest.mark.django_db


def _team_url(project):
    return reverse("team:team", args=[project.pk])


def test_team_page_role_matrix(client, roles):
    url = _team_url(roles.project)
    assert client.get(url).status_code == 302  # anonymous: sign in first
    expected = {
        "other_developer": 404,
        "outsider": 404,
        "developer": 200,
        "approver": 200,
        "lead": 200,
        "operator": 200,
    }
    for role, status in expected.items():
        client.force_login(getattr(roles, role))
        page = client.get(url)
        assert page.status_code == status, role
        if status == 200:
            body = page.content.decode()
            assert roles.developer.username in body, role
            manages = role in ("lead", "operator")
            assert ('id="team-add"' in body) is manages, role
            assert ('id="ask-lead"' in body) is not manages, role


def test_only_the_lead_and_operators_may_change_the_team(client, roles):
    newcomer = factories.UserFactory()
    add = {"identifier": newcomer.username, "role": Role.MEMBER}
    member = Membership.objects.get(project=roles.project, user=roles.developer)
    for role, status in {"other_developer": 404, "developer": 403, "approver": 403}.items():
        client.force_login(getattr(roles, role))
        assert client.post(_team_url(roles.project), add).status_code == status, role
        role_url = reverse("team:role", args=[roles.project.pk, roles.developer.pk])
        assert client.post(role_url, {"role": Role.APPROVER}).status_code == status, role
        assert client.post(reverse("team:remove", args=[roles.project.pk, roles.developer.pk])).status_code == status
    assert not Membership.objects.filter(user=newcomer).exists()
    member.refresh_from_db()
    assert member.role == Role.MEMBER
    with pytest.raises(NotPermitted):
        team.team_member_add(project=roles.project, identifier=newcomer.username, role="member", actor=roles.developer)


@pytest.mark.parametrize("manager", ["lead", "operator"])
def test_a_lead_or_operator_adds_changes_and_removes_members_audited(client, roles, manager):
    actor = getattr(roles, manager)
    client.force_login(actor)
    newcomer = _colleague_in(roles.project.tenant)
    response = client.post(_team_url(roles.project), {"identifier": newcomer.email.upper(), "role": Role.MEMBER})
    assert response.status_code == 302 and response["Location"] == _team_url(roles.project)
    assert user_has_project_permission(user=newcomer, project=roles.project, permission=ProjectPermission.REQUEST)

    client.post(reverse("team:role", args=[roles.project.pk, newcomer.pk]), {"role": Role.APPROVER})
    newcomer = User.objects.get(pk=newcomer.pk)  # guardian caches permissions on the instance
    assert Membership.objects.get(project=roles.project, user=newcomer).role == Role.APPROVER
    assert user_has_project_permission(user=newcomer, project=roles.project, permission=ProjectPermission.APPROVE)
    assert not user_has_project_permission(user=newcomer, project=roles.project, permission=ProjectPermission.REQUEST)

    client.post(reverse("team:remove", args=[roles.project.pk, newcomer.pk]))
    newcomer = User.objects.get(pk=newcomer.pk)
    assert not Membership.objects.filter(project=roles.project, user=newcomer).exists()
    assert not user_has_project_permission(user=newcomer, project=roles.project, permission=ProjectPermission.VIEW)
    trail = AuditEvent.objects.filter(actor=actor, action__startswith="membership.").order_by("id")
    assert [(event.action, event.data.get("role")) for event in trail] == [
        ("membership.granted", "member"),
        ("membership.granted", "approver"),
        ("membership.revoked", None),
    ]


def _colleague_in(tenant) -> User:
    """Someone of the tenant: a member of another of its projects."""
    return factories.member(factories.project(tenant_obj=tenant))


def _add(client, project, identifier: str):
    return client.post(_team_url(project), {"identifier": identifier, "role": Role.MEMBER}, follow=True)


def test_a_lead_adds_no_one_from_outside_the_tenant_and_learns_nothing_about_who_exists(
    client, roles, mailbox, django_capture_on_commit_callbacks
):
    """Another tenant's username is refused exactly as a name no one has; another tenant's e-mail is invited exactly
    as an address no one has: the form neither confirms nor denies accounts outside the lead's tenant."""
    stranger = roles.other_developer
    stranger.email = "stranger@example.org"
    stranger.save(update_fields=["email"])
    client.force_login(roles.lead)

    by_name = client.post(_team_url(roles.project), {"identifier": stranger.username, "role": Role.MEMBER})
    by_unknown_name = client.post(_team_url(roles.project), {"identifier": "nobody-at-all", "role": Role.MEMBER})
    assert by_name.status_code == by_unknown_name.status_code == 422
    assert _field_error(by_name).replace(stranger.username, "?") == _field_error(by_unknown_name).replace(
        "nobody-at-all", "?"
    )

    with django_capture_on_commit_callbacks(execute=True):
        by_email = _add(client, roles.project, stranger.email)
        by_unknown_email = _add(client, roles.project, "no-account@example.org")
    assert _messages(by_email) == ["Invitation sent to stranger@example.org."]
    assert _messages(by_unknown_email) == ["Invitation sent to no-account@example.org."]
    assert not Membership.objects.filter(project=roles.project, user=stranger).exists()  # not without saying yes
    assert {mail["To"] for mail in mailbox.wait_for(2)} == {"stranger@example.org", "no-account@example.org"}


def _field_error(page) -> str:
    body = page.content.decode()
    start = body.index('id="id_identifier-error"')
    return body[start : body.index("</div>", start)]


def _messages(page) -> list[str]:
    return [str(message) for message in page.context["messages"]]


def test_a_lead_adds_a_person_of_the_tenant_at_once_by_username_or_e_mail(client, roles):
    colleague, other = _colleague_in(roles.project.tenant), _colleague_in(roles.project.tenant)
    client.force_login(roles.lead)

    assert _messages(_add(client, roles.project, colleague.username)) == [f"{colleague.username} is now member."]
    assert _messages(_add(client, roles.project, other.email.upper())) == [f"{other.username} is now member."]
    assert Membership.objects.filter(project=roles.project, user__in=[colleague, other]).count() == 2


def test_an_operator_adds_any_account_at_once(client, roles):
    client.force_login(roles.operator)
    assert _messages(_add(client, roles.project, roles.other_developer.username)) == [
        f"{roles.other_developer.username} is now member."
    ]


def test_someone_with_an_account_joins_by_accepting_signed_in(
    client, roles, mailbox, django_capture_on_commit_callbacks
):
    stranger = roles.other_developer
    client.force_login(roles.lead)
    with django_capture_on_commit_callbacks(execute=True):
        _add(client, roles.project, "stranger@example.org")
    path = _link_in(mailbox.wait_for(1)[0])

    client.logout()
    page = client.get(path).content.decode()
    assert 'id="invitation-sign-in"' in page and f"/accounts/login/?next={path}" in page.replace("%2F", "/")
    client.force_login(stranger)
    offer = client.get(path)
    assert offer.status_code == 200 and f"Join as {stranger.username}" in offer.content.decode()
    assert not Membership.objects.filter(project=roles.project, user=stranger).exists()  # a look is not a yes
    joined = client.post(path)

    assert joined.status_code == 302 and joined["Location"] == reverse("portal:catalog")
    assert Membership.objects.get(project=roles.project, user=stranger).role == Role.MEMBER
    assert Invitation.objects.get().accepted_by == stranger
    assert AuditEvent.objects.filter(action="invitation.accepted", actor=stranger).count() == 1
    assert client.post(path).status_code == 404  # once only


def test_refusals_appear_on_the_field_and_change_nothing(client, roles):
    client.force_login(roles.lead)
    url = _team_url(roles.project)
    page = client.post(url, {"identifier": "nobody-by-that-name", "role": Role.MEMBER})
    assert page.status_code == 422
    assert "give an e-mail address to invite someone else" in page.content.decode()
    assert 'id="id_identifier-error"' in page.content.decode()
    page = client.post(url, {"identifier": roles.developer.username, "role": Role.MEMBER})
    assert page.status_code == 422 and "already in" in page.content.decode()
    page = client.post(url, {"identifier": "x@example.org", "role": Role.LEAD})
    assert page.status_code == 422  # the lead role goes with the project's lead
    # The lead's own role cannot be changed or removed here: the page says why.
    response = client.post(reverse("team:remove", args=[roles.project.pk, roles.lead.pk]), follow=True)
    assert "appoint another lead first" in response.content.decode()
    assert Membership.objects.get(project=roles.project, user=roles.lead).role == Role.LEAD
    assert not Invitation.objects.exists()


def test_team_page_queries_do_not_grow_with_the_team(client, roles, django_assert_num_queries):
    client.force_login(roles.lead)
    url = _team_url(roles.project)
    client.get(url)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    for _ in range(15):
        factories.member(roles.project)
    for n in range(5):
        team.invitation_create(project=roles.project, email=f"guest{n}@example.org", role=Role.MEMBER, actor=roles.lead)
    with django_assert_num_queries(len(few.captured_queries)):
        assert client.get(url).status_code == 200


def _link_in(mail) -> str:
    return re.search(r"https://compute\.example\.org(/invitations/\S+/)", text_of(mail)).group(1)


def test_an_invitation_is_a_mail_with_a_one_time_link_that_creates_the_account_and_membership(
    client, roles, mailbox, django_capture_on_commit_callbacks
):
    client.force_login(roles.lead)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(_team_url(roles.project), {"identifier": "New.Person@Example.org", "role": "approver"})
    assert response.status_code == 302
    [mail] = mailbox.wait_for(1)
    assert mail["To"] == "new.person@example.org"
    assert mail["Subject"] == f"Join {roles.project.name} on Compute Catalog"
    path = _link_in(mail)
    assert f'href="https://compute.example.org{path}"' in html_of(mail)
    invitation = Invitation.objects.get()
    assert path.split("/")[2] not in (invitation.token_hash, invitation.token_prefix)  # only the hash is stored
    assert "new.person@example.org" in client.get(_team_url(roles.project)).content.decode()  # waiting, withdrawable

    client.logout()
    page = client.get(path)
    assert page.status_code == 200 and "new.person@example.org" in page.content.decode()
    weak = client.post(path, {"username": "newbie", "password": "123", "password_again": "123"})
    assert weak.status_code == 422 and not User.objects.filter(username="newbie").exists()
    taken = {
        "username": roles.developer.username,
        "password": "a-long-pass-phrase",
        "password_again": "a-long-pass-phrase",
    }
    assert client.post(path, taken).status_code == 422
    good = {**taken, "username": "newbie", "first_name": "New"}
    response = client.post(path, good)
    assert response.status_code == 302 and response["Location"] == reverse("portal:catalog")
    user = User.objects.get(username="newbie")
    assert user.email == "new.person@example.org" and user.check_password("a-long-pass-phrase")
    assert Membership.objects.get(project=roles.project, user=user).role == Role.APPROVER
    assert client.get(reverse("portal:project-list")).status_code == 200  # signed in as the new account
    assert AuditEvent.objects.filter(action="invitation.accepted", actor=user).count() == 1

    client.logout()
    again = client.get(path)  # once only
    assert again.status_code == 404 and 'id="invitation-invalid"' in again.content.decode()
    assert client.post(path, {**good, "username": "second"}).status_code == 404
    assert not User.objects.filter(username="second").exists()


def test_an_expired_withdrawn_or_resent_link_no_longer_works(
    client, roles, mailbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        invitation = team.invitation_create(
            project=roles.project, email="late@example.org", role="member", actor=roles.lead
        )
    first = _link_in(mailbox.wait_for(1)[0])
    assert team.invitation_send(invitation_id=invitation.pk) == 1  # sent again: a new link replaces the old one
    second = _link_in(mailbox.wait_for(2)[1])
    assert first != second
    assert client.get(first).status_code == 404 and client.get(second).status_code == 200
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    assert client.get(second).status_code == 404
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() + timedelta(days=1))
    client.force_login(roles.lead)
    client.post(reverse("team:revoke", args=[roles.project.pk, invitation.pk]))
    client.logout()
    assert client.get(second).status_code == 404
    assert AuditEvent.objects.filter(action="invitation.revoked", actor=roles.lead).count() == 1
    assert team.invitation_send(invitation_id=invitation.pk) == 0  # a withdrawn invitation is not sent
