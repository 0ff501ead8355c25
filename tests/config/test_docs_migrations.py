"""The docs name migrations by file: `app/NNNN_name` (or `app NNNN_name`), and every file they name exists. A number
alone is refused, since the lead renumbers a branch's migrations when two add the same number (a doc that said
`catalog/0007_seed_mig_geometry` pointed at the geometry tables, not their seed, 0008)."""

import re
from pathlib import Path

from django.conf import settings

APPS = "catalog|config|metering|provisioning|requests|scheduling|serving|tenancy"
MENTION = re.compile(rf"(?<![-\w])({APPS})[ /](?:migrations/)?(\d{{4}})(?![\d-])(_[a-z0-9_]+)?")


def _mentions():
    root = Path(settings.BASE_DIR)
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for line_number, line in enumerate(path.read_text().splitlines(), 1):
            for match in MENTION.finditer(line):
                yield f"{path.name}:{line_number}", match


def test_every_migration_the_docs_name_exists_under_that_name():
    root = Path(settings.BASE_DIR)
    problems = []
    mentions = list(_mentions())
    for where, match in mentions:
        app, number, name = match.groups()
        if name is None:
            problems.append(f"{where}: `{match.group(0)}` gives a number without the migration's name")
        elif not (root / app / "migrations" / f"{number}{name}.py").is_file():
            problems.append(f"{where}: `{match.group(0)}` is not a migration of {app}")
    assert mentions, "the docs name no migration at all: is the pattern still right?"
    assert problems == []
