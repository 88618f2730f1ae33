"""The firewall role's record: gpuinfra's nftables table on every host, from every role's ports."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pydantic import BaseModel

from inventory.model import LoadedCluster
from roles.firewall.config import FirewallConfig
from toolkit.spec import Phase, Role, lazy


def checks(loaded: LoadedCluster, settings: Mapping[str, Mapping[str, BaseModel]]) -> Iterator:
    """A filtering firewall admits SSH only from admin networks (and the node network): without
    any, a controller outside the node network locks itself out on the first apply."""
    if loaded.cluster.networks.admin:
        return
    enabled = [
        name
        for name, roles in settings.items()
        if isinstance(roles.get("firewall"), FirewallConfig) and roles["firewall"].enabled
    ]
    if enabled:
        yield (
            "networks.admin",
            "the firewall role is enabled (firewall.enabled) but no admin network is listed: "
            "add the networks the controller and operators connect from, or set "
            "group_vars.all.firewall.enabled: false",
        )


ROLE = Role(
    name="firewall",
    config=FirewallConfig,
    phases=(
        Phase(
            None, lazy("roles.firewall.files:managed_files"), lazy("roles.firewall.deploy:apply")
        ),
    ),
    checks=checks,
    summary="one nftables table of gpuinfra's own, input policy drop, peers from the topology",
)
