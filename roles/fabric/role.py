"""The fabric role's record: the InfiniBand / RoCE host stack on GPU workers, and the firewall
rule that lets fabric peers reach each other over IPoIB."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pydantic import BaseModel

from inventory.model import LoadedCluster
from inventory.topology import FirewallRule, collapse_sources
from roles.fabric.config import PACKAGES, FabricConfig
from toolkit.spec import Phase, Role, host_config, lazy

# The role's hosts: GPU workers carry the HCAs (files.py reads this too).
GROUPS = ("gpu_worker",)


def _fabric_hosts(loaded: LoadedCluster) -> list[str]:
    return list(dict.fromkeys(h for group in GROUPS for h in loaded.cluster.in_group(group)))


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    """Every fabric host accepts TCP from the other fabric hosts' IPoIB addresses: NCCL's
    bootstrap and socket transport (NCCL_SOCKET_IFNAME) and perftest's exchange (port 18515)
    use ports chosen at run time. RDMA itself never passes the host's firewall."""
    addresses = [
        str(port.address.ip)
        for name in _fabric_hosts(loaded)
        for port in host_config(loaded, name, "fabric", FabricConfig).ports
    ]
    if not addresses:
        return {}
    sources = collapse_sources(addresses)
    rule = FirewallRule("fabric peers over IPoIB (NCCL, perftest)", None, "tcp", sources)
    return {group: [rule] for group in GROUPS}


def checks(
    loaded: LoadedCluster, settings: Mapping[str, Mapping[str, BaseModel]]
) -> Iterator[tuple[str, str]]:
    """Pinned packages for the cluster's OS, and no fabric address on two ports."""
    owners: dict[str, str] = {}
    for name in _fabric_hosts(loaded):
        cfg = settings[name]["fabric"]
        if not isinstance(cfg, FabricConfig):
            continue
        missing = sorted(set(PACKAGES["debian-13"]) - set(cfg.package_pins(loaded.cluster.os)))
        if missing:
            yield (
                f"hosts.{name}.vars.fabric.package_versions",
                f"no pinned version on {loaded.cluster.os} for {', '.join(missing)}",
            )
        for port in cfg.ports:
            address = str(port.address.ip)
            if address in owners:
                yield (
                    f"hosts.{name}.vars.fabric.ports",
                    f"{port.interface}: address {address} is also {owners[address]}'s",
                )
            owners.setdefault(address, f"{name} {port.interface}")


ROLE = Role(
    name="fabric",
    config=FabricConfig,
    phases=(
        Phase(GROUPS, lazy("roles.fabric.files:managed_files"), lazy("roles.fabric.deploy:apply")),
    ),
    ports=ports,
    checks=checks,
    summary="rdma-core and diagnostics, IPoIB addresses, NCCL's settings, memlock for RDMA",
)
