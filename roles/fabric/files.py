"""Files the fabric role manages on GPU workers: NCCL's settings, locked-memory limits for
sessions and the container runtimes, and one systemd-networkd file per fabric port."""

from __future__ import annotations

from inventory.model import LoadedCluster
from roles.fabric.config import FabricConfig
from roles.fabric.role import GROUPS
from toolkit.spec import HostContext, ManagedFile, host_config
from toolkit.templates import render_template

NCCL_CONF = "/etc/nccl.conf"
LIMITS_FILE = "/etc/security/limits.d/91-gpuinfra-fabric.conf"
PREFERENCES = "/etc/apt/preferences.d/gpuinfra-fabric"
# The runtimes whose containers need the limit (containerd: kubelet's pods; Docker), each with
# the command that answers once it serves again.
RUNTIME_UNITS = {"containerd": "ctr version", "docker": "docker info"}
NETWORK_DIR = "/etc/systemd/network"


def fabric_settings(ctx: HostContext) -> FabricConfig:
    return ctx.config(FabricConfig)


def runtime_dropin(unit: str) -> str:
    return f"/etc/systemd/system/{unit}.service.d/50-gpuinfra-fabric.conf"


def network_file(slot: int) -> str:
    """The networkd file of the host's slot-th port. Named by slot, not by interface: pyinfra
    matches operations by position, so every fabric host writes (or removes) the same paths."""
    return f"{NETWORK_DIR}/60-gpuinfra-fabric{slot}.network"


# Loads seen lately -> their slot count, the load kept so its id is not reused: every host
# asks, and a scan of the fleet per host would cost O(fleet^2).
_slots_seen: dict[int, tuple[LoadedCluster, int]] = {}


def port_slots(ctx: HostContext) -> int:
    """How many port files every fabric host of the cluster handles: the most ports any has."""
    seen = _slots_seen.get(id(ctx.loaded))
    if seen is not None and seen[0] is ctx.loaded:
        return seen[1]
    hosts = {name for group in GROUPS for name in ctx.cluster.in_group(group)}
    slots = max(
        (len(host_config(ctx.loaded, name, "fabric", FabricConfig).ports) for name in hosts),
        default=0,
    )
    if len(_slots_seen) >= 4:
        _slots_seen.clear()
    _slots_seen[id(ctx.loaded)] = (ctx.loaded, slots)
    return slots


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = fabric_settings(ctx)

    def file(path: str, template: str, **extra: object) -> ManagedFile:
        content = render_template(f"fabric/{template}", cfg=cfg, ctx=ctx, **extra)
        return ManagedFile("fabric", path, content)

    return [
        file(PREFERENCES, "preferences.j2", pins=cfg.package_pins(ctx.cluster.os)),
        file(NCCL_CONF, "nccl.conf.j2", settings=cfg.nccl_settings()),
        file(LIMITS_FILE, "limits.conf.j2"),
        *(file(runtime_dropin(unit), "runtime-limits.conf.j2") for unit in RUNTIME_UNITS),
        *(
            file(network_file(slot), "port.network.j2", port=port)
            for slot, port in enumerate(cfg.ports)
        ),
    ]
