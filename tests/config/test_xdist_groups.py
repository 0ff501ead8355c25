"""`make test` keeps each xdist group (a module, or the modules sharing one Redis database) in one worker
(tests/conftest.py marks them; `--dist loadgroup`). That rests on pytest-xdist's group reaching its scheduler, which
pytest 9 broke silently (pyproject.toml pins below it): this runs the same options on two groups of tests that
record their worker, in a pytest of their own."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

GROUP_SIZE = 8
GROUPED_TESTS = textwrap.dedent(
    f"""
    import json, os, pathlib

    import pytest

    @pytest.mark.xdist_group("first")
    @pytest.mark.parametrize("index", range({GROUP_SIZE}))
    def test_first(index):
        record("first", index)

    @pytest.mark.xdist_group("second")
    @pytest.mark.parametrize("index", range({GROUP_SIZE}))
    def test_second(index):
        record("second", index)

    def record(group, index):
        line = json.dumps({{"group": group, "worker": os.environ["PYTEST_XDIST_WORKER"]}})
        with open(pathlib.Path(__file__).with_name("workers.jsonl"), "a") as out:
            out.write(line + "\\n")
    """
)


@pytest.mark.integration
def test_each_group_runs_in_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    options = ["-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", "-p", "no:django", "-p", "no:cacheprovider"]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *options, "test_grouped.py"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    runs = [json.loads(line) for line in (tmp_path / "workers.jsonl").read_text().splitlines()]
    workers = {group: {run["worker"] for run in runs if run["group"] == group} for group in ("first", "second")}
    assert len(runs) == 2 * GROUP_SIZE
    assert all(len(used) == 1 for used in workers.values()), workers
