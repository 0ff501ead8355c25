"""What a server installing its OS needs from the platform: where to report (the installer callback), and for a PXE
boot its iPXE script and unattended-install config.

A booting server holds no secret yet, so, as MAAS and Ironic do on their provisioning networks, the platform knows it
by its address: the site's DHCP hands every server the same script URL, and the platform answers each with the script
of the run waiting to install it, found by the node's address (`Node.os_address`). No token is in any URL (URL paths
end up in access logs): the installer's token, which alone can report the install, is only inside the install config
(user-data), served to that address only.

The install config is cloud-init user-data for Ubuntu's autoinstall (NoCloud over HTTP: `ds=nocloud-net;s=<seed>/`
makes the installer fetch `<seed>/user-data` and `<seed>/meta-data`). Ubuntu Server dropped debian-installer preseed
for autoinstall in 20.04, the GPU OS images here are Ubuntu, and the same cloud-init reads the seed on other
distributions' cloud images; preseed would serve Debian's installer only.
"""

import ipaddress
import json
import socket

import yaml
from django.conf import settings
from django.urls import reverse

from provisioning.models import ProvisioningRun


def public_url(path: str) -> str:
    return settings.PUBLIC_BASE_URL.rstrip("/") + path


def callback_url() -> str:
    return public_url(reverse("provisioning-installer-callback"))


def script_url() -> str:
    """The one URL the site's DHCP / iPXE chain hands every server."""
    return public_url(reverse("provisioning-netboot-script"))


def seed_url() -> str:
    """The NoCloud seed directory: `user-data` and `meta-data` below it."""
    return public_url(reverse("provisioning-netboot-user-data")).removesuffix("user-data")


def node_addresses(os_address: str) -> frozenset[str]:
    """The addresses a node's installer calls from, as far as the platform knows them: its `os_address` (an IP, or a
    name resolved now), without the port. Empty when it names none or the name does not resolve."""
    host = _host_of(os_address.strip())
    if not host:
        return frozenset()
    try:
        return frozenset({normalized_address(host)})
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return frozenset()
    return frozenset(normalized_address(entry[4][0]) for entry in found)


def normalized_address(address: str) -> str:
    """One spelling per address (an IPv4-mapped IPv6 address is the IPv4 one); ValueError when it is no IP."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def _host_of(address: str) -> str:
    """`host`, `host:port`, `[v6]:port` or a bare IPv6 address -> the host."""
    if address.startswith("["):
        return address[1:].partition("]")[0]
    return address.rpartition(":")[0] if address.count(":") == 1 else address


def ipxe_script(run: ProvisioningRun) -> str:
    profile = run.request.approved_spec["bare_metal_profile"]
    files = profile["netboot"]
    # casper fetches the installer ISO from `url=`; autoinstall answers every question from the seed.
    arguments = " ".join(
        filter(
            None,
            [
                "ip=dhcp",
                f"url={profile['os_image_url']}",
                "autoinstall",
                f"ds=nocloud-net;s={seed_url()}",
                files.get("arguments", ""),
            ],
        )
    )
    lines = [
        "#!ipxe",
        f"# Provisioning run #{run.pk}: {profile['os_image']} on {run.allocation.node.name}",
        f"kernel {files['kernel']} {arguments}",
        f"initrd {files['initrd']}",
        "boot",
    ]
    return "\n".join(lines) + "\n"


def user_data(run: ProvisioningRun, token: str) -> str:
    """Autoinstall answers, and the callback reported from the installer when it finishes or fails (the token is in
    this document only)."""
    node = run.allocation.node.name
    autoinstall = {
        "version": 1,
        # The account is the requester's, locked until the in-band steps install their access.
        "identity": {"hostname": node, "username": run.request.requester.username, "password": "!"},
        "ssh": {"install-server": True, "allow-pw": False},
        "late-commands": [_report(token, "succeeded")],
        "error-commands": [_report(token, "failed")],
    }
    return "#cloud-config\n" + yaml.safe_dump({"autoinstall": autoinstall}, sort_keys=False)


def meta_data(run: ProvisioningRun) -> str:
    return yaml.safe_dump({"instance-id": f"provisioning-run-{run.pk}", "local-hostname": run.allocation.node.name})


def _report(token: str, status: str) -> str:
    body = json.dumps({"token": token, "status": status})
    return f"curl -fsS --retry 5 -X POST -H 'Content-Type: application/json' -d '{body}' {callback_url()}"
