"""What a server installing its OS needs from the platform: where to report (the installer callback), and for a PXE
boot the per-run iPXE script and the unattended-install config, all carried by the run's one-time token.

The install config is cloud-init user-data for Ubuntu's autoinstall (NoCloud over HTTP: `ds=nocloud-net;s=<seed>/`
makes the installer fetch `<seed>/user-data` and `<seed>/meta-data`). Ubuntu Server dropped debian-installer preseed
for autoinstall in 20.04, the GPU OS images here are Ubuntu, and the same cloud-init reads the seed on other
distributions' cloud images; preseed would serve Debian's installer only.
"""

import yaml
from django.conf import settings
from django.urls import reverse

from provisioning.models import ProvisioningRun


def public_url(path: str) -> str:
    return settings.PUBLIC_BASE_URL.rstrip("/") + path


def callback_url() -> str:
    return public_url(reverse("provisioning-installer-callback"))


def seed_url(token: str) -> str:
    """The NoCloud seed directory: `user-data` and `meta-data` below it."""
    return public_url(reverse("provisioning-netboot-user-data", kwargs={"token": token})).removesuffix("user-data")


def script_url(token: str) -> str:
    return public_url(reverse("provisioning-netboot-script", kwargs={"token": token}))


def ipxe_script(run: ProvisioningRun, token: str) -> str:
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
                f"ds=nocloud-net;s={seed_url(token)}",
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
    """Autoinstall answers, and the callback reported from the installer when it finishes or fails."""
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
    body = f'{{"token": "{token}", "status": "{status}"}}'
    return f"curl -fsS --retry 5 -X POST -H 'Content-Type: application/json' -d '{body}' {callback_url()}"
