"""Defaults of the dns role; inventory group_vars/host vars under `dns:` override them."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from inventory.grammar import ResolverOption


class DnsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Upstream resolvers for names outside the cluster; none: Bind9 recurses from the root
    # servers itself (no third party sees the cluster's lookups).
    forwarders: list[ipaddress.IPv4Address] = Field(default_factory=list)
    # Records change rarely and hosts are re-rendered in full: short enough that a replaced
    # node is found within minutes, long enough to keep query load negligible.
    ttl: int = Field(300, ge=60, le=86400)
    # SOA timers (RFC 1912 ranges): secondaries check hourly, retry every 10 min, and keep
    # answering for two weeks without the primary; negative answers cached for 5 min.
    refresh: int = 3600
    retry: int = 600
    expire: int = 1209600
    negative_ttl: int = 300
    # DNSSEC validation of recursive answers; "auto" uses the root trust anchor bind9 ships.
    dnssec_validation: Literal["auto", "yes", "no"] = "auto"
    # Resolver options for /etc/resolv.conf on every host: fail over to the next server after
    # 2 s instead of glibc's 5, so one server down costs little.
    resolver_options: list[ResolverOption] = Field(
        default_factory=lambda: ["timeout:2", "attempts:2"]
    )
