"""House rules checked over the source (docs/architecture.md, "House rules"): every app connects its signals, hooks
and schedules in its `wiring.py`; public service functions take keyword arguments only; comments carry no timings
(figures go to docs/BENCHMARKS.md, where they are measured and dated)."""

import ast
import inspect
import io
import re
import tokenize
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


def _service_modules() -> list[Path]:
    found = {*ROOT.glob("*/services.py"), *ROOT.glob("*/*_services.py"), *ROOT.glob("*/*/services.py")}
    return sorted(path for path in found if path.parts[len(ROOT.parts)] in PRODUCT_APPS)


# Reads and pure helpers that live beside the writes and write nothing; predicates (can_*, is_*) likewise.
READS = {"approved_snapshot", "order_of", "installer_token", "teardown_forceable", "sampling_instant", "sample_of",
         "geometry_from_catalog", "geometries_by_model"}  # fmt: skip


def test_public_services_take_keyword_arguments_only():
    """`<noun>_<verb>(*, ..., actor)`: a call names what it passes, so a reordered or added parameter can never
    bind the wrong value silently."""
    modules = _service_modules()
    assert ROOT / "requests" / "services.py" in modules and ROOT / "scheduling" / "slurm" / "services.py" in modules
    positional = []
    for path in modules:
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name.startswith("_"):
                continue
            if node.name in READS or node.name.startswith(("can_", "is_")):
                continue
            if node.args.posonlyargs or node.args.args or node.args.vararg:
                positional.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert positional == []


# A measured time in a comment goes stale the day the code changes; the figure belongs on docs/BENCHMARKS.md, where
# it is measured and dated, and the comment keeps the reason.
TIMING = re.compile(r"(?<![\w\"'])~?\d[\d,.]*\s*(?:-\s*\d[\d,.]*\s*)?(?:ms|µs|s|sec|seconds?)(?![\w\"'])")


def _comments_and_docstrings(path: Path):
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield node.body[0].lineno, docstring


def test_comments_and_docstrings_carry_no_timings():
    found = []
    for app in PRODUCT_APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for line, text in _comments_and_docstrings(path):
                found += [f"{path.relative_to(ROOT)}:{line}: {match[0]}" for match in TIMING.finditer(text)]
    assert found == []


GUIDES = ("docs/adding-a-backend.md", "docs/adding-an-accelerator.md")
PATH_IN_GUIDE = re.compile(r"`((?:[a-z_]+/)+[A-Za-z0-9_.-]*)`")


def test_the_guides_name_only_paths_that_exist():
    """The newcomer's checklists are checked against the code: a file moved or renamed fails here until the guide
    follows it (placeholders such as `<name>` are not paths)."""
    missing = []
    for guide in GUIDES:
        text = (ROOT / guide).read_text()
        paths = [path for path in PATH_IN_GUIDE.findall(text) if "<" not in path]
        assert len(paths) > 10, guide
        missing += [f"{guide}: {path}" for path in paths if not (ROOT / path).exists()]
    assert missing == []
