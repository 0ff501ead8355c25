"""House rules checked over the source (docs/architecture.md, "House rules"): every app connects its signals, hooks
and schedules in its `wiring.py`; public service functions take keyword arguments only; comments carry no timings
(figures go to docs/BENCHMARKS.md, where they are measured and dated)."""

import inspect
import re
from pathlib import Path

from django.apps import apps

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_APPS = ("config", "tenancy", "catalog", "requests", "scheduling", "provisioning", "metering")


def test_every_app_wires_itself_in_its_wiring_module():
    """An app's ready() connects nothing itself: it calls its wiring module, where every receiver, hook and schedule
    of the app is found in one place."""
    for label in ("tenancy", "requests", "scheduling", "provisioning", "metering"):
        config = apps.get_app_config(label)
        assert (ROOT / label / "wiring.py").is_file(), label
        source = inspect.getsource(type(config).ready)
        assert "wiring.connect(" in source, label
        assert not re.search(r"\b(?!wiring\.)\w+\.connect\(", source), f"{label}.apps connects a signal itself"
