"""The address of the client behind a request: what every throttle, sign-in lockout and sign-in record counts by.

`X-Forwarded-For` is written by whoever sends the request, so it is believed only as far as trusted proxies vouch
for it. The chain is read from the right: the peer (REMOTE_ADDR) first, then each address the hop before appended.
While the address reached is a trusted proxy, the one it reported is taken instead. A proxy is trusted when it
is among the first TRUSTED_PROXY_COUNT hops (a load balancer whose address changes) or its address is in
TRUSTED_PROXY_CIDRS. With neither set (the default) the client is the peer, whatever the header says: a client
that rotates the header to dodge a throttle gains nothing.
"""

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def _networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    try:
        return tuple(ipaddress.ip_network(cidr.strip(), strict=False) for cidr in cidrs)
    except ValueError as invalid:
        raise ImproperlyConfigured(f"TRUSTED_PROXY_CIDRS: {invalid}") from invalid


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443" as some proxies write it
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "192.0.2.1:51234"
        text = text.split(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return address.ipv4_mapped or address if isinstance(address, ipaddress.IPv6Address) else address


def _is_trusted_proxy(address, hop: int, networks: tuple[Network, ...]) -> bool:
    return hop < settings.TRUSTED_PROXY_COUNT or any(address in network for network in networks)


def client_address(request) -> str | None:
    """The client's address as a string (None when the peer gave none), for a Django or DRF request."""
    meta = request.META
    peer = _address(meta.get("REMOTE_ADDR") or "")
    if peer is None:
        return None
    networks = _networks(tuple(settings.TRUSTED_PROXY_CIDRS))
    reported = [part for part in meta.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
    client, hop = peer, 0
    while reported and _is_trusted_proxy(client, hop, networks):
        earlier = _address(reported.pop())
        if earlier is None:  # a trusted proxy passed on garbage: the proxy is the last address we can vouch for
            break
        client, hop = earlier, hop + 1
    return str(client)
