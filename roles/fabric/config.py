"""Defaults of the fabric role (InfiniBand / RoCE host stack); inventory group_vars/host vars
under `fabric:` override them."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inventory.grammar import DebianPackage, DebianVersion, VariableName, Word

# Debian/Ubuntu package -> version, per target OS, installed exactly and pinned (the way the
# container runtime and nvidia roles pin). rdma-core builds all four from one source.
# debian-13: read from trixie's archive with `apt-cache policy` on 2026-11-26 (the lab installs
# them). ubuntu-22.04/24.04: from packages.ubuntu.com (jammy, noble main), unverified from here.
PACKAGES: dict[str, dict[str, str]] = {
    "debian-13": {
        "rdma-core": "56.1-1",
        "ibverbs-utils": "56.1-1",
        "infiniband-diags": "56.1-1",
        "perftest": "25.01.0+0.80-1",
    },
    "ubuntu-22.04": {
        "rdma-core": "39.0-1",
        "ibverbs-utils": "39.0-1",
        "infiniband-diags": "39.0-1",
        "perftest": "4.4+0.37-1",
    },
    "ubuntu-24.04": {
        "rdma-core": "50.0-2build2",
        "ibverbs-utils": "50.0-2build2",
        "infiniband-diags": "50.0-2build2",
        "perftest": "24.01.0+0.38-1",
    },
}


class FabricPort(BaseModel):
    """One HCA port of the host: its verbs device and port, and the IP interface on it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The verbs device as `ibstat` and `ibv_devinfo` name it (mlx5_0): NCCL_IB_HCA lists these.
    device: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    # HCA ports count from 1; a dual-port card used as two rails has 1 and 2.
    port: int = Field(1, ge=1, le=8)
    # The IP interface on the port: IPoIB's ib0 on InfiniBand, the NIC's netdev for RoCE.
    interface: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,15}$")
    # Its address with prefix, from the inventory (IPoIB network per rail in a fat-tree).
    address: ipaddress.IPv4Interface

    @field_validator("address", mode="before")
    @classmethod
    def _has_prefix(cls, value: object) -> object:
        # A bare address would become a /32: no route to any peer on the fabric's network.
        if isinstance(value, str) and "/" not in value:
            raise ValueError(f"{value!r} needs its prefix length (10.50.10.11/16)")
        return value


class FabricConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The host's fabric ports; none: this GPU worker has no RDMA fabric, and the role only
    # installs the tools (a node without HCAs still gets ib_write_bw for the pair check).
    ports: list[FabricPort] = Field(default_factory=list)
    # "infiniband" (native IB, IPoIB interfaces) or "ethernet" (RoCE): what every port's
    # `Link layer` must say.
    link_layer: Literal["infiniband", "ethernet"] = "infiniband"
    # Every port must be Active at this rate (Gb/s as ibstat prints it): 200 for HDR 4x, the
    # reference server's ports; 400 for NDR, 100 for EDR.
    rate_gbps: int = Field(200, ge=1)
    # GPUDirect RDMA (the NIC reads and writes GPU memory; nvidia-peermem on the GPU worker).
    # None: wanted wherever the host has fabric ports, the only place it does anything.
    gpudirect_rdma: bool | None = None
    # RoCE v2 over IPv4 sits at GID index 3 on ConnectX NICs with the default GID table
    # (show_gids); NCCL's default 0 is RoCE v1, which routed fabrics drop. InfiniBand ignores it.
    roce_gid_index: int = Field(3, ge=0)
    # NCCL's bootstrap and socket fallback: the first port's interface unless named here (an
    # Ethernet management interface, say, when the IPoIB network is firewalled off).
    nccl_socket_ifname: str | None = Field(None, pattern=r"^[A-Za-z0-9_.,=^-]+$")
    # More NCCL settings for /etc/nccl.conf (NCCL_IB_TIMEOUT, NCCL_IB_QPS_PER_CONNECTION ...).
    nccl_extra: dict[VariableName, Word] = Field(default_factory=dict)
    # Locked memory: RDMA registers (pins) every buffer it sends from; a limit makes ibv_reg_mr
    # fail under NCCL. Unlimited, or a size in KiB (limits.conf's unit).
    memlock: str = Field("unlimited", pattern=r"^(unlimited|[0-9]+)$")
    # Package versions replacing PACKAGES' for this host (a site's own rdma-core build, MLNX_OFED).
    package_versions: dict[DebianPackage, DebianVersion] = Field(default_factory=dict)
    # The lab has no RDMA device (its kernel has no RDMA and no soft-RoCE): a host that declares
    # itself a stand-in gets a note where a real server with a missing HCA fails the apply.
    # Never set it on real hardware.
    device_standin: bool = False

    @model_validator(mode="after")
    def _ports_are_distinct(self) -> FabricConfig:
        seen_ports = [(port.device, port.port) for port in self.ports]
        if len(set(seen_ports)) != len(seen_ports):
            raise ValueError("two ports name the same device and port")
        interfaces = [port.interface for port in self.ports]
        if len(set(interfaces)) != len(interfaces):
            raise ValueError("two ports name the same interface")
        for key in self.nccl_extra:
            if not key.startswith("NCCL_") or not key.replace("_", "").isalnum():
                raise ValueError(f"nccl_extra: {key!r} is not an NCCL_ variable")
        for value in self.nccl_extra.values():
            if "\n" in value:
                raise ValueError("nccl_extra: a value spans lines")
        return self

    @property
    def wants_gpudirect_rdma(self) -> bool:
        """Whether nvidia-peermem should load on this GPU worker: the setting, or the ports."""
        if self.gpudirect_rdma is not None:
            return self.gpudirect_rdma
        return bool(self.ports)

    def nccl_settings(self) -> dict[str, str]:
        """What /etc/nccl.conf sets: the HCAs (`=` for exact names, so mlx5_1 does not also
        pick mlx5_10), the socket interface, the RoCE GID index, then the inventory's extras."""
        settings: dict[str, str] = {}
        if self.ports:
            hcas = ",".join(f"{port.device}:{port.port}" for port in self.ports)
            settings["NCCL_IB_HCA"] = f"={hcas}"
        ifname = self.nccl_socket_ifname
        if ifname is None and self.ports:
            ifname = f"={self.ports[0].interface}"
        if ifname:
            settings["NCCL_SOCKET_IFNAME"] = ifname
        if self.ports and self.link_layer == "ethernet":
            settings["NCCL_IB_GID_INDEX"] = str(self.roce_gid_index)
        settings.update(self.nccl_extra)
        return settings

    def package_pins(self, os_name: str) -> dict[str, str]:
        """Package -> exact version for a host of this OS, the inventory's overrides applied."""
        return {**PACKAGES.get(os_name, {}), **self.package_versions}
