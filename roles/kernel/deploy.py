"""The kernel role: sysctls, modules, kernel command line, swap, CPU governor, transparent huge
pages, resource limits and an optional pinned kernel, with "reboot required" where it matters."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server, systemd

from roles.kernel import files as kernel_files
from roles.kernel.files import (
    GOVERNOR_UNIT,
    GRUB_FILE,
    LIMITS_FILE,
    MODULES_FILE,
    SYSCTL_FILE,
    SYSTEMD_LIMITS_FILE,
    THP_UNIT,
    host_modules,
    kernel_settings,
)
from roles.kernel.operations import (
    grub_updated,
    kernel_package_held,
    modules_loaded,
    swap_off,
    swap_out_of_fstab,
    sysctls_live,
    sysfs_setting,
)
from toolkit.effective import (
    GrubAssignments,
    ModprobeBlocks,
    declared_files,
    grub_assignments,
    grub_overridden,
    limits_not_overridden,
    modules_blocked,
    nothing_overrides,
    overridden_later,
)
from toolkit.operations import enable_at_boot, put_file, reboot_required
from toolkit.spec import HostContext

# Where systemd-sysctl and systemd read these at boot, the earlier folder hiding a file of the
# same name in a later one (sysctl.d(5), systemd-system.conf(5)).
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d")
SYSTEM_CONF_DIRS = tuple(
    f"{root}/systemd/system.conf.d" for root in ("/etc", "/run", "/usr/local/lib", "/usr/lib")
)
GOVERNOR_FILES = "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"
THP_FILES = "/sys/kernel/mm/transparent_hugepage/enabled"


@deploy("Kernel")
def apply(ctx: HostContext) -> None:
    cfg = kernel_settings(ctx)
    managed = {f.path: f for f in kernel_files.managed_files(ctx)}
    written = {path: put_file(f) for path, f in managed.items()}
    # Modules first: br_netfilter provides the net.bridge sysctls set below.
    modules_loaded(name="Load kernel modules", modules=host_modules(ctx), persisted_in=MODULES_FILE)
    sysctls_live(
        name="Apply sysctls",
        values=cfg.effective_sysctls(),
        persisted_in=f"persisted in {SYSCTL_FILE}",
    )
    swap_off(name="Turn swap off")
    swap_out_of_fstab(name="Keep swap off after reboot")

    grub = written[GRUB_FILE]
    grub_updated(name="Update GRUB for the kernel command line", _if=grub.did_change)
    reboot_required(
        name="Require a reboot for the kernel command line",
        reason="gpuinfra-kernel-cmdline",
        _if=grub.did_change,
    )
    kernel_package_held(
        name="Install and hold the pinned kernel",
        package=cfg.kernel_package,
        version=cfg.kernel_version,
    )

    units = [GOVERNOR_UNIT, THP_UNIT]
    systemd.daemon_reload(
        name="Reload systemd for new units",
        _if=[lambda: any(written[f"/etc/systemd/system/{u}"].did_change() for u in units)],
    )
    for unit in units:
        enable_at_boot(managed[f"/etc/systemd/system/{unit}"], name=f"Enable {unit} at boot")
    sysfs_setting(
        name="Set the CPU governor",
        pattern=GOVERNOR_FILES,
        value=cfg.cpu_governor,
        what="CPU governor",
        persisted_by=GOVERNOR_UNIT,
    )
    sysfs_setting(
        name="Set transparent huge pages",
        pattern=THP_FILES,
        value=cfg.transparent_hugepages,
        what="transparent huge pages",
        persisted_by=THP_UNIT,
    )
    # New default limits reach services started after the manager re-executes.
    server.shell(
        name="Re-execute systemd for new default limits",
        commands=["systemctl daemon-reexec"],
        _if=written[SYSTEMD_LIMITS_FILE].did_change,
    )
    server.shell(
        name="Check systemd's default limits",
        commands=[
            "systemctl show --property=DefaultLimitNOFILE "
            f"| grep -qx 'DefaultLimitNOFILE={cfg.nofile}'"
        ],
        _if=written[SYSTEMD_LIMITS_FILE].did_change,
    )
    declared = declared_files(ctx.settings_of("base"))
    overridden_later(
        "Check that no sysctl file overrides ours at boot",
        SYSCTL_DIRS,
        SYSCTL_FILE,
        managed[SYSCTL_FILE].content,
        declared,
        "sysctl",
    )
    names = tuple(grub_assignments(managed[GRUB_FILE].content))
    grub_lines = host.get_fact(GrubAssignments, names=names)
    nothing_overrides(
        "Check that no grub.d file drops our kernel arguments",
        grub_overridden(grub_lines or [], GRUB_FILE, declared),
    )
    modules = tuple(host_modules(ctx))
    if modules:
        blocks = host.get_fact(ModprobeBlocks, modules=modules)
        nothing_overrides(
            "Check that no modprobe.d file stops our modules",
            modules_blocked(blocks or [], declared),
        )
    limits_not_overridden(
        "Check that no limits.d file overrides ours",
        LIMITS_FILE,
        managed[LIMITS_FILE].content,
        declared,
    )
    overridden_later(
        "Check that no systemd setting overrides our limits",
        SYSTEM_CONF_DIRS,
        SYSTEMD_LIMITS_FILE,
        managed[SYSTEMD_LIMITS_FILE].content,
        declared,
        "systemd",
    )
