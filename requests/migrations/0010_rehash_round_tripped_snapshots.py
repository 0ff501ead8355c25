"""Snapshots frozen with a float such as 1e16 were hashed as "1e+16" but read back from jsonb as
10000000000000000, so every later save of the request was refused as tampering (issue 12 item 4). Re-hash
exactly those: the stored hash must be the old hash of the snapshot with its big integers written as the floats
they were. Any other mismatch is left as it is (it is real tampering)."""

import hashlib
import json
from decimal import Decimal

from django.db import migrations


def _old_hash(snapshot) -> str:
    canonical = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _as_written(value):
    """The float a jsonb integer was written as, where it is the decimal expansion of a float in exponent form."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**16:
        candidate = float(value)
        if int(Decimal(repr(candidate))) == value:
            return candidate
    if isinstance(value, dict):
        return {key: _as_written(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_written(item) for item in value]
    return value


def rehash_round_tripped(apps, schema_editor):
    from requests.models.request import snapshot_hash

    ResourceRequest = apps.get_model("requests", "ResourceRequest")
    rows = (ResourceRequest.objects.filter(approved_spec__isnull=False).exclude(approved_spec_hash="")
            .only("pk", "approved_spec", "approved_spec_hash"))
    for request in rows.iterator(chunk_size=500):
        current = snapshot_hash(request.approved_spec)
        if current != request.approved_spec_hash and _old_hash(_as_written(request.approved_spec)) == \
                request.approved_spec_hash:
            ResourceRequest.objects.filter(pk=request.pk).update(approved_spec_hash=current)


class Migration(migrations.Migration):
    dependencies = [("requests", "0009_priority_rules_and_events")]

    operations = [migrations.RunPython(rehash_round_tripped, migrations.RunPython.noop)]
