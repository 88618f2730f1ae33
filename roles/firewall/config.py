"""Defaults of the firewall role; inventory group_vars/host vars under `firewall:` override them."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from inventory.grammar import Words


class ExtraRule(BaseModel):
    """One more inbound port a group or host accepts, beyond what the topology derives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    port: int = Field(ge=1, le=65535)
    protocol: Literal["tcp", "udp"] = "tcp"
    # Explicit sources only: an open port "from anywhere" should be a visible choice (0.0.0.0/0).
    sources: list[ipaddress.IPv4Network] = Field(min_length=1)
    description: Words = "extra rule from the inventory"


class FirewallConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # False keeps the table (same rules, so a plan shows what would be filtered) but with an
    # accept policy: for a fleet whose admin networks are not known yet. Validation refuses
    # enabled without networks.admin, since the controller would lock itself out.
    enabled: bool = True
    # Extra ports per group or host (e.g. a NodePort range's ingress, a CNI's VXLAN port);
    # host vars replace the group's list, as every role setting does.
    extra_rules: list[ExtraRule] = Field(default_factory=list)
    # Tables of others that may filter input beside gpuinfra's ("family name"): a packet must pass
    # every base chain on its hook, so any other table can drop what ours accepts. iptables'
    # tables (kube-proxy, Docker and CNI plugins write theirs through iptables-nft),
    # kube-proxy's nftables mode and the CNI portmap plugin's nftables backend (its
    # `cni_hostport` DNAT for pods' hostPorts, in the kubernetes role's routes chain) are
    # expected; a site adds its own here. Any other table with a chain on the prerouting, input
    # or ingress hook is drift and stops an apply.
    foreign_tables: list[str] = Field(
        default_factory=lambda: [
            f"{family} {table}"
            for family in ("ip", "ip6")
            for table in (
                "filter",
                "nat",
                "mangle",
                "raw",
                "security",
                "kube-proxy",
                "cni_hostport",
            )
        ]  # fmt: skip
    )
    # Log dropped packets (rate-limited): useful while bringing a cluster up, noisy after.
    log_drops: bool = False
