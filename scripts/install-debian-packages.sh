#!/bin/sh
# Install the Debian packages `gpuinfra lab` needs on the machine that runs it; safe to rerun.
set -eu

# apt-cacher-ng: the lab's package cache (lab/aptcache.py), so a dozen hosts download each
# package from the mirror once.
# gcc, make, libc6-dev, bzip2: the conformance suite's busybox, built from source
# (lab/conformance.py says why).
PACKAGES="debootstrap systemd-container iproute2 nftables openssh-client util-linux apt-cacher-ng
gcc make libc6-dev bzip2"

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

# The lab runs its own apt-cacher-ng on 127.0.0.1 (lab/aptcache.py). The package's service
# would listen on every interface and fetch from any upstream: keep it off where this script
# installed it and systemd runs it.
case " $missing " in
*" apt-cacher-ng "*)
    if [ -d /run/systemd/system ]; then
        systemctl disable --now apt-cacher-ng.service || true
    fi
    ;;
esac
