"""The whole bare-metal path on the test hosts: BMCs, installer callback, every Ansible step, to active; and rerun."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from django.conf import settings

from bench.headline import Headline
from config.env import database_url

TITLE = "Bare metal: the whole path on the Ansible driver"
DESCRIPTION = (
    "`pytest tests/provisioning/bench_bare_metal_path.py` (a timing harness on the end-to-end tests' fixtures, "
    "never collected by the suite), steps run inline by the step engine in the one process (Q_SYNC; no broker "
    "hop between steps): hardware validation against `sushy-static` (HGX mockup, 8 GPUs with serials), one-time "
    "boot from virtual media and a power cycle on `sushy-emulator --fake` (which lands power changes 1-11 s "
    "later: wait_power_on polls it), the installer's callback posted over HTTP at once (wait_for_install is the "
    "time until it is recorded), then every in-band step as `ansible-playbook` over SSH (pipelining, "
    "ControlPersist) on a fresh podman test host (bare-metal host image cached: debootstrap not measured) joining "
    "the real Slurm cluster, and publish_access. `first_s`: the step record's started_at -> finished_at; the whole "
    "path: wall time from the order to active, and `first_cpu_s` the CPU seconds of the process and its children "
    "(ansible-playbook, ssh) over it. `rerun_s`: every step's handler run again on the same server, as a resumed "
    "run would (not boot_installer and power_cycle: they would start a new install; the whole path's rerun_s is "
    "the sum of the others); `rerun_changed`: Ansible's changed count (must be 0; `-` for the Redfish steps). "
    "`load_1m`: the load average when the run started (2 cores shared)."
)
TARGET = "tracked: the whole path from order to active, every rerun changing nothing"
REPO = Path(__file__).resolve().parents[2]


def headline(rows: list[dict]) -> Headline:
    whole = next(row for row in rows if row["step"].startswith("whole path"))
    return Headline(
        f"order -> active {whole['first_s']} s, rerun {whole['rerun_s']} s ({whole['rerun_changed']} changed)"
    )


def run() -> list[dict]:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-bare-metal-") as scratch:
        output = Path(scratch) / "rows.json"
        env = {**os.environ, "DATABASE_URL": database_url(settings.DATABASES["default"]), "BENCH_OUTPUT": str(output)}
        env.pop("DJANGO_SETTINGS_MODULE", None)  # pytest's own (config.settings_test)
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/provisioning/bench_bare_metal_path.py", "-q", "-x",
             "-p", "no:cacheprovider", "--create-db"],
            cwd=REPO, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"The bare-metal path benchmark failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
        rows = json.loads(output.read_text())
    return [{**row, "load_1m": round(load, 1)} for row in rows]
