"""The REST API over httpx: a call returns the decoded JSON body, or raises ApiError carrying the API's
{code, message, details} and the exit code scripts rely on (see EXIT_CODES)."""

from dataclasses import dataclass, field
from enum import IntEnum

import httpx

API_PREFIX = "/api/v1/"
TIMEOUT_SECONDS = 30


class Exit(IntEnum):
    """The documented exit codes (README.md of this package)."""

    OK = 0
    REFUSED = 1  # the API refused: quota, approval rules, a state that does not allow it (4xx with a code)
    USAGE = 2  # the command line itself was wrong (Click's own code for usage errors)
    NOT_FOUND_OR_AUTH = 3  # 401, 403, 404: not signed in, token expired or lacking scope, no such thing for you
    UNREACHABLE = 4  # no answer, or the server failed (5xx)
    DID_NOT_START = 5  # status --watch: the request ended without becoming active (failed, rejected, cancelled)


AUTH_OR_NOT_FOUND = frozenset({401, 403, 404})


@dataclass
class ApiError(Exception):
    status: int | None
    code: str
    message: str
    details: dict | list = field(default_factory=dict)

    @property
    def exit_code(self) -> Exit:
        if self.status is None or self.status >= 500:
            return Exit.UNREACHABLE
        return Exit.NOT_FOUND_OR_AUTH if self.status in AUTH_OR_NOT_FOUND else Exit.REFUSED

    def body(self) -> dict:
        return {"code": self.code, "message": self.message, "details": self.details}


class Api:
    def __init__(self, server: str, token: str | None, *, transport: httpx.BaseTransport | None = None):
        headers = {"Accept": "application/json", "User-Agent": "computecatalog-cli"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self.server = server.rstrip("/")
        self._http = httpx.Client(
            base_url=self.server + API_PREFIX, headers=headers, timeout=TIMEOUT_SECONDS, transport=transport
        )

    def close(self) -> None:
        """Close the kept-alive connections: the server's worker serving them is free at once (and a command run
        inside a longer-lived process, as the tests run them, leaves none open behind it)."""
        self._http.close()

    def get(self, path: str, **params):
        return self._call("GET", path, params={key: value for key, value in params.items() if value is not None})

    def post(self, path: str, body: dict | None = None, *, headers: dict | None = None):
        return self._call("POST", path, json=body or {}, headers=headers)

    def delete(self, path: str):
        return self._call("DELETE", path)

    def all_pages(self, path: str, **params) -> list:
        """Every row of a paginated list, page after page."""
        rows, page = [], 1
        while True:
            answer = self.get(path, page=page, **params)
            if isinstance(answer, list):  # an endpoint that does not paginate
                return answer
            rows += answer["results"]
            if not answer.get("next"):
                return rows
            page += 1

    def _call(self, method: str, path: str, **kwargs):
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise ApiError(None, "unreachable", f"No answer from {self.server}: {error}.") from error
        if response.is_success:
            return response.json() if response.content else {}
        raise _refusal(response)


def _refusal(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return ApiError(response.status_code, body["code"], body.get("message", ""), body.get("details") or {})
    return ApiError(response.status_code, f"http_{response.status_code}", response.reason_phrase or "HTTP error")
