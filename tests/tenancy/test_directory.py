"""Company sign-in against real parts: OIDC through oidc-provider-mock (devcluster/oidc_provider.py) and LDAP through
Debian's slapd (devcluster/ldap_directory.py); group mappings applied at sign-in and by the sync; what removal does."""

import base64
import hashlib
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from requests import services as request_services
from requests.choices import RequestState
from requests.models import ApprovalAssignment
from tenancy.choices import GroupGrant, Role
from tenancy.directory import sync
from tenancy.models import AuditEvent, DirectoryAccount, DirectoryGrant, GroupMapping, Membership, User
from tenancy.operators import OPERATOR_GROUP
from tests import factories
from tests.requests.conftest import approval_rule, approver_stage, make_order, shop  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db
PROJECTS = "/api/v1/projects/"


def mapping(group, grant, *, project=None, tenant=None, written_by=None) -> GroupMapping:
    return GroupMapping.objects.create(
        group=group, grant=grant, project=project, tenant=tenant, written_by=written_by or factories.operator()
    )


def oidc_sign_in(client, idp, sub: str, *, next_path: str | None = None):
    """The browser's part of the authorization code flow, with Django's test client for our site and httpx for the
    IdP's page (where the person says who they are). The response of our callback (to `next_path` when given)."""
    start = client.get("/oidc/authenticate/", {"next": next_path} if next_path else {})
    assert start.status_code == 302
    authorize = start["Location"]
    assert authorize.startswith(idp.url)
    consent = httpx.post(authorize, data={"sub": sub}, follow_redirects=False)
    assert consent.status_code == 302, consent.text
    callback = urlparse(consent.headers["location"])
    return client.get(f"{callback.path}?{callback.query}")


@pytest.fixture
def research(db):
    return factories.project(slug="research", name="Research")


def test_oidc_sign_in_uses_pkce_creates_the_user_from_claims_and_applies_their_groups(client, idp, research):
    mapping("research", GroupGrant.PROJECT_MEMBER, project=research)

    start = client.get("/oidc/authenticate/")
    asked = parse_qs(urlparse(start["Location"]).query)
    [state] = asked["state"]
    verifier = client.session["oidc_states"][state]["code_verifier"]
    expected = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert (asked["code_challenge_method"], asked["code_challenge"]) == (["S256"], [expected])
    assert asked["nonce"] and asked["scope"] == ["openid email profile"]

    landed = oidc_sign_in(client, idp, "alice")

    assert landed.status_code == 302 and landed["Location"] == "/"
    alice = User.objects.get(username="alice")
    assert (alice.email, alice.first_name, alice.last_name) == ("alice@example.org", "Alice", "Archer")
    assert not alice.has_usable_password()
    account = DirectoryAccount.objects.get(user=alice)
    assert (account.source, account.subject, account.groups) == ("oidc", "alice", ["ml-engineers", "research"])
    assert Membership.objects.get(user=alice, project=research).role == Role.MEMBER
    signed_in = AuditEvent.objects.get(action="sign_in.succeeded")
    assert signed_in.data == {"method": "oidc", "address": "127.0.0.1", "via": "portal"}
    assert client.get("/").status_code == 200


def test_claims_are_refreshed_at_each_sign_in(client, idp, research):
    oidc_sign_in(client, idp, "alice")
    idp.set_person("alice", {**idp_person("alice"), "family_name": "Archer-Smith", "email": "a.smith@example.org"})
    client.logout()

    oidc_sign_in(client, idp, "alice")

    alice = User.objects.get(username="alice")
    assert (alice.last_name, alice.email) == ("Archer-Smith", "a.smith@example.org")
    assert User.objects.filter(username__startswith="alice").count() == 1


def idp_person(sub):
    from devcluster.oidc_provider import PEOPLE

    return dict(PEOPLE[sub])


def test_signing_out_ends_the_idp_session_too(client, idp):
    oidc_sign_in(client, idp, "bob")
    id_token = client.session["oidc_id_token"]

    out = client.post("/accounts/logout/")

    assert out.status_code == 302
    leaving = urlparse(out["Location"])
    assert f"{leaving.scheme}://{leaving.netloc}{leaving.path}" == f"{idp.url}/oauth2/end_session"
    query = parse_qs(leaving.query)
    assert query["id_token_hint"] == [id_token]
    assert query["post_logout_redirect_uri"] == ["http://testserver/accounts/login/"]
    assert client.get("/").status_code == 302  # signed out here


def test_a_forged_or_foreign_id_token_signs_nobody_in(client, idp, settings):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    settings.OIDC_RP_IDP_SIGN_KEY = other.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()

    refused = oidc_sign_in(client, idp, "alice")

    assert refused.status_code == 302 and refused["Location"] == "/accounts/login/"
    assert not User.objects.filter(username="alice").exists()
    page = client.get("/accounts/login/").content.decode()
    assert "Signing in with Example SSO did not work: The IdP&#x27;s ID token did not verify" in page
    assert AuditEvent.objects.get(action="sign_in.failed").data["method"] == "oidc"


def test_ldap_sign_in_binds_finds_nested_groups_and_applies_them(client, directory, research):
    mapping("ml-engineers", GroupGrant.PROJECT_APPROVER, project=research)
    mapping("research", GroupGrant.TENANT_MEMBER, tenant=research.tenant)

    signed_in = client.post("/accounts/login/", {"username": "alice", "password": "directory-password-1"})

    assert signed_in.status_code == 302
    alice = User.objects.get(username="alice")
    assert (alice.email, alice.first_name) == ("alice@example.org", "Alice")
    account = DirectoryAccount.objects.get(user=alice)
    assert account.source == "ldap" and account.subject == "uid=alice,ou=people,dc=example,dc=org"
    assert {"ml-engineers", "research"} <= set(account.groups)  # research only through ml-engineers: nested
    assert Membership.objects.get(user=alice, project=research).role == Role.APPROVER
    assert research.tenant.people.filter(pk=alice.pk).exists()
    assert AuditEvent.objects.get(action="sign_in.succeeded").data["method"] == "ldap"


def test_a_wrong_directory_password_is_refused_and_audited(client, directory):
    refused = client.post("/accounts/login/", {"username": "alice", "password": "wrong"})

    assert refused.status_code == 200 and "did not match" in refused.content.decode()
    failed = AuditEvent.objects.get(action="sign_in.failed")
    assert (failed.data["username"], failed.data["method"], failed.target_repr) == ("alice", "password", "")


def test_local_passwords_switched_off_leave_only_the_break_glass_accounts(client, settings):
    settings.LOCAL_PASSWORD_SIGN_IN, settings.LOCAL_PASSWORD_ACCOUNTS = False, ["admin"]
    developer = factories.UserFactory()
    admin = factories.UserFactory(username="admin", is_staff=True, is_superuser=True)

    page = client.get("/accounts/login/").content.decode()
    assert 'id="break-glass"' in page
    refused = client.post("/accounts/login/", {"username": developer.username, "password": factories.PASSWORD})
    assert refused.status_code == 200
    allowed = client.post("/accounts/login/", {"username": admin.username, "password": factories.PASSWORD})
    assert allowed.status_code == 302


def test_an_operator_rule_applies_only_when_an_operator_wrote_it(directory, research):
    lead = research.lead
    written_by_lead = mapping("platform-ops", GroupGrant.OPERATOR, written_by=lead)
    dave = factories.UserFactory(username="dave")
    DirectoryAccount.objects.create(user=dave, source="ldap", subject="uid=dave,ou=people,dc=example,dc=org")

    sync.directory_sync()
    dave.refresh_from_db()
    assert not dave.is_staff and not dave.groups.filter(name=OPERATOR_GROUP).exists()

    written_by_lead.written_by = factories.operator()
    written_by_lead.save()
    sync.directory_sync()
    dave.refresh_from_db()
    assert dave.is_staff and dave.groups.filter(name=OPERATOR_GROUP).exists()
    assert DirectoryGrant.objects.filter(user=dave, grant=GroupGrant.OPERATOR).exists()


def ldap_signed_in(client, uid: str) -> User:
    assert client.post("/accounts/login/", {"username": uid, "password": "directory-password-1"}).status_code == 302
    client.logout()
    return User.objects.get(username=uid)


def test_removed_from_the_group_the_sync_takes_rights_tokens_and_approvals_away_and_tells_the_lead(
    client,
    api,
    directory,
    research,
    shop,  # noqa: F811 (the fixture)
    mailbox,
    django_capture_on_commit_callbacks,
):
    research.lead.email = "lead@example.org"
    research.lead.save()
    mapping("research", GroupGrant.PROJECT_MEMBER, project=research)
    mapping("research-approvers", GroupGrant.PROJECT_APPROVER, project=research)
    alice, carol = ldap_signed_in(client, "alice"), ldap_signed_in(client, "carol")
    standing_approver = factories.member(research, Role.APPROVER)
    approval_rule(approver_stage())
    pending = request_services.request_submit(order=make_order(shop, research), requester=alice)
    assert pending.state == RequestState.PENDING_APPROVAL
    assert set(ApprovalAssignment.objects.values_list("approver__username", flat=True)) == {
        carol.username,
        standing_approver.username,
    }
    secret = factories.token_for(alice)
    api.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert api.get(PROJECTS).json()["count"] == 1

    directory.set_members("ml-engineers", [])  # alice was in research only through ml-engineers
    directory.set_members("research-approvers", [])
    with django_capture_on_commit_callbacks(execute=True):  # the leads' mails are sent after commit
        report = sync.directory_sync()

    assert report.removed == 2 and not report.unavailable
    assert not Membership.objects.filter(project=research, user__in=[alice, carol]).exists()
    assert api.get(PROJECTS).status_code == 401  # her token was revoked
    pending.refresh_from_db()
    assert pending.state == RequestState.PENDING_APPROVAL and pending.project == research  # the work stays
    assert list(ApprovalAssignment.objects.values_list("approver__username", flat=True)) == [standing_approver.username]
    assert pending.events.filter(code="approval_routed", data__removed=carol.username).exists()
    removed = AuditEvent.objects.filter(action="directory.removed").order_by("id")
    assert [event.data["user"] for event in removed] == ["alice", "carol"]
    assert all(event.data["trigger"] == "sync" for event in removed)
    mails = mailbox.wait_for(2)
    assert {mail["Subject"] for mail in mails} == {"alice left Research", "carol left Research"}
    alice_mail = next(mail for mail in mails if mail["Subject"] == "alice left Research")
    assert f"#{pending.pk}" in alice_mail.get_body(("plain",)).get_content()


def test_the_sync_never_takes_manual_rights_and_waits_out_a_directory_outage(client, directory, research, settings):
    mapping("research", GroupGrant.PROJECT_MEMBER, project=research)
    bob = ldap_signed_in(client, "bob")
    manual = factories.UserFactory(username="carol")
    factories.member(research, user=manual)  # added by hand before carol ever signed in
    DirectoryAccount.objects.create(user=manual, source="ldap", subject="uid=carol,ou=people,dc=example,dc=org")
    directory.set_members("research", ["carol"])

    sync.directory_sync()
    assert not Membership.objects.filter(project=research, user=bob).exists()
    assert Membership.objects.filter(project=research, user=manual).exists()  # carol's place is manual
    assert not DirectoryGrant.objects.filter(user=manual).exists()

    directory.set_members("research", ["bob"])
    settings.AUTH_LDAP_SERVER_URI = "ldap://127.0.0.1:9"  # nothing answers there
    report = sync.directory_sync()
    assert report.unavailable and report.removed == 0 and report.granted == 0
    assert Membership.objects.filter(project=research, user=manual).exists()
    assert AuditEvent.objects.filter(action="directory.sync_incomplete").exists()


def test_the_sync_asks_the_idp_for_current_groups_and_a_grant_it_ended_takes_the_rights(client, idp, research):
    mapping("research", GroupGrant.PROJECT_MEMBER, project=research)
    mapping("ml-engineers", GroupGrant.PROJECT_LEAD, project=factories.project(slug="ml"))
    oidc_sign_in(client, idp, "alice")
    alice = User.objects.get(username="alice")
    assert Membership.objects.filter(user=alice).count() == 2

    idp.set_person("alice", {**idp_person("alice"), "groups": ["research"]})
    sync.directory_sync()
    assert list(Membership.objects.filter(user=alice).values_list("project__slug", flat=True)) == ["research"]

    idp.end_grants("alice")  # she left: the IdP refuses her refresh token
    report = sync.directory_sync()
    assert report.gone == ["alice"] and not Membership.objects.filter(user=alice).exists()


def test_invitations_create_no_local_account_when_local_passwords_are_off(client, roles, settings):
    from tenancy import team
    from tenancy.models import Invitation

    invitation = team.invitation_create(project=roles.project, email="new@example.org", role="member", actor=roles.lead)
    team.invitation_send(invitation_id=invitation.pk)
    invitation.refresh_from_db()
    settings.LOCAL_PASSWORD_SIGN_IN = False
    from config.tokens import prefixed_secret_new, secret_hash

    prefix, secret = prefixed_secret_new(team.INVITATION_SECRET_KIND)
    Invitation.objects.filter(pk=invitation.pk).update(token_prefix=prefix, token_hash=secret_hash(secret))

    page = client.get(f"/invitations/{secret}/")
    assert page.status_code == 200 and "Sign in</a> with your company account" in page.content.decode()
    assert "Create my account" not in page.content.decode()
    posted = client.post(
        f"/invitations/{secret}/", {"username": "new", "password": "x" * 12, "password_again": "x" * 12}
    )
    assert posted.status_code == 403 and not User.objects.filter(username="new").exists()


@pytest.mark.parametrize("where", ["team page", "request page", "project api", "approvals"])
def test_role_matrix_a_person_removed_from_the_group_reaches_nothing_of_the_project(
    client,
    api,
    roles,
    shop,  # noqa: F811 (the fixture)
    where,
):
    from tenancy.directory.rights import directory_rights_apply

    GroupMapping.objects.create(
        group="research", grant=GroupGrant.PROJECT_APPROVER, project=roles.project, written_by=roles.operator
    )
    person = factories.UserFactory()
    directory_rights_apply(user=person, groups=["research"], trigger="sign_in")
    approval_rule(approver_stage())
    order = request_services.request_submit(order=make_order(shop, roles.project), requester=roles.developer)
    directory_rights_apply(user=person, groups=[], trigger="sync")  # taken out of research
    client.force_login(person)
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token_for(person)}")  # a token issued after the removal

    if where == "team page":
        assert client.get(f"/projects/{roles.project.pk}/team/").status_code == 404
    elif where == "request page":
        assert client.get(f"/requests/{order.pk}/").status_code == 404
    elif where == "project api":
        assert api.get(f"/api/v1/projects/{roles.project.pk}/").status_code == 404
        assert api.get("/api/v1/projects/").json()["count"] == 0
    else:
        assert api.get("/api/v1/approvals/").json()["count"] == 0
        assert not ApprovalAssignment.objects.filter(approver=person).exists()


def test_a_callback_without_a_sign_in_of_this_browser_changes_nothing(client, idp):
    forged = client.get("/oidc/callback/", {"code": "stolen", "state": "not-ours"})
    assert forged.status_code in (302, 400)  # no sign-in of this session: refused before any call to the IdP
    client.get("/oidc/authenticate/")
    replayed = client.get("/oidc/callback/", {"code": "stolen", "state": "not-ours"})
    assert replayed.status_code == 400  # a state this session never sent
    assert not User.objects.exclude(pk__in=[]).filter(username="alice").exists()
    assert client.get("/").status_code == 302


def test_company_sign_in_is_off_without_a_client_id(client):
    assert client.get("/oidc/authenticate/").status_code == 404
    assert "company-sign-in" not in client.get("/accounts/login/").content.decode()


def test_an_idp_whose_tokens_name_no_key_needs_its_key_given(client, idp, settings):
    settings.OIDC_RP_IDP_SIGN_KEY = None  # oidc-provider-mock's ID tokens carry no `kid`

    refused = oidc_sign_in(client, idp, "alice")

    assert refused["Location"] == "/accounts/login/"
    assert "names no key; set OIDC_IDP_SIGN_KEY_FILE" in client.get("/accounts/login/").content.decode()
    assert not User.objects.filter(username="alice").exists()


def test_the_accountable_lead_keeps_the_project_until_an_operator_appoints_another(research):
    from tenancy.directory.rights import directory_rights_apply
    from tenancy.services import project_update

    mapping("research", GroupGrant.PROJECT_MEMBER, project=research)
    person = factories.UserFactory()
    directory_rights_apply(user=person, groups=["research"], trigger="sign_in")
    project_update(project=research, actor=None, lead=person)

    change = directory_rights_apply(user=person, groups=[], trigger="sync")

    assert change.kept_as_lead == ["research"]
    assert Membership.objects.get(user=person, project=research).role == Role.LEAD
    kept = AuditEvent.objects.get(action="directory.kept_lead")
    assert "appoint another lead" in kept.reason
