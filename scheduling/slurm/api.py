"""A client for slurmrestd's REST API v0.0.38 (Slurm 22.05), spoken with httpx and authenticated with a JWT.

Field names follow Slurm's own schema (src/plugins/openapi/v0.0.38/openapi.json). Answers are returned as Slurm's
JSON objects (dicts); callers pick the fields they need. Every failure is a SlurmApiError carrying Slurm's `errors`
array, so the reason Slurm gave reaches the record; the token is sent in a header only and never appears in a log
line, an exception or a repr.

Slurm 22.05 answers most failures, including a bad or expired token, with HTTP 500 and an `errors` array: the
status code alone says little, the errors say what happened. `_error_for` is the one place that reads an answer as
"not now" (SlurmUnavailable: slurmrestd or slurmctld out of reach, restarting or busy; worth asking again) or as
"no" (any other SlurmApiError: a refusal that asking again will not change). Measured on Slurm 22.05: with
slurmctld stopped, slurmrestd answers every call after a long wait with HTTP 500 and error -1 ("Unspecified error"),
or 1800 for a submission or a cancellation; with slurmrestd stopped the connection is refused. Right after
slurmctld restarts, a submission is answered HTTP 200 with a job id *and* error 2068 (ESLURM_NODE_NOT_AVAIL, its
nodes not registered yet): Slurm accepted that job (it pends ReqNodeNotAvail), so `submit_job` returns it.
"""

import logging
from pathlib import Path

import httpx
from django.conf import settings

logger = logging.getLogger(__name__)

API_PREFIX = "/slurm/v0.0.38"
# Slurm error numbers (slurm/slurm_errno.h) that mean "not now": slurmrestd could not reach slurmctld (SLURM_ERROR,
# -1, is what 22.05's slurmrestd answers when slurmctld does not answer at all; then the communication and socket
# errors), or slurmctld asks to be asked again (EAGAIN, "try again" 2007/2020/2103, a controller in standby
# 2027/2131, its database out of reach 7000). Worth retrying.
CONTROLLER_UNREACHABLE_ERRNOS = frozenset(
    {-1, 11, *range(1001, 1005), 1013, *range(1800, 1804), *range(5000, 5006), 2007, 2020, 2027, 2103, 2131, 7000}
)
# ESLURM_INVALID_JOB_ID, ESLURM_INVALID_NODE_NAME: the job or node is not (or no longer) known to slurmctld.
NOT_FOUND_ERRNOS = frozenset({2017, 2018})
ACCESS_DENIED_ERRNOS = frozenset({2002})  # ESLURM_ACCESS_DENIED: the token's user may not do this
UNAVAILABLE_HTTP_STATUSES = frozenset({502, 503, 504})
SLURMRESTD, CONTROLLER = "slurmrestd", "the Slurm controller"  # which part did not answer


class SlurmApiError(Exception):
    """slurmrestd refused or failed a call. `errors` is Slurm's errors array ({"error", "error_number", ...}); `body`
    the rest of its answer (a submission Slurm accepted despite an error carries its job id there)."""

    def __init__(
        self, message: str, *, status: int | None = None, errors: list[dict] | None = None, body: dict | None = None
    ):
        self.status = status
        self.errors = errors or []
        self.body = body or {}
        super().__init__(message)

    @property
    def retryable(self) -> bool:
        """True when slurmctld or slurmrestd was unreachable, so the same call may succeed later."""
        return False


class SlurmUnavailable(SlurmApiError):
    """slurmrestd did not answer (connection refused, timeout, gateway error) or could not reach slurmctld, or
    slurmctld asked to be asked again. `part` is which of them: SLURMRESTD or CONTROLLER."""

    def __init__(self, message: str, *, part: str = CONTROLLER, **answer):
        self.part = part
        super().__init__(message, **answer)

    @property
    def retryable(self) -> bool:
        return True


class SlurmNotFound(SlurmApiError):
    """The job or node is unknown to slurmctld (never existed, or a finished job older than MinJobAge)."""


class SlurmAccessDenied(SlurmApiError):
    """slurmctld refused the token's user the operation (ESLURM_ACCESS_DENIED), e.g. raising a time limit."""


class SlurmNotConfigured(SlurmApiError):
    """SLURM_REST_URL, SLURM_USER_NAME or the token (SLURM_JWT / SLURM_JWT_FILE) is missing."""


class SlurmApi:
    """One slurmrestd endpoint. Use `SlurmApi.from_settings()`; close it, or use it as a context manager."""

    def __init__(self, *, url: str, user_name: str, token: str, timeout: float = 10.0):
        missing = [name for name, value in (("URL", url), ("user name", user_name), ("token", token)) if not value]
        if missing:
            raise SlurmNotConfigured(f"Slurm REST API not configured: no {', '.join(missing)}")
        self.url = url.rstrip("/")
        self.user_name = user_name
        self._client = httpx.Client(
            base_url=f"{self.url}{API_PREFIX}",
            timeout=timeout,
            headers={"X-SLURM-USER-NAME": user_name, "X-SLURM-USER-TOKEN": token, "Accept": "application/json"},
        )

    @classmethod
    def from_settings(cls) -> "SlurmApi":
        return cls(
            url=settings.SLURM_REST_URL,
            user_name=settings.SLURM_USER_NAME,
            token=configured_token(),
            timeout=settings.SLURM_TIMEOUT_SECONDS,
        )

    def __repr__(self) -> str:
        return f"SlurmApi(url={self.url!r}, user_name={self.user_name!r})"

    def __enter__(self) -> "SlurmApi":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    # --- Controller ----------------------------------------------------------------------------------------------

    def ping(self, *, timeout: float | None = None) -> list[dict]:
        """One entry per slurmctld: {"hostname", "ping": "UP"|"DOWN", "mode", "status"}. No controller UP is
        SlurmUnavailable. `timeout` overrides the client's (a prober asks again rather than wait)."""
        pings = self._call("GET", "/ping/", **({"timeout": timeout} if timeout is not None else {}))["pings"]
        if not any(ping.get("ping") == "UP" for ping in pings):
            raise SlurmUnavailable(f"No Slurm controller answers UP: {pings}", part=CONTROLLER)
        return pings

    def diag(self) -> dict:
        """slurmctld's scheduler statistics (`sdiag`)."""
        return self._call("GET", "/diag/")["statistics"]

    # --- Nodes ---------------------------------------------------------------------------------------------------

    def nodes(self) -> list[dict]:
        return self._call("GET", "/nodes/")["nodes"]

    def node(self, name: str) -> dict:
        nodes = self._call("GET", f"/node/{name}")["nodes"]
        if not nodes:
            raise SlurmNotFound(f"Slurm has no node {name!r}", status=404)
        return nodes[0]

    # --- Jobs ----------------------------------------------------------------------------------------------------

    def submit_job(self, script: str, job: dict) -> dict:
        """Submit a batch job: `job` holds job properties (name, partition, nodelist, gres, time_limit, ...).
        Returns Slurm's answer: {"job_id", "step_id", "job_submit_user_msg"}, plus "warnings" (Slurm's errors array)
        when Slurm accepted the job while answering with an error (2068 just after a restart: the job pends until
        its node registers). A job Slurm accepted is never submitted again, so such an answer is a success."""
        try:
            return self._call("POST", "/job/submit", json={"script": script, "job": job})
        except SlurmApiError as error:
            job_id = error.body.get("job_id")
            if isinstance(job_id, int) and job_id > 0:
                logger.warning("Slurm accepted job %s with errors: %s", job_id, error)
                return {**error.body, "warnings": error.errors}
            raise

    def job(self, job_id: int) -> dict:
        jobs = self._call("GET", f"/job/{job_id}")["jobs"]
        if not jobs:
            raise SlurmNotFound(f"Slurm has no job {job_id}", status=404)
        return jobs[0]

    def jobs(self) -> list[dict]:
        """Every job slurmctld still knows (pending, running, and finished ones younger than MinJobAge)."""
        return self._call("GET", "/jobs/")["jobs"]

    def update_job(self, job_id: int, changes: dict) -> None:
        """Change a job's properties (`changes` as in submit_job's `job`, e.g. {"time_limit": minutes}). Slurm lets
        only operators (or SlurmUser) raise a time limit: others get ESLURM_ACCESS_DENIED, a SlurmAccessDenied."""
        self._call("POST", f"/job/{job_id}", json=changes)

    def cancel_job(self, job_id: int, signal: str | None = None) -> None:
        """Cancel the job, or send it a signal (a POSIX name such as "TERM" or "KILL")."""
        self._call("DELETE", f"/job/{job_id}", params={"signal": signal} if signal else None)

    # --- Transport -----------------------------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs) -> dict:
        try:
            response = self._client.request(method, path, **kwargs)
        except (httpx.ReadTimeout, httpx.WriteTimeout) as error:
            # slurmrestd took the call and waits on slurmctld: a long wait per controller call while slurmctld is down,
            # and a job query makes two.
            raise SlurmUnavailable(
                f"slurmrestd at {self.url} did not answer {method} {path} in time (waiting on slurmctld)",
                part=CONTROLLER,
            ) from error
        except httpx.TransportError as error:  # refused, or not even connected in time: slurmrestd itself
            raise SlurmUnavailable(
                f"slurmrestd at {self.url} unreachable: {error.__class__.__name__}", part=SLURMRESTD
            ) from error
        body = _json_or_empty(response)
        errors = [error for error in body.pop("errors", None) or [] if isinstance(error, dict)]
        if response.is_success and not errors:
            return body
        raise _error_for(method, path, response.status_code, errors, body)


def _json_or_empty(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _error_for(method: str, path: str, status: int, errors: list[dict], body: dict) -> SlurmApiError:
    """The one classification of a failed answer: "not now" (SlurmUnavailable) when the status says a gateway or
    slurmrestd itself could not serve (502-504, or any 5xx without Slurm's errors to say why) or an error number says
    slurmctld was out of reach or busy; else the refusal Slurm's error numbers name."""
    described = "; ".join(_describe(error) for error in errors) or f"HTTP {status}"
    numbers = {error_number(error) for error in errors}
    answer = {"status": status, "errors": errors, "body": body}
    if status in UNAVAILABLE_HTTP_STATUSES or (status >= 500 and not errors):
        error = SlurmUnavailable(f"slurmrestd could not answer {method} {path}: {described}", part=SLURMRESTD, **answer)
    elif numbers & CONTROLLER_UNREACHABLE_ERRNOS:
        error = SlurmUnavailable(f"Slurm could not answer {method} {path}: {described}", part=CONTROLLER, **answer)
    else:
        error_class = (
            SlurmNotFound
            if numbers & NOT_FOUND_ERRNOS
            else SlurmAccessDenied
            if numbers & ACCESS_DENIED_ERRNOS
            else SlurmApiError
        )
        error = error_class(f"Slurm refused {method} {path}: {described}", **answer)
    logger.warning("%s", error)
    return error


def error_number(error: dict) -> int | None:
    """Slurm's error number; v0.0.38 names it `error_number`, `errno` or `error_code` depending on the call."""
    for key in ("error_number", "errno", "error_code"):
        if isinstance(error.get(key), int):
            return error[key]
    return None


def _describe(error: dict) -> str:
    text = error.get("description") or error.get("error") or "unspecified"
    number = error_number(error)
    return f"{text} (error {number})" if number not in (None, 0) else text


def configured_token() -> str:
    """The JWT from SLURM_JWT_FILE (a secret mounted as a file, read on every use so a rotated token is picked up),
    else from SLURM_JWT. The output of `scontrol token` ("SLURM_JWT=...") is accepted as is."""
    path = settings.SLURM_JWT_FILE
    token = Path(path).read_text() if path else settings.SLURM_JWT
    return token.strip().removeprefix("SLURM_JWT=")
