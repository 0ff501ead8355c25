"""The placement engine (scheduling/engine/) and the MIG engine (scheduling.mig's pure modules) import nothing from
Django or from any app: loaded in a fresh interpreter, they bring in only the standard library and themselves."""

import subprocess
import sys
from pathlib import Path

from django.conf import settings

ENGINE = sorted(
    f"scheduling.engine.{path.stem}"
    for path in (Path(settings.BASE_DIR) / "scheduling" / "engine").glob("*.py")
    if path.stem != "__init__"
)
PURE_MIG = ["scheduling.mig", *(f"scheduling.mig.{name}" for name in ("budget", "engine", "geometry", "model"))]
# What may be loaded besides the standard library: the packages the pure modules live in, and the modules themselves.
ALLOWED = ("scheduling", "scheduling.engine", "scheduling.mig")


def _loaded_by(modules: list[str]) -> list[str]:
    """The non-standard-library modules a fresh interpreter loads to import `modules` (what it had loaded before,
    e.g. by its site hooks, does not count)."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"for name in {modules!r}:\n"
        "    __import__(name)\n"
        "print('\\n'.join(sorted(\n"
        "    name for name in set(sys.modules) - before if name.split('.')[0] not in sys.stdlib_module_names\n"
        ")))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.split()


def test_the_engine_package_lists_its_modules():
    assert {"scheduling.engine.place", "scheduling.engine.explain", "scheduling.engine.never_fits"} <= set(ENGINE)
    assert "scheduling.engine.preemption" in ENGINE and "scheduling.engine.model" in ENGINE


def test_the_placement_engine_imports_nothing_from_django_or_an_app():
    loaded = _loaded_by(ENGINE)
    outside = [name for name in loaded if name not in ALLOWED and not name.startswith("scheduling.engine.")]
    assert outside == []
    assert "django" not in loaded and set(ENGINE) <= set(loaded)


def test_the_mig_engine_imports_nothing_from_django_or_an_app():
    loaded = _loaded_by(PURE_MIG)
    outside = [
        name
        for name in loaded
        if name not in ALLOWED and not name.startswith(("scheduling.engine.", "scheduling.mig."))
    ]
    assert outside == []
    # the package's Django side is imported by name only, never by the package itself
    assert "scheduling.mig.cycle" not in loaded and "scheduling.mig.services" not in loaded
