#!/bin/sh
# Install the Debian packages `gpuinfra lab` needs on the machine that runs it; safe to rerun.
set -eu

PACKAGES="debootstrap systemd-container iproute2 nftables openssh-client util-linux"

if [ "$(id -u)" -ne 0 ]; then
    echo "error: run as root (apt-get installs system packages)" >&2
    exit 2
fi

missing=""
for package in $PACKAGES; do
    # dpkg-query answers "install ok installed" only for a fully configured package.
    status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
    if [ "$status" != "install ok installed" ]; then
        missing="$missing $package"
    fi
done

if [ -z "$missing" ]; then
    echo "all lab packages are installed:$(printf ' %s' $PACKAGES)"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086 # the package list is meant to split into words
apt-get install -y --no-install-recommends $missing
