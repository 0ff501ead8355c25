#!/bin/sh
# Writes the image's root filesystem to the tar file named by $1: a minimal Debian 12 (debootstrap, no registry)
# with OpenSSH and Jupyter Notebook installed by apt inside it (debootstrap itself resolves no virtual packages).
set -eu
output="$1"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$mirror"
cp /etc/resolv.conf "$root/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"  # install services, start none
chmod +x "$root/usr/sbin/policy-rc.d"
chroot "$root" apt-get update -q
DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q --no-install-recommends \
    openssh-server python3-notebook
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/etc/ssh/ssh_host_* "$root/usr/sbin/policy-rc.d" "$root/etc/resolv.conf"
tar --numeric-owner -C "$root" -cf "$output.partial" .
mv "$output.partial" "$output"
