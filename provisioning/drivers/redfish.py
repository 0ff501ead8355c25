"""Out-of-band control of a server through its BMC's DMTF Redfish REST API, spoken with httpx.

Not `sushy`: it imports the PyPI `requests` library, which our `requests` app shadows (DESIGN.md). Resources are
found by following the links the BMC publishes (`@odata.id`, action targets), never by guessing vendor-specific
paths; and only links on the BMC's own origin are followed, as are only redirects there: the credentials go with every
call, so a link elsewhere (a compromised BMC's `http://169.254.169.254/...`) fails the step instead.
"""

import json
import logging

import httpx
from django.conf import settings

from provisioning.drivers.base import ACCELERATOR_TYPES, BackendUnavailable, BmcDriver, StepError, Target
from provisioning.secrets import bmc_credentials

logger = logging.getLogger(__name__)

SYSTEMS_PATH = "/redfish/v1/Systems"
OPTICAL_MEDIA_TYPES = {"CD", "DVD"}
# Reset types whose outcome is a steady state: asking for the state the system is already in is a no-op.
RESET_OUTCOMES = {"On": "On", "ForceOn": "On", "ForceOff": "Off", "GracefulShutdown": "Off"}
MAX_REDIRECTS = 5


class RedfishBmc(BmcDriver):
    name = "redfish"

    def __init__(self) -> None:
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        # Built on first use, so the settings in force then (timeout, TLS verification) apply.
        if self._client is None:
            self._client = httpx.Client(
                timeout=getattr(settings, "REDFISH_TIMEOUT_SECONDS", 10),
                verify=getattr(settings, "REDFISH_VERIFY_TLS", True),
                # Redirects are followed by _Session, and only on the BMC's own origin.
                follow_redirects=False,
                headers={"Accept": "application/json", "OData-Version": "4.0"},
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def inventory(self, target: Target) -> dict:
        # An HGX-class server may report its GPUs through a second Redfish service (the baseboard's management
        # controller): the node names it as its inventory address, and power, boot and media stay with the BMC.
        bmc = self._connect(target, address=target.bmc_inventory_address or target.bmc_address)
        system = bmc.get(bmc.system_path)
        summary = system.get("ProcessorSummary", {})
        processors = _processors(bmc, system)
        accelerators = None if processors is None else [p for p in processors if p["type"] in ACCELERATOR_TYPES]
        return {
            "reachable": True,
            "health": system.get("Status", {}).get("Health"),
            "power_state": system.get("PowerState"),
            # Redfish's `Count` is processor packages; cores are `CoreCount` (ComputerSystem v1.14+), else the sum
            # of the CPUs' `TotalCores`.
            "cpu_cores": summary.get("CoreCount") or _cpu_cores(processors),
            "cpu_sockets": summary.get("Count"),
            "memory_gb": system.get("MemorySummary", {}).get("TotalSystemMemoryGiB"),
            "accelerators": None if accelerators is None else len(accelerators),
            "processors": processors,
            "manufacturer": system.get("Manufacturer"),
            "model": system.get("Model"),
            "system": system.get("@odata.id", bmc.system_path),
        }

    def insert_media(self, target: Target, image_url: str) -> dict:
        # The image URL's query is the installer's (its callback and token): it goes to the BMC only, never into the
        # summary, the log or an error the BMC echoes it in.
        bmc = self._connect(target)
        optical = _optical_media(bmc)
        if not optical:
            raise StepError("vmedia_unsupported", "The BMC offers no CD/DVD virtual media", retryable=False)
        media = optical[0]
        summary = {"media": media.get("Id"), "image": _without_query(image_url)}
        if _is_inserted(media) and media.get("Image") == image_url:
            return {**summary, "changed": False}
        if _is_inserted(media):
            # Most BMCs refuse to insert over an inserted image.
            bmc.post(_action_target(media, "#VirtualMedia.EjectMedia"), {})
        body = {"Image": image_url, "Inserted": True, "WriteProtected": True}
        try:
            bmc.post(_action_target(media, "#VirtualMedia.InsertMedia"), body)
        except StepError as refused:
            raise _redacted(refused, image_url) from None
        logger.info("Inserted %s as virtual media %s of %s", summary["image"], media.get("Id"), bmc.system_path)
        return {**summary, "changed": True}

    def set_one_time_boot(self, target: Target, source: str) -> dict:
        bmc = self._connect(target)
        boot = bmc.get(bmc.system_path).get("Boot", {})
        allowed = boot.get("BootSourceOverrideTarget@Redfish.AllowableValues")
        _require_allowed(source, allowed, code="boot_source_unsupported", what="Boot source")
        # Always sent: setting the same override again is harmless, and a consumed one must be set again.
        bmc.patch(bmc.system_path, {"Boot": {"BootSourceOverrideTarget": source, "BootSourceOverrideEnabled": "Once"}})
        logger.info("Set one-time boot from %s on %s", source, bmc.system_path)
        return {"boot_source": source, "enabled": "Once"}

    def power_state(self, target: Target) -> str:
        bmc = self._connect(target)
        return bmc.get(bmc.system_path).get("PowerState")

    def power(self, target: Target, action: str) -> dict:
        bmc = self._connect(target)
        system = bmc.get(bmc.system_path)
        reset = system.get("Actions", {}).get("#ComputerSystem.Reset")
        if not reset:
            raise StepError("power_action_unsupported", "The BMC offers no ComputerSystem.Reset", retryable=False)
        allowed = reset.get("ResetType@Redfish.AllowableValues")
        _require_allowed(action, allowed, code="power_action_unsupported", what="Reset type")
        state = system.get("PowerState")
        if RESET_OUTCOMES.get(action) == state:
            return {"action": action, "power_state": state, "changed": False}
        bmc.post(reset.get("target"), {"ResetType": action})
        logger.info("Requested %s on %s (was %s)", action, bmc.system_path, state)
        return {"action": action, "power_state": state, "changed": True}

    def eject_media(self, target: Target) -> dict:
        bmc = self._connect(target)
        inserted = [media for media in _optical_media(bmc) if _is_inserted(media)]
        for media in inserted:
            bmc.post(_action_target(media, "#VirtualMedia.EjectMedia"), {})
            logger.info("Ejected %s from virtual media %s", _without_query(media.get("Image")), media.get("Id"))
        return {"ejected": [media.get("Id") for media in inserted], "changed": bool(inserted)}

    def _connect(self, target: Target, address: str | None = None) -> "_Session":
        address = address or target.bmc_address
        if not address:
            raise StepError("bmc_not_configured", f"Node {target.node} has no BMC address", retryable=False)
        auth = bmc_credentials(target.bmc_credentials_ref)
        if target.bmc_credentials_ref and auth is None:
            raise StepError(
                "bmc_credentials_missing",
                f"No BMC credentials named {target.bmc_credentials_ref!r} are configured",
                retryable=False,
            )
        return _Session(self.client, address, auth)


class _Session:
    """One call's conversation with one BMC: its origin, its credentials and the system it controls."""

    def __init__(self, client: httpx.Client, bmc_address: str, auth: tuple[str, str] | None):
        # A bare host means the BMC's HTTPS service; user info in the address is dropped (credentials come by ref).
        url = httpx.URL(bmc_address if "://" in bmc_address else f"https://{bmc_address}")
        if url.scheme not in ("http", "https") or not url.host:
            raise StepError("bmc_address_invalid", f"{bmc_address!r} is not a BMC URL", retryable=False)
        self.client, self.auth = client, auth
        self.origin = f"{url.scheme}://{url.netloc.decode()}"
        self._origin_url = httpx.URL(self.origin)
        self.system_path = self._system_path(url.path.rstrip("/"))

    def get(self, path: str) -> dict:
        response = self._send("GET", path)
        try:
            return response.json()
        except ValueError:
            raise StepError(
                "bmc_bad_response", f"BMC {self.origin} answered GET {path} with no JSON", details={"path": path}
            ) from None

    def post(self, path: str, body: dict) -> None:
        self._send("POST", path, json=body)

    def patch(self, path: str, body: dict) -> None:
        self._send("PATCH", path, json=body)

    def _system_path(self, address_path: str) -> str:
        if address_path.startswith(f"{SYSTEMS_PATH}/"):
            return address_path
        members = self.get(SYSTEMS_PATH).get("Members", [])
        systems = [member["@odata.id"] for member in members]
        if len(systems) > 1:
            raise StepError(
                "bmc_ambiguous_system",
                f"BMC {self.origin} serves {len(systems)} systems: give the system URL as the BMC address",
                retryable=False,
                details={"systems": systems},
            )
        if not systems:
            raise StepError("bmc_no_system", f"BMC {self.origin} reports no computer system", retryable=False)
        return systems[0]

    def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        url = self._on_origin(path)
        request = self.client.build_request(method, url, **kwargs)
        for _ in range(MAX_REDIRECTS + 1):
            response = self._exchange(request, method, path)
            if not response.is_redirect:
                return self._answered(response, method, path)
            # A redirect is a link too: followed only on the BMC's own origin (httpx keeps the method and body of a
            # 307/308 and turns a 301/302/303 into a GET, as browsers do).
            request = response.next_request
            request.url = self._on_origin(response.headers["Location"])
        raise StepError(
            "bmc_bad_response",
            f"BMC {self.origin} redirected {method} {path} more than {MAX_REDIRECTS} times",
            retryable=False,
            details={"path": path},
        )

    def _exchange(self, request: httpx.Request, method: str, path: str) -> httpx.Response:
        # `from None` below: the httpx exception holds the request, and with it the Authorization header.
        url = str(request.url)
        try:
            return self.client.send(request, auth=self.auth)
        except httpx.TimeoutException:
            raise self._unavailable(
                "bmc_unreachable", f"BMC {self.origin} did not answer {method} {path} in time", {"url": url}
            ) from None
        except httpx.RequestError as exc:
            raise self._unavailable("bmc_unreachable", f"Cannot reach BMC {self.origin}: {exc}", {"url": url}) from None

    def _answered(self, response: httpx.Response, method: str, path: str) -> httpx.Response:
        """The BMC's answer, unless it failed while answering (5xx but 501 Not Implemented, which will not change):
        an outage of the BMC, waited out; a refusal is final (_raise_for_status)."""
        if response.status_code >= 500 and response.status_code != 501:
            message = _redfish_message(response)
            raise self._unavailable(
                "bmc_error",
                f"BMC answered {response.status_code} to {method} {path}: {message}",
                {"status": response.status_code, "method": method, "path": path, "message": message},
            )
        _raise_for_status(response, method, path)
        return response

    def _on_origin(self, link) -> httpx.URL:
        """A link the BMC published (`@odata.id`, an action target, a redirect's Location), resolved on the BMC's
        origin; refused when it leads anywhere else, since the BMC's credentials go with every call. User info in a
        link is dropped: the credentials come from the node's reference only."""
        if not isinstance(link, str) or not link:
            raise StepError(
                "bmc_bad_response",
                f"BMC {self.origin} published a link that is not a URL: {link!r}",
                retryable=False,
                details={"link": repr(link)},
            )
        try:
            url = self._origin_url.join(link)
        except httpx.InvalidURL:
            url = None
        if url is None or (url.scheme, url.host, url.port) != (
            self._origin_url.scheme,
            self._origin_url.host,
            self._origin_url.port,
        ):
            raise StepError(
                "bmc_link_off_origin",
                f"BMC {self.origin} links to {link}, outside its own origin: not followed",
                retryable=False,
                details={"link": link, "origin": self.origin},
            )
        return self._origin_url.copy_with(raw_path=url.raw_path)

    def _unavailable(self, code: str, message: str, details: dict) -> BackendUnavailable:
        """The BMC did not answer, or failed while answering (5xx): its node's own service, waited out like any
        outage (a BMC resets in minutes). A refusal (4xx, 501) is final."""
        return BackendUnavailable(
            code, message, backend=RedfishBmc.name, waiting_for=f"the BMC at {self.origin}", details=details
        )


def _raise_for_status(response: httpx.Response, method: str, path: str) -> None:
    if response.is_success:
        return
    status, message = response.status_code, _redfish_message(response)
    details = {"status": status, "method": method, "path": path, "message": message}
    if status in (401, 403):
        raise StepError("bmc_auth_failed", f"BMC refused the credentials ({status})", retryable=False, details=details)
    code = "bmc_error" if status >= 500 else "bmc_rejected"
    raise StepError(code, f"BMC answered {status} to {method} {path}: {message}", retryable=False, details=details)


def _redfish_message(response: httpx.Response) -> str:
    """The human part of a Redfish error body ({"error": {"message", "@Message.ExtendedInfo"}}), else the reason."""
    try:
        error = response.json()["error"]
        extended = error.get("@Message.ExtendedInfo") or [{}]
        return error.get("message") or extended[0].get("Message") or response.reason_phrase
    except (ValueError, LookupError, TypeError, AttributeError):
        return response.reason_phrase


def _require_allowed(value: str, allowed: list | None, *, code: str, what: str) -> None:
    # BMCs that publish no AllowableValues get the request and answer for themselves.
    if allowed is not None and value not in allowed:
        raise StepError(
            code,
            f"{what} {value!r} is not supported by this BMC",
            retryable=False,
            details={"requested": value, "allowed": allowed},
        )


def _processors(bmc: _Session, system: dict) -> list[dict] | None:
    """Every processor (CPUs and accelerators) the system links: {id, type, model, serial, cores, health}; None
    when the BMC links no Processors collection."""
    if "Processors" not in system:
        return None
    members = bmc.get(system["Processors"]["@odata.id"]).get("Members", [])
    return [
        {
            "id": processor.get("Id"),
            "type": processor.get("ProcessorType"),
            "model": processor.get("Model"),
            "serial": processor.get("SerialNumber"),
            "cores": processor.get("TotalCores"),
            # A processor slot without a part (State Absent) has no health to judge.
            "health": processor.get("Status", {}).get("Health"),
        }
        for processor in (bmc.get(member["@odata.id"]) for member in members)
        if processor.get("Status", {}).get("State") != "Absent"
    ]


def _cpu_cores(processors: list[dict] | None) -> int | None:
    cores = [p["cores"] for p in processors or [] if p["type"] == "CPU" and p["cores"] is not None]
    return sum(cores) if cores else None


def _optical_media(bmc: _Session) -> list[dict]:
    """The CD/DVD virtual media of the system, or of its manager when the system links none."""
    collection = _virtual_media_collection(bmc)
    if collection is None:
        return []
    media = [bmc.get(member["@odata.id"]) for member in bmc.get(collection).get("Members", [])]
    return [item for item in media if OPTICAL_MEDIA_TYPES & set(item.get("MediaTypes", []))]


def _virtual_media_collection(bmc: _Session) -> str | None:
    system = bmc.get(bmc.system_path)
    link = system.get("VirtualMedia")
    managers = system.get("Links", {}).get("ManagedBy", [])
    if link is None and managers:
        link = bmc.get(managers[0]["@odata.id"]).get("VirtualMedia")
    return link["@odata.id"] if link else None


def _is_inserted(media: dict) -> bool:
    # Some BMCs omit `Inserted`; an image URL then means it is in.
    return media.get("Inserted", bool(media.get("Image")))


def _without_query(url: str | None) -> str | None:
    return url.split("?", 1)[0] if url else url


def _redacted(error: StepError, image_url: str) -> StepError:
    """The BMC's refusal of an image, without the image URL's query wherever the BMC quoted it."""
    secret, shown = image_url.partition("?")[2], "<redacted>"
    if not secret:
        return error
    details = json.loads(json.dumps(error.details).replace(secret, shown))
    return StepError(error.code, error.message.replace(secret, shown), retryable=error.retryable, details=details)


def _action_target(media: dict, action: str) -> str:
    try:
        return media["Actions"][action]["target"]
    except KeyError:
        raise StepError(
            "vmedia_unsupported", f"Virtual media {media.get('Id')} offers no {action} action", retryable=False
        ) from None
