"""config.client_address: X-Forwarded-For is believed only as far as trusted proxies vouch for it."""

import pytest
from django.test import RequestFactory

from config.client_address import client_address


def _address(settings, remote: str, forwarded: str | None = None, *, count: int = 0, cidrs=()) -> str:
    settings.TRUSTED_PROXY_COUNT, settings.TRUSTED_PROXY_CIDRS = count, list(cidrs)
    headers = {"REMOTE_ADDR": remote} | ({"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {})
    return client_address(RequestFactory().get("/", **headers))


def test_without_trusted_proxies_the_client_is_the_peer_whatever_the_header_says(settings):
    assert _address(settings, "198.51.100.7", "203.0.113.1") == "198.51.100.7"
    assert _address(settings, "198.51.100.7", "203.0.113.1, 203.0.113.2") == "198.51.100.7"


@pytest.mark.parametrize(
    ("remote", "forwarded", "count", "cidrs", "client"),
    [
        # A proxy in the trusted range: the address it appended (the right-most) is the client.
        ("10.0.0.5", "203.0.113.9", 0, ["10.0.0.0/8"], "203.0.113.9"),
        # Whatever the client put before it is not believed: the right-most entry is what the proxy saw.
        ("10.0.0.5", "1.2.3.4, 203.0.113.9", 0, ["10.0.0.0/8"], "203.0.113.9"),
        # Two trusted hops (CDN in the range, then the load balancer): read past both.
        ("10.0.0.5", "1.2.3.4, 203.0.113.9, 10.0.0.9", 0, ["10.0.0.0/8"], "203.0.113.9"),
        # A hop count: one load balancer whatever its address.
        ("192.0.2.10", "1.2.3.4, 203.0.113.9", 1, [], "203.0.113.9"),
        ("192.0.2.10", "1.2.3.4, 203.0.113.9", 2, [], "1.2.3.4"),
        # A peer outside the range is the client even when a trusted address appears in its header.
        ("203.0.113.50", "10.0.0.1", 0, ["10.0.0.0/8"], "203.0.113.50"),
        # A trusted proxy that passed on garbage: the proxy is the last address anyone vouches for.
        ("10.0.0.5", "not-an-address", 0, ["10.0.0.0/8"], "10.0.0.5"),
        # Ports and brackets as proxies write them; IPv4-mapped IPv6 as the IPv4 address it is.
        ("10.0.0.5", "203.0.113.9:51234", 0, ["10.0.0.0/8"], "203.0.113.9"),
        ("10.0.0.5", "[2001:db8::1]:443", 0, ["10.0.0.0/8"], "2001:db8::1"),
        ("::ffff:10.0.0.5", "203.0.113.9", 0, ["10.0.0.0/8"], "203.0.113.9"),
        # No header at all: the peer.
        ("10.0.0.5", None, 1, ["10.0.0.0/8"], "10.0.0.5"),
    ],
)
def test_trusted_proxies_are_read_past_from_the_right(settings, remote, forwarded, count, cidrs, client):
    assert _address(settings, remote, forwarded, count=count, cidrs=cidrs) == client
