"""Change counters (config/versions.py): every way of writing a counted table moves its counter, to a value never
used before, and what a process keeps is built again when, and only when, it moved."""

import pytest
from django.db import connection, transaction

from catalog.models import ResourceSpec, Service
from config.versions import KeptPerProcess, version
from tests import factories

pytestmark = pytest.mark.django_db


def _moves(write) -> bool:
    before = version("catalog")
    write()
    return version("catalog") != before


def _raw_update(spec) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {ResourceSpec._meta.db_table} SET description = 'raw' WHERE id = %s", [spec.pk])


def test_every_way_of_writing_a_catalog_table_moves_its_counter():
    spec = factories.ResourceSpecFactory()
    service = factories.ServiceFactory(specs=[])
    another = Service(slug="another", name="Another", kind="compute", default_duration_hours=1, max_duration_hours=1)
    writes = {
        "save": spec.save,
        "queryset update": lambda: ResourceSpec.objects.filter(pk=spec.pk).update(description="x"),
        "m2m add": lambda: service.specs.add(spec),
        "m2m clear": service.specs.clear,
        "bulk create": lambda: Service.objects.bulk_create([another]),
        "raw SQL": lambda: _raw_update(spec),
        "delete": lambda: Service.objects.filter(slug="another").delete(),
    }
    assert [name for name, write in writes.items() if not _moves(write)] == []
    assert not _moves(factories.project)  # another app's tables leave the catalog's counter alone


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_rolled_back_change_never_leaves_a_value_a_later_change_reuses():
    spec = factories.ResourceSpecFactory()
    before = version("catalog")
    with pytest.raises(RuntimeError), transaction.atomic():
        ResourceSpec.objects.filter(pk=spec.pk).update(description="never committed")
        inside = version("catalog")  # what a process building inside this transaction would keep its build under
        raise RuntimeError
    assert version("catalog") == before
    ResourceSpec.objects.filter(pk=spec.pk).update(description="committed")
    assert version("catalog") not in (before, inside)


def test_a_kept_value_is_built_again_only_when_its_counter_moved(django_assert_num_queries):
    builds = []
    kept = KeptPerProcess("catalog", lambda: builds.append(1) or len(builds))
    assert kept.get() == 1
    with django_assert_num_queries(1):  # the counter, nothing else
        assert kept.get() == 1
    ResourceSpec.objects.update(description="changed")
    assert kept.get() == 2
