"""Running the machine's own tools (ip, nft, mount, losetup) with errors that say what failed."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from lab.errors import LabError, LabMissingTool, LabNotRoot

# The programs the lab runs on the machine, and the Debian package that ships each one.
REQUIRED_TOOLS: dict[str, str] = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "nft": "nftables",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "losetup": "util-linux",
    "mount": "mount",
}


def require_root_and_tools(tools: Sequence[str] = tuple(REQUIRED_TOOLS)) -> None:
    """Refuse early, naming what to install, instead of failing halfway through a boot."""
    if os.geteuid() != 0:
        raise LabNotRoot("the lab needs root (namespaces, mounts, links): run it with sudo")
    missing = sorted({REQUIRED_TOOLS[tool] for tool in tools if shutil.which(tool) is None})
    if missing:
        raise LabMissingTool(
            f"missing {', '.join(missing)}: run scripts/install-debian-packages.sh "
            f"(or apt-get install {' '.join(missing)})"
        )


def run(argv: Sequence[str], *, check: bool = True, input: str | None = None) -> str:
    """Run a command and return its stdout; a failure raises LabError with its stderr."""
    result = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit code {result.returncode}"
        raise LabError(f"{' '.join(argv[:4])}: {last}")
    return result.stdout


def succeeds(argv: Sequence[str]) -> bool:
    """Whether a command exits 0; for probes whose failure is an answer, not an error."""
    return subprocess.run(list(argv), capture_output=True, check=False).returncode == 0


def write_sysctl(key: str, value: int, *, at_least: bool = False) -> None:
    """Set a machine sysctl; with at_least, never lower a value someone already raised."""
    path = f"/proc/sys/{key.replace('.', '/')}"
    with open(path) as current:
        if at_least and int(current.read().split()[0]) >= value:
            return
    with open(path, "w") as target:
        target.write(str(value))
