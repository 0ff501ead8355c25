#!/bin/sh
# Writes the root filesystem of a bare-metal test host to the tar file named by $1: what the OS installer leaves on
# a server (a minimal Debian 12 by debootstrap, no registry; OpenSSH and Python for Ansible) plus the site's package
# mirror as a flat apt repository in /srv/site-mirror (prometheus-node-exporter, munge, slurmd, slurmctld, sudo and
# what they need), the only apt source the host has: the test containers cannot reach Debian's mirrors, a site's
# servers reach their own. Nothing from the mirror is installed here; the playbooks install it.
set -eu
output="$1"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$mirror"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The host has no init: no package starts a service on install (the playbooks start what they install).
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
chroot "$root" apt-get update -q
DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q --no-install-recommends \
    openssh-server python3 python3-apt apt-utils
chroot "$root" apt-get clean
DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q --no-install-recommends --download-only \
    prometheus-node-exporter munge slurmd slurmctld slurm-client sudo
mkdir -p "$root/srv/site-mirror"
mv "$root"/var/cache/apt/archives/*.deb "$root/srv/site-mirror/"
chroot "$root" sh -c 'cd /srv/site-mirror && apt-ftparchive packages . > Packages'
rm -f "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*
echo 'deb [trusted=yes] file:/srv/site-mirror ./' > "$root/etc/apt/sources.list.d/site-mirror.list"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/etc/ssh/ssh_host_* "$root/etc/resolv.conf"
tar --numeric-owner -C "$root" -cf "$output.partial" .
mv "$output.partial" "$output"
