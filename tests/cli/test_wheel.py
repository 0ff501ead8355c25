"""The command line is its own package: it builds as a wheel with the `cc` console script, and that wheel, installed
on its own, imports neither Django nor the product (nor PyPI's `requests`, which our app's name shadows)."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # runs pip in a process of its own
CHECKOUT = Path(__file__).resolve().parents[2]


def test_the_cli_builds_as_a_wheel_that_needs_nothing_of_the_product(tmp_path):
    source = shutil.copytree(CHECKOUT / "cli", tmp_path / "cli", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(  # from a copy: setuptools writes build/ and *.egg-info beside the sources it builds
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", tmp_path, source],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("computecatalog_cli-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(archive.read(name).decode() for name in names if name.endswith("entry_points.txt"))
    assert "cc = computecatalog_cli.main:main" in entry_points
    assert {name.split("/")[0] for name in names} == {"computecatalog_cli", wheel.name.split("-py")[0] + ".dist-info"}

    installed = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", installed, wheel],
        check=True,
    )
    probe = (
        "import sys; from computecatalog_cli import main; main.cli.main(['--help'], standalone_mode=False); "
        "assert not {'django', 'requests', 'tenancy', 'config'} & set(sys.modules), sorted(sys.modules)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,  # away from the checkout, whose packages would otherwise be importable
        env={"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    )
    assert "order" in shown.stdout and "status" in shown.stdout
