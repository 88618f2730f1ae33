"""The lab's package cache: one apt-cacher-ng on the machine, shared by every lab's hosts.

Twelve hosts that each download the same packages from the Debian mirror spend most of a first
apply waiting on it; a cache on the machine fetches each package once. The lab runs its own
apt-cacher-ng (own configuration, cache and port) instead of the package's system service, so
it works the same on a machine without systemd and never opens a proxy on other interfaces:
it listens on 127.0.0.1 only, and each lab's nftables table forwards the bridge's gateway
address on the cache's port to it (see network.ensure_nat). It fetches only from the Debian
mirror the machine itself uses (ForceManaged: every other upstream is refused with 403).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from lab import processes
from lab.errors import LabError
from lab.rootfs import Mirror

BINARY = "/usr/sbin/apt-cacher-ng"
# One above apt-cacher-ng's default 3142, which Debian's own service takes where it runs.
PORT = 3143
LISTEN = "127.0.0.1"
# Outside the repository and shared by every lab, like the cached root filesystem.
CACHE_DIR = Path("/var/cache/gpuinfra/apt-cache")
RUN_DIR = Path("/var/lib/gpuinfra/apt-cache")
START_TIMEOUT_S = 10.0
# GPUINFRA_LAB_APT_CACHE=off: hosts download straight from the mirror (to compare, or where the
# machine already sits beside a mirror).
SWITCH = "GPUINFRA_LAB_APT_CACHE"


def available() -> bool:
    """Whether the lab uses the cache: apt-cacher-ng is installed (scripts/install-debian-
    packages.sh installs it) and GPUINFRA_LAB_APT_CACHE is not "off"."""
    return Path(BINARY).is_file() and os.environ.get(SWITCH, "on") != "off"


def proxy_url(gateway: str) -> str:
    """What a lab host's apt uses as its HTTP proxy: the lab bridge's gateway, on the cache's
    port (the lab's nftables table sends it on to 127.0.0.1)."""
    return f"http://{gateway}:{PORT}"


def config_text(mirror: Mirror) -> str:
    """acng.conf for the lab's instance: the machine's mirror, and nothing else, upstream."""
    lines = [
        "# Written by gpuinfra lab (lab/aptcache.py); rewritten on every `lab up`.",
        f"CacheDir: {CACHE_DIR}",
        f"LogDir: {RUN_DIR / 'log'}",
        "SupportDir: /usr/lib/apt-cacher-ng",
        f"BindAddress: {LISTEN}:{PORT}",
        f"SocketPath: {RUN_DIR / 'socket'}",
        f"PidFile: {RUN_DIR / 'pid'}",
        # Only the Remap- lines below may be fetched from: a host cannot use the cache to reach
        # anything but the Debian mirror the machine itself uses.
        "ForceManaged: 1",
        "ExThreshold: 4",
    ]
    for index, url in enumerate(u for u in (mirror.archive, mirror.security) if u):
        parts = urlsplit(url)
        # Requests name the mirror as apt sees it (http://deb.debian.org/debian/...); they are
        # served from, and fetched into, the cache under the same name.
        lines.append(f"Remap-gpuinfra{index}: {parts.netloc}{parts.path} ; {url}")
    return "\n".join(lines) + "\n"


def ensure_running(mirror: Mirror) -> int:
    """Start the cache unless it runs with this very configuration; returns its process id."""
    conf_dir = RUN_DIR / "conf"
    conf = conf_dir / "acng.conf"
    wanted = config_text(mirror)
    pid = _running_pid()
    # A cache whose folder was removed under it answers every request with a 500: start it
    # again (seen when the folder was deleted by hand while the cache ran).
    if pid is not None and conf.is_file() and conf.read_text() == wanted and CACHE_DIR.is_dir():
        return pid
    if pid is not None:
        processes.stop([pid], deadline_s=5)
    for folder in (conf_dir, RUN_DIR / "log", CACHE_DIR):
        folder.mkdir(parents=True, exist_ok=True)
    # The package ships its own user; without it (a copied binary) the cache runs as root.
    owner = "apt-cacher-ng" if _user_exists("apt-cacher-ng") else None
    for folder in (RUN_DIR / "log", CACHE_DIR, RUN_DIR):
        if owner:
            shutil.chown(folder, owner, owner)
    conf.write_text(wanted)
    (RUN_DIR / "pid").unlink(missing_ok=True)
    argv = [BINARY, "-c", str(conf_dir)]
    # It daemonises itself and writes its PidFile; start it in its own session so it outlives
    # the `gpuinfra lab up` that started it.
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        check=False,
        start_new_session=True,
        user=owner,
    )
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit code {result.returncode}"
        raise LabError(f"apt-cacher-ng did not start: {last}")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        pid = _running_pid()
        if pid is not None and _answers():
            return pid
        time.sleep(0.1)
    raise LabError(f"apt-cacher-ng did not answer on {LISTEN}:{PORT}; see {RUN_DIR / 'log'}")


def empty() -> None:
    """Stop the cache and remove every package it holds (the next `lab up` starts it again,
    empty: what a fresh machine's first bootstrap sees)."""
    pid = _running_pid()
    if pid is not None:
        processes.stop([pid], deadline_s=5)
    shutil.rmtree(CACHE_DIR, ignore_errors=True)


def _running_pid() -> int | None:
    try:
        pid = int((RUN_DIR / "pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if not processes.alive(pid) or b"apt-cacher-ng" not in cmdline:
        return None
    return pid


def _answers() -> bool:
    try:
        with socket.create_connection((LISTEN, PORT), timeout=1):
            return True
    except OSError:
        return False


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
