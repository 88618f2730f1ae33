"""Operations of the kernel role. Each decides per host inside itself (containers, GPU workers,
missing modules), so every host of the phase runs the same sequence of operations."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.server import Which

from roles.kernel.facts import (
    ActiveSwap,
    KernelModules,
    PackageVersion,
    SwapInFstab,
    SysctlState,
    SysfsValues,
)
from toolkit.facts import Container
from toolkit.operations import reboot_flag_commands, report_note

# What an operator reads in the report for settings the host cannot take live.
PERSISTED = "persisted for the next boot"


@operation()
def sysctls_live(values: dict[str, str], persisted_in: str):
    """Set each sysctl live where the kernel lets us; a read-only one (global sysctls in a
    container) or an absent one (its module is not loaded) is reported, not failed: the file
    `persisted_in` sets it at the next boot."""
    state = host.get_fact(SysctlState, names=sorted(values)) or {}
    commands = []
    # Notes first, commands after: pyinfra stops reading a generator at its first command
    # when it only asks whether anything would change (plans).
    for name, wanted in values.items():
        access, current = state.get(name, ("absent", ""))
        if current.split() == str(wanted).split():
            continue
        if access == "rw":
            commands.append(f"sysctl -q -w {shlex.quote(f'{name}={wanted}')}")
        elif access == "ro":
            report_note(f"{name}: read-only here (is {current}, wants {wanted}); {persisted_in}")
        else:
            report_note(
                f"{name}: not here (its module is not loaded, or it exists only outside this "
                f"network namespace); {persisted_in}"
            )
    yield from commands


@operation()
def modules_loaded(modules: list[str], persisted_in: str):
    """modprobe each module not loaded yet. A container cannot load modules, and a module that
    is not installed (nvidia-peermem before the driver) cannot load yet: both are reported, and
    `persisted_in` loads them at boot."""
    state = host.get_fact(KernelModules, modules=modules) or {}
    wanted = [module for module in modules if state.get(module) != "loaded"]
    if not wanted:
        return
    container = host.get_fact(Container)
    commands = []
    for module in wanted:
        if container:
            report_note(f"module {module}: cannot load in a container ({container}); {PERSISTED}")
        elif state.get(module) == "missing":
            report_note(f"module {module}: not installed yet; loads at boot from {persisted_in}")
        else:
            commands.append(f"modprobe {shlex.quote(module)}")
    yield from commands


@operation()
def swap_off():
    """Turn every swap area off now (kubelet refuses to run with swap by default)."""
    active = host.get_fact(ActiveSwap) or []
    if not active:
        return
    container = host.get_fact(Container)
    if container:
        report_note(f"swap {', '.join(active)} belongs to the machine running this container")
        return
    yield "swapoff -a"


@operation()
def swap_out_of_fstab():
    """Comment out swap entries in /etc/fstab so swap stays off after a reboot."""
    if not host.get_fact(SwapInFstab):
        return
    yield (
        "sed -i -E '/^[[:space:]]*[^#[:space:]]+[[:space:]]+[^[:space:]]+[[:space:]]+swap"
        "([[:space:]]|$)/s/^/#gpuinfra swap off# /' /etc/fstab"
    )


@operation()
def sysfs_setting(pattern: str, value: str, what: str, persisted_by: str):
    """Write `value` to every sysfs file matching `pattern` (CPU governor, THP) where it differs;
    nothing to write (no cpufreq in a VM) or a read-only /sys (a container) is reported, and
    the unit `persisted_by` sets it at every boot."""
    files = host.get_fact(SysfsValues, pattern=pattern) or {}
    if not files:
        report_note(f"{what}: no {pattern} on this host; {persisted_by} sets it where present")
        return
    differing = {path: entry for path, entry in sorted(files.items()) if entry[1] != value}
    read_only = [path for path, (access, _) in differing.items() if access != "rw"]
    if read_only:
        current = differing[read_only[0]][1]
        report_note(
            f"{what}: {read_only[0]} is read-only here (is {current}); {persisted_by} {PERSISTED}"
        )
        return
    for path in differing:
        yield f"echo {shlex.quote(value)} > {shlex.quote(path)}"


@operation()
def grub_updated():
    """Regenerate grub.cfg for a new command line; hosts without GRUB (containers, other boot
    loaders) report it instead."""
    if not host.get_fact(Which, command="update-grub"):
        # Logged only: a handler's body runs in every plan, fired or not.
        host.noop("no update-grub here: the kernel command line drop-in waits for GRUB")
        return
    yield "update-grub"


@operation()
def kernel_package_held(package: str | None, version: str | None):
    """Install the pinned kernel package (a change marks the host "reboot required") and hold it
    so unattended upgrades cannot move the kernel under the NVIDIA driver."""
    if not package:
        return
    installed = host.get_fact(PackageVersion, package=package)
    if installed is None or (version and installed["version"] != version):
        spec = f"{package}={version}" if version else package
        yield (
            "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
            f"--allow-downgrades --allow-change-held-packages {shlex.quote(spec)}"
        )
        yield from reboot_flag_commands(package)
    if installed is None or not installed["held"]:
        yield f"apt-mark hold {shlex.quote(package)}"
