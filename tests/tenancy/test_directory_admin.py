"""The operator console for company sign-in: group mappings (audited, their author recorded, previewed without
applying), directory accounts and grants, service accounts, the audit log's kinds; constant query counts."""

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

from tenancy.choices import GroupGrant
from tenancy.directory.rights import directory_rights_apply
from tenancy.models import AuditEvent, DirectoryAccount, DirectoryGrant, GroupMapping, Membership
from tests import factories

pytestmark = pytest.mark.django_db
MAPPINGS = "/admin/tenancy/groupmapping/"


def seen_in(username, groups):
    person = factories.UserFactory(username=username)
    DirectoryAccount.objects.create(user=person, source="oidc", subject=username, groups=groups)
    return person


def test_an_operator_writes_a_mapping_audited_and_previews_it_without_applying(console, operator, roles):
    alice, bob = seen_in("alice", ["research"]), seen_in("bob", ["sales"])

    added = console.post(
        f"{MAPPINGS}add/",
        {"group": "research", "grant": GroupGrant.PROJECT_APPROVER, "project": roles.project.pk, "active": ""},
    )
    assert added.status_code == 302
    mapping = GroupMapping.objects.get()
    assert mapping.written_by == operator and not mapping.active
    assert AuditEvent.objects.get(action="groupmapping.created").actor == operator

    preview = console.post(MAPPINGS, {"action": "preview_mappings", ACTION_CHECKBOX_NAME: [mapping.pk]})

    page = preview.content.decode()
    assert 'data-user="alice" data-state="new"' in page and 'data-user="bob"' not in page
    assert not Membership.objects.filter(user=alice).exists()  # nothing applied
    assert not DirectoryGrant.objects.exists()
    assert bob.pk


def test_an_operator_rule_left_by_someone_no_longer_an_operator_shows_as_blocked(console, roles):
    former = factories.operator()
    mapping = GroupMapping.objects.create(group="ops", grant=GroupGrant.OPERATOR, written_by=former)
    former.is_staff = False
    former.save()
    seen_in("dave", ["ops"])

    page = console.get(f"{MAPPINGS}{mapping.pk}/change/").content.decode()

    assert 'data-user="dave" data-state="blocked"' in page
    assert "applies only while its author is an operator" in page


def test_developers_never_reach_the_mappings(client, roles):
    client.force_login(roles.lead)
    assert client.get(MAPPINGS).status_code == 302


def test_the_console_lists_what_the_directory_gave_apart_from_manual_places(
    console, roles, django_assert_max_num_queries
):
    GroupMapping.objects.create(
        group="research", grant=GroupGrant.PROJECT_MEMBER, project=roles.project, written_by=roles.operator
    )
    for n in range(3):
        directory_rights_apply(user=seen_in(f"person{n}", ["research"]), groups=["research"], trigger="sync")

    with django_assert_max_num_queries(15) as few:
        listing = console.get("/admin/tenancy/membership/")
    page = listing.content.decode()
    assert page.count("by directory group") == 3 and "by hand" in page
    for n in range(3, 8):
        directory_rights_apply(user=seen_in(f"person{n}", ["research"]), groups=["research"], trigger="sync")
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert console.get("/admin/tenancy/membership/").status_code == 200
    person = DirectoryAccount.objects.get(subject="person0").user
    assert "Project member of" in console.get(f"/admin/tenancy/user/{person.pk}/change/").content.decode()


def test_the_audit_log_filters_sign_ins_directory_changes_and_tokens(console, roles):
    GroupMapping.objects.create(
        group="research", grant=GroupGrant.PROJECT_MEMBER, project=roles.project, written_by=roles.operator
    )
    directory_rights_apply(user=seen_in("alice", ["research"]), groups=["research"], trigger="sync")
    factories.token_for(roles.developer)

    directory = console.get("/admin/tenancy/auditevent/?kind=directory").content.decode()
    tokens = console.get("/admin/tenancy/auditevent/?kind=token").content.decode()

    row = 'class="field-action">{}<'.format
    assert row("directory.granted") in directory and row("api_token.issued") not in directory
    assert row("api_token.issued") in tokens and row("directory.granted") not in tokens


def test_the_sso_demo_seeds_mappings_an_operator_wrote():
    from django.core.management import call_command

    call_command("seed_demo", "--force", "--sso")
    call_command("seed_demo", "--force", "--sso")  # idempotent

    mappings = GroupMapping.objects.select_related("written_by")
    assert mappings.count() == 5 and {mapping.written_by.username for mapping in mappings} == {"operator"}
    from tenancy.directory.rights import mapping_applies

    assert all(mapping_applies(mapping) for mapping in mappings)


def test_the_sync_is_a_schedule_every_directory_sync_minutes(settings):
    from django_q.models import Schedule

    schedule = Schedule.objects.get(func="tenancy.tasks.sync_directory")
    assert (schedule.schedule_type, schedule.minutes, schedule.repeats) == (
        Schedule.MINUTES,
        settings.DIRECTORY_SYNC_MINUTES,
        -1,
    )


@pytest.mark.parametrize("page", ["groupmapping", "directoryaccount", "serviceaccount", "apitoken"])
def test_the_new_changelists_read_a_constant_number_of_queries(console, roles, page, django_assert_max_num_queries):
    from tenancy import service_accounts

    def add(n):
        person = seen_in(f"p{page}{n}", ["research"])
        GroupMapping.objects.create(
            group=f"g{n}", grant=GroupGrant.PROJECT_MEMBER, project=roles.project, written_by=roles.operator
        )
        account = service_accounts.service_account_create(
            project=roles.project, name=f"ci-{n}", description="", actor=roles.lead
        )
        factories.token_for(account.user, scopes=["catalog:read"], project=roles.project)
        factories.token_for(person)

    add(0)
    with django_assert_max_num_queries(20) as few:
        assert console.get(f"/admin/tenancy/{page}/").status_code == 200
    for n in range(1, 6):
        add(n)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert console.get(f"/admin/tenancy/{page}/").status_code == 200
