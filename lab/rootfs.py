"""The cached Debian 13 root filesystem every lab host boots from, built once per machine."""

from __future__ import annotations

import fcntl
import ipaddress
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from lab.errors import LabError
from lab.system import run

SUITE = "trixie"
# Outside the repository: the root is 319 MB and shared by every lab on the machine.
CACHE_DIR = Path("/var/cache/gpuinfra/rootfs")
# What a lab host needs to boot, be reached over SSH and be configured by pyinfra (LAB.md).
INCLUDE = ("systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "iproute2", "sudo")
APT_SOURCE_FILES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


@dataclass(frozen=True)
class Mirror:
    """Where the machine itself gets Debian from; the lab's hosts use the same place."""

    archive: str  # e.g. http://deb.debian.org/debian
    security: str | None  # e.g. http://deb.debian.org/debian-security, when the machine has one

    @property
    def hostnames(self) -> list[str]:
        """Host names the lab hosts must resolve (through /etc/hosts: they have no DNS)."""
        urls = [self.archive] + ([self.security] if self.security else [])
        return sorted({urlsplit(url).hostname or "" for url in urls} - {""})


def machine_mirror(sources: tuple[Path, ...] = APT_SOURCE_FILES) -> Mirror:
    """Read the Debian archive (and security archive) from the machine's apt sources."""
    uris: list[str] = []
    for source in sources:
        files = sorted(source.glob("*")) if source.is_dir() else [source]
        for path in files:
            if path.is_file() and path.suffix in (".list", ".sources"):
                uris += _deb_uris(path.read_text(), deb822=path.suffix == ".sources")
    archives = [uri for uri in uris if uri.rstrip("/").endswith("/debian")]
    if not archives:
        where = ", ".join(str(path) for path in sources)
        raise LabError(f"no Debian archive (a URI ending in /debian) in {where}")
    security = [uri for uri in uris if uri.rstrip("/").endswith("/debian-security")]
    return Mirror(archives[0].rstrip("/"), security[0].rstrip("/") if security else None)


def _deb_uris(text: str, *, deb822: bool) -> list[str]:
    """URIs of binary (deb) sources, in file order, in either apt source format."""
    uris: list[str] = []
    if not deb822:
        for line in text.splitlines():
            words = [word for word in line.split("#", 1)[0].split() if not word.startswith("[")]
            if len(words) >= 3 and words[0] == "deb":
                uris.append(words[1])
        return uris
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if ":" in line and not line.startswith(("#", " ", "\t")):
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
            uris += fields.get("uris", "").split()
    return uris


def cached_root(suite: str = SUITE) -> Path:
    return CACHE_DIR / suite


def ensure_root(mirror: Mirror, suite: str = SUITE) -> tuple[Path, float | None]:
    """The cached root, built first if absent; returns it and the build time (None: cached).

    The build goes to a temporary folder that is renamed only once complete, so a crash or
    Ctrl-C never leaves a half-built root that later boots would trust.
    """
    root = cached_root(suite)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f".{suite}.lock", "w") as lock:
        # Two labs starting at once must not both build (or one use the other's half root).
        fcntl.flock(lock, fcntl.LOCK_EX)
        if root.is_dir():
            return root, None
        for stale in CACHE_DIR.glob(f".{suite}.build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        build = Path(tempfile.mkdtemp(prefix=f".{suite}.build-", dir=CACHE_DIR))
        try:
            debootstrap(build, mirror, suite)
            _generalise(build)
            build.chmod(0o755)
            build.rename(root)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
        return root, time.monotonic() - started


def debootstrap(
    build: Path, mirror: Mirror, suite: str, include: tuple[str, ...] = INCLUDE
) -> None:
    included = [f"--include={','.join(include)}"] if include else []
    argv = ["debootstrap", "--variant=minbase", *included, suite, str(build), mirror.archive]
    log = build.parent / f".{suite}.debootstrap.log"
    with log.open("w") as output:
        result = subprocess.run(argv, stdout=output, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        raise LabError(f"debootstrap {suite} failed ({tail[0]}); full log in {log}")


def _generalise(root: Path) -> None:
    """Remove what must differ per host, so no two hosts ever share it."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # An empty machine-id is replaced per host before boot; a shared one confuses journald/DHCP.
    (root / "etc/machine-id").write_text("")
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    # Sources are written per host (the machine's mirror, with non-free): drop debootstrap's.
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    for package in (root / "var/cache/apt/archives").glob("*.deb"):
        package.unlink()


def resolve_mirror(mirror: Mirror) -> list[tuple[str, str]]:
    """(address, name) of the mirror as the machine resolves it, for the hosts' /etc/hosts."""
    entries = []
    for hostname in mirror.hostnames:
        try:
            ipaddress.ip_address(hostname)
            continue  # a literal address needs no entry
        except ValueError:
            pass
        output = run(["getent", "hosts", hostname], check=False).split()
        if not output:
            raise LabError(f"the machine cannot resolve the Debian mirror {hostname}")
        entries.append((output[0], hostname))
    return entries
