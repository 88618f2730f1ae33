"""The firewall role's record: gpuinfra's nftables table on every host, from every role's ports.

It declares the Kubernetes API and kubelet ports too, until the kubernetes role (which runs
those services) declares them itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pydantic import BaseModel

from inventory.model import LoadedCluster
from inventory.topology import KUBELET_PORT, FirewallRule, collapse_sources
from roles.firewall.config import FirewallConfig
from roles.spec import Phase, Role, lazy


def api_clients(loaded: LoadedCluster) -> tuple[str, ...]:
    """Nodes, pods and admins: pods reach the API through the kubernetes Service, DNAT'd to an
    API server with the pod's own address as the source."""
    networks = loaded.cluster.networks
    return collapse_sources([str(networks.node), str(networks.pod), *map(str, networks.admin)])


def addresses(loaded: LoadedCluster, names) -> tuple[str, ...]:
    return collapse_sources(str(loaded.cluster.hosts[name].address) for name in names)


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    cluster = loaded.cluster
    api = FirewallRule(
        "Kubernetes API from nodes, pods and admins", cluster.api.port, "tcp", api_clients(loaded)
    )
    # The API server calls kubelets (logs, exec); Prometheus scrapes their cAdvisor metrics.
    kubelet_clients = addresses(
        loaded, set(cluster.in_group("control_plane")) | set(cluster.in_group("monitoring"))
    )
    kubelet = FirewallRule(
        "kubelet from the control plane and monitoring",
        KUBELET_PORT,
        "tcp",
        kubelet_clients if cluster.in_group("control_plane") else (),
    )
    return {
        "control_plane": [api, kubelet],
        "gpu_worker": [kubelet],
        "cpu_worker": [kubelet],
    }


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
    ports=ports,
    checks=checks,
    summary="one nftables table of gpuinfra's own, input policy drop, peers from the topology",
)
