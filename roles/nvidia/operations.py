"""Operations of the nvidia role. Each decides per host inside itself (containers, a driver
that is not loaded, NVSwitch present or not), so every GPU worker runs the same operations."""

from __future__ import annotations

import shlex
from fnmatch import fnmatchcase

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Which

from roles.nvidia.facts import DriverLoaded, NvswitchDevices
from roles.nvidia.packages import Missing, Package
from toolkit.facts import Container, HeldPackages, UnitState
from toolkit.operations import reboot_flag_commands, report_note

APT_INSTALL = (
    "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
    "--allow-downgrades --allow-change-held-packages"
)
DRIVER_REBOOT_REASON = "gpuinfra-nvidia-driver"


def differences(
    packages: list[Package], installed: dict[str, list[str]], held: list[str]
) -> tuple[list[Package], list[Package], list[str]]:
    """(to install, to hold, what differs in words) for packages against their pins."""
    to_install, to_hold, said = [], [], []
    for package in packages:
        versions = installed.get(package.name) or []
        if not versions:
            to_install.append(package)
            said.append(f"{package.name}: not installed (pinned {package.version})")
        elif not any(fnmatchcase(v, package.version) for v in versions):
            to_install.append(package)
            said.append(
                f"{package.name}: installed {', '.join(versions)}, pinned {package.version}"
            )
        if package.name not in held:
            to_hold.append(package)
            if versions:
                said.append(f"{package.name}: not held (apt-mark hold)")
    return to_install, to_hold, said


@operation()
def packages_pinned(packages: list[Package]):
    """Install the stack's packages at their pins (apt preferences select the version) and hold
    them. Each difference is named in the run report (drift says which package moved); a
    driver change marks the host "reboot required"."""
    yield from _pin_commands(packages)


def _pin_commands(packages: list[Package]):
    installed = host.get_fact(DebPackages) or {}
    held = host.get_fact(HeldPackages) or []
    to_install, to_hold, said = differences(packages, installed, held)
    for line in said:
        report_note(line)
    if to_install:
        yield f"{APT_INSTALL} {' '.join(shlex.quote(p.name) for p in to_install)}"
        if any(p.part in ("driver", "module") for p in to_install):
            yield from reboot_flag_commands(DRIVER_REBOOT_REASON)
    if to_hold:
        yield f"apt-mark hold {' '.join(shlex.quote(p.name) for p in to_hold)}"


@operation()
def module_packages_pinned(packages: list[Package]):
    """The kernel module (DKMS or Canonical's precompiled one) where a module can load; a
    container shares the machine's kernel, so there it is reported and not installed."""
    container = host.get_fact(Container)
    if container:
        names = ", ".join(p.name for p in packages)
        report_note(
            f"NVIDIA kernel module ({names}): not installed in a container ({container}): no "
            "kernel module can load here, so nvidia-smi cannot reach a driver"
        )
        return
    yield from _pin_commands(packages)


@operation()
def unavailable_reported(missing: list[Missing], source: str, os_name: str):
    """What the host needs and its source cannot provide: one line each in the plan and run
    report, naming the package and the source (never a silent skip)."""
    for item in missing:
        report_note(item.note(source, os_name))
    return
    yield  # an operation is a generator


@operation()
def initramfs_updated():
    """Rebuild the initramfs so the nouveau blacklist holds from early boot; a host without
    update-initramfs (a container) says so."""
    if host.get_fact(Container) or not host.get_fact(Which, command="update-initramfs"):
        host.noop("no initramfs here: the nouveau blacklist applies when modules load")
        return
    yield "update-initramfs -u"


@operation()
def driver_service_running(unit: str):
    """Enable a service that talks to the GPUs (nvidia-persistenced) and start it where the
    driver is loaded; without the driver it is enabled and starts with it at boot."""
    state = host.get_fact(UnitState, unit=unit) or {}
    commands = []
    if state.get("UnitFileState") not in ("enabled", "static", "alias"):
        commands.append(f"systemctl enable {shlex.quote(unit)}")
    # Notes before commands: a plan stops reading an operation at its first command.
    if not host.get_fact(DriverLoaded):
        report_note(f"{unit}: enabled; not started, no NVIDIA driver is loaded")
    elif state.get("ActiveState") != "active":
        commands.append(f"systemctl restart {shlex.quote(unit)}")
    yield from commands


@operation()
def fabricmanager_running(expected: bool, why: str):
    """Fabric manager on NVSwitch systems: the inventory's GPU model decides (`expected`), the
    driver's /proc/driver/nvidia-nvswitch/devices confirms; a mismatch is reported."""
    if not expected:
        return
    unit = "nvidia-fabricmanager"
    devices = host.get_fact(NvswitchDevices) or []
    state = host.get_fact(UnitState, unit=f"{unit}.service") or {}
    commands = []
    if state.get("UnitFileState") not in ("enabled", "static"):
        commands.append(f"systemctl enable {unit}")
    if not devices:
        report_note(
            f"{unit}: expected ({why}) but /proc/driver/nvidia-nvswitch/devices lists no "
            "NVSwitch (driver not loaded, or not an NVSwitch board): enabled, not started"
        )
    elif state.get("ActiveState") != "active":
        commands.append(f"systemctl restart {unit}")
    yield from commands
