"""The fabric role: the RDMA stack and its diagnostics pinned, NCCL's settings, locked memory
for sessions and container runtimes, and the IPoIB (or RoCE) interfaces' addresses."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from roles.fabric import files as fabric_files
from roles.fabric.files import (
    LIMITS_FILE,
    PREFERENCES,
    RUNTIME_UNITS,
    fabric_settings,
    network_file,
    port_slots,
    runtime_dropin,
)
from roles.fabric.operations import ports_present
from toolkit.effective import declared_files, limits_not_overridden
from toolkit.operations import put_file, restart_if_running, wait_for
from toolkit.spec import HostContext


@deploy("Fabric")
def apply(ctx: HostContext) -> None:
    cfg = fabric_settings(ctx)
    # First: a server missing its HCA is a hardware fault to fix, not a host to half configure.
    ports_present(
        name="Check that the fabric's ports exist",
        ports=tuple((port.device, port.port) for port in cfg.ports),
        standin=cfg.device_standin,
    )
    managed = {f.path: f for f in fabric_files.managed_files(ctx)}
    put_file(managed[PREFERENCES])
    apt.packages(
        name="Install the RDMA stack and diagnostics",
        packages=[
            f"{name}={version}" for name, version in cfg.package_pins(ctx.cluster.os).items()
        ],
        no_recommends=True,
    )
    written = {path: put_file(f) for path, f in managed.items() if path != PREFERENCES}
    # Slots no port of this host uses (another host has more ports): nothing stale left behind.
    for slot in range(len(cfg.ports), port_slots(ctx)):
        files.file(name=f"Remove {network_file(slot)}", path=network_file(slot), present=False)
    networks = [written[network_file(slot)] for slot in range(len(cfg.ports))]
    # networkd (Ubuntu's netplan runs it) takes the new addresses; where it does not run, the
    # files wait for it and the verify suite's interface check says so.
    server.shell(
        name="Reload systemd-networkd for the fabric's interfaces",
        commands=["if systemctl is-active -q systemd-networkd; then networkctl reload; fi"],
        _if=[lambda: any(op.did_change() for op in networks)],
    )
    dropins = [written[runtime_dropin(unit)] for unit in RUNTIME_UNITS]
    changed = [lambda: any(op.did_change() for op in dropins)]
    systemd.daemon_reload(name="Reload systemd for the runtimes' limits", _if=changed)
    for unit, ready in RUNTIME_UNITS.items():
        # Containers started from now on get the limit; running ones keep theirs.
        restart_if_running(
            name=f"Restart {unit} for its locked-memory limit", unit=unit, _if=changed
        )
        server.shell(
            name=f"Wait for {unit}",
            commands=[ready_after_restart(unit, ready)],
            _if=changed,
        )

    limits_not_overridden(
        "Check that no limits.d file overrides the fabric's locked memory",
        LIMITS_FILE,
        managed[LIMITS_FILE].content,
        declared_files(ctx.settings_of("base")),
    )


def ready_after_restart(unit: str, command: str, seconds: int = 60) -> str:
    """A readiness check of a unit that runs (a host without Docker has nothing to wait for):
    the toolkit's wait_for, skipped where the unit is not active."""
    return f"systemctl is-active -q {unit} || exit 0; {wait_for(command, seconds)}"
