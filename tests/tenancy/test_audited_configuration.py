"""Configuration that operators edit in the console is audited however it changes: added or edited on its page,
deleted on its delete page or in bulk with "delete selected", or changed as an inline row; quota edits need a
reason. Only operators reach these pages."""

from decimal import Decimal

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.contenttypes.models import ContentType

from catalog.models import SliceProfile, Vendor
from requests.choices import ApprovalSubject, ApproverSource
from requests.models import ApprovalPolicy, ApprovalRule, ApprovalRuleStage
from scheduling.choices import HealthAction, HealthSource
from scheduling.models import HealthRule, PreemptionRule
from tenancy.choices import QuotaDimension
from tenancy.models import AuditEvent, ProjectQuota
from tests import factories
from tests.admin_pages import as_posted, changelist_as_posted

pytestmark = pytest.mark.django_db


def health_rule() -> HealthRule:
    return HealthRule.objects.create(
        name=f"XID 79 isolates ({HealthRule.objects.count()})",
        source=HealthSource.DCGM,
        signal="XID",
        threshold="79",
        action=HealthAction.ISOLATE,
    )


def approval_rule() -> ApprovalRule:
    policy = ApprovalPolicy.objects.create(
        name=f"Policy {ApprovalPolicy.objects.count()}", subject=ApprovalSubject.RESOURCE_REQUEST
    )
    return ApprovalRule.objects.create(policy=policy, name="Big orders", min_accelerator_count=8)


def approval_stage() -> ApprovalRuleStage:
    return ApprovalRuleStage.objects.create(
        rule=approval_rule(), order=1, name="Project lead", source=ApproverSource.PROJECT_ROLE, project_role="lead"
    )


def vendor() -> Vendor:
    return Vendor.objects.create(name=f"Vendor {Vendor.objects.count()}", slug=f"vendor-{Vendor.objects.count()}")


# Configuration operators may delete, with a row nothing else depends on. Catalog rows are retired, never
# deleted (operators hold no delete permission there), so only their adds and edits are audited here.
CONFIGURATION = {
    "scheduling.healthrule": health_rule,
    "scheduling.preemptionrule": lambda: PreemptionRule.objects.order_by("pk").first(),
    "requests.approvalpolicy": lambda: approval_rule().policy,
    "requests.approvalrule": approval_rule,
}


def _url(row, view: str) -> str:
    return f"/admin/{row._meta.app_label}/{row._meta.model_name}/{row.pk}/{view}/"


def _audit_rows(row, action: str):
    target_type = ContentType.objects.get_for_model(row)
    return AuditEvent.objects.filter(target_type=target_type, target_id=str(row.pk), action=action)


@pytest.mark.parametrize("label", CONFIGURATION)
def test_deleting_a_configuration_row_on_its_delete_page_is_audited(console, operator, label):
    row = CONFIGURATION[label]()

    response = console.post(_url(row, "delete"), {"post": "yes"})

    assert response.status_code == 302, response.content
    assert not type(row).objects.filter(pk=row.pk).exists()
    event = _audit_rows(row, f"{row._meta.model_name}.deleted").get()
    assert (event.actor, event.target_repr) == (operator, str(row))


@pytest.mark.parametrize("label", CONFIGURATION)
def test_bulk_delete_selected_writes_one_audit_row_per_deleted_row(console, label):
    rows = [CONFIGURATION[label](), CONFIGURATION[label]()]
    if label == "scheduling.preemptionrule":
        rows = list(PreemptionRule.objects.order_by("pk")[:2])
    model = type(rows[0])

    response = console.post(
        f"/admin/{model._meta.app_label}/{model._meta.model_name}/",
        {"action": "delete_selected", ACTION_CHECKBOX_NAME: [row.pk for row in rows], "post": "yes"},
    )

    assert response.status_code == 302, response.content
    assert not model.objects.filter(pk__in=[row.pk for row in rows]).exists()
    for row in rows:
        assert _audit_rows(row, f"{model._meta.model_name}.deleted").count() == 1


def test_adding_and_editing_a_health_rule_are_audited(console, operator):
    form = {
        "name": "Hot card degrades",
        "source": HealthSource.DCGM,
        "signal": "DCGM_FI_DEV_GPU_TEMP",
        "comparison": "gt",
        "threshold": "90",
        "action": HealthAction.DEGRADE,
        "recover_after_minutes": "10",
        "active": "on",
    }
    assert console.post("/admin/scheduling/healthrule/add/", form).status_code == 302
    rule = HealthRule.objects.get(name="Hot card degrades")

    assert console.post(_url(rule, "change"), {**form, "threshold": "95"}).status_code == 302

    assert _audit_rows(rule, "healthrule.created").get().actor == operator
    assert _audit_rows(rule, "healthrule.updated").get().data == {"fields": ["threshold"]}


def test_editing_an_approval_stage_inline_on_its_rule_is_audited(console, operator):
    stage = approval_stage()
    url = _url(stage.rule, "change")
    data = as_posted(console.get(url))

    response = console.post(url, {**data, "stages-0-name": "Project lead sign-off"})

    assert response.status_code == 302, response.context and response.context["errors"]
    assert ApprovalRuleStage.objects.get(pk=stage.pk).name == "Project lead sign-off"
    event = _audit_rows(stage, "approvalrulestage.updated").get()
    assert (event.actor, event.data) == (operator, {"fields": ["name"]})
    assert not _audit_rows(stage.rule, "approvalrule.updated").exists()  # the rule itself did not change


def test_adding_and_deleting_inline_rules_on_a_policy_are_audited(console):
    kept, dropped = approval_rule(), None
    dropped = ApprovalRule.objects.create(policy=kept.policy, order=200, name="Small orders")
    url = _url(kept.policy, "change")
    data = as_posted(console.get(url))
    index = [data[f"rules-{i}-id"] for i in range(2)].index(dropped.pk)
    data.update({f"rules-{index}-DELETE": "on", "rules-TOTAL_FORMS": 3, "rules-2-order": 300, "rules-2-name": "New"})
    data["rules-2-policy"] = kept.policy.pk

    response = console.post(url, data)

    assert response.status_code == 302, response.context and response.context["errors"]
    assert _audit_rows(dropped, "approvalrule.deleted").count() == 1
    added = ApprovalRule.objects.get(policy=kept.policy, name="New")
    assert _audit_rows(added, "approvalrule.created").count() == 1


def test_adding_and_editing_a_vendor_are_audited(console, operator):
    form = {"name": "Tenstorrent", "slug": "tenstorrent", "software_stack": "none"}
    assert console.post("/admin/catalog/vendor/add/", form).status_code == 302
    added = Vendor.objects.get(slug="tenstorrent")

    response = console.post(_url(added, "change"), {**form, "software_stack": "cuda"})

    assert response.status_code == 302, response.content
    assert _audit_rows(added, "vendor.created").get().actor == operator
    assert _audit_rows(added, "vendor.updated").get().data == {"fields": ["software_stack"]}


def test_editing_a_slice_profile_on_its_own_page_is_audited(console, operator):
    profile = factories.SliceProfileFactory()
    data = as_posted(console.get(_url(profile, "change")))

    response = console.post(_url(profile, "change"), {**data, "memory_gb": "20"})

    assert response.status_code == 302, response.context and response.context["errors"]
    assert _audit_rows(profile, "sliceprofile.updated").get().data == {"fields": ["memory_gb"]}


def test_adding_a_slice_profile_inline_on_its_model_is_audited(console):
    model = factories.AcceleratorModelFactory()
    url = _url(model, "change")
    data = as_posted(console.get(url))
    prefix = "slice_profiles"
    data.update(
        {
            f"{prefix}-TOTAL_FORMS": 1,
            f"{prefix}-0-name": "3g.40gb",
            f"{prefix}-0-kind": "mig",
            f"{prefix}-0-compute_fraction": "0.4286",
            f"{prefix}-0-memory_gb": "40",
            f"{prefix}-0-max_per_device": "2",
            f"{prefix}-0-accelerator": model.pk,
        }
    )

    response = console.post(url, data)

    assert response.status_code == 302, response.context and response.context["errors"]
    assert _audit_rows(SliceProfile.objects.get(accelerator=model), "sliceprofile.created").count() == 1


def test_operators_retire_catalog_rows_rather_than_delete_them(console):
    row = vendor()

    assert console.post(_url(row, "delete"), {"post": "yes"}).status_code == 403
    assert Vendor.objects.filter(pk=row.pk).exists()


# --- Quotas: a reason for every edit --------------------------------------------------------------------------

QUOTA_FORM = {
    "max_priority": "standard",
    **{dimension: "" for dimension in QuotaDimension.values},
}


def test_a_quota_edit_without_a_reason_is_a_form_error_and_changes_nothing(console, roles):
    quota = roles.project.quota

    response = console.post(_url(quota, "change"), {**QUOTA_FORM, "gpus": "8", "reason": "  "})

    assert response.status_code == 200
    assert "Give a reason for this quota change" in response.content.decode()
    assert ProjectQuota.objects.get(pk=quota.pk).gpus is None
    assert not AuditEvent.objects.filter(action="quota.changed").exists()


def test_a_quota_edit_on_the_projects_page_needs_a_reason_too(console, roles):
    url = _url(roles.project, "change")
    data = as_posted(console.get(url))

    refused = console.post(url, {**data, "quota-0-gpus": "8"})
    accepted = console.post(url, {**data, "quota-0-gpus": "8", "quota-0-reason": "Second node racked"})

    assert refused.status_code == 200 and "Give a reason for this quota change" in refused.content.decode()
    assert accepted.status_code == 302, accepted.context and accepted.context["errors"]
    assert ProjectQuota.objects.get(project=roles.project).gpus == Decimal("8")
    assert AuditEvent.objects.get(action="quota.changed").reason == "Second node racked"


def test_a_tenant_cap_edit_records_its_reason(console, roles):
    url = _url(roles.project.tenant, "change")
    data = as_posted(console.get(url))
    data.update({"quota-TOTAL_FORMS": 1, "quota-0-gpus": "16", "quota-0-reason": "Contract signed"})

    response = console.post(url, data)

    assert response.status_code == 302, response.context and response.context["errors"]
    assert AuditEvent.objects.get(action="quota.changed").reason == "Contract signed"


# --- Who reaches these pages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["anonymous", "developer", "approver", "lead"])
@pytest.mark.parametrize("label", CONFIGURATION)
def test_nobody_but_operators_may_delete_configuration(client, roles, who, label):
    row = CONFIGURATION[label]()
    if who != "anonymous":
        client.force_login(getattr(roles, who))

    response = client.post(_url(row, "delete"), {"post": "yes"})

    assert response.status_code == 302 and response.url.startswith("/admin/login/")
    assert type(row).objects.filter(pk=row.pk).exists()
    assert not AuditEvent.objects.filter(action__endswith=".deleted").exists()


@pytest.mark.parametrize("who", ["developer", "approver", "lead"])
def test_nobody_but_operators_may_edit_an_approval_stage(client, roles, who):
    stage = approval_stage()
    client.force_login(getattr(roles, who))

    response = client.get(_url(stage.rule, "change"))

    assert response.status_code == 302 and response.url.startswith("/admin/login/")


def test_editing_rules_in_the_changelist_columns_is_audited(console, operator):
    rule = PreemptionRule.objects.order_by("pk").first()
    page = console.get("/admin/scheduling/preemptionrule/")
    data = changelist_as_posted(page)
    index = next(i for i, form in enumerate(page.context["cl"].formset.forms) if form.instance.pk == rule.pk)
    data[f"form-{index}-grace_period_seconds"] = rule.grace_period_seconds + 60

    response = console.post("/admin/scheduling/preemptionrule/", {**data, "_save": "Save"})

    assert response.status_code == 302, response.context and response.context["cl"].formset.errors
    event = _audit_rows(rule, "preemptionrule.updated").get()
    assert (event.actor, event.data) == (operator, {"fields": ["grace_period_seconds"]})
    assert AuditEvent.objects.filter(action="preemptionrule.updated").count() == 1  # untouched rows: no rows
