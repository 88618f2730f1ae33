"""The loadbalancer role's record: HAProxy and keepalived, one balancer at a time."""

from __future__ import annotations

from inventory.model import LoadedCluster
from inventory.topology import (
    HAPROXY_STATS_PORT,
    FirewallRule,
    api_clients,
    host_addresses,
)
from roles.loadbalancer.config import LoadBalancerConfig
from toolkit.spec import Phase, Role, Rolling, lazy


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    cluster = loaded.cluster
    balancers = cluster.in_group("loadbalancer")
    rules = [
        FirewallRule(
            "Kubernetes API from nodes, pods and admins",
            cluster.api.port,
            "tcp",
            api_clients(cluster),
        )
    ]
    if len(balancers) > 1:
        # keepalived's VRRP adverts (IP protocol 112): dropped, both balancers claim the VIP.
        peers = host_addresses(cluster, balancers)
        rules.append(FirewallRule("VRRP between load balancers", None, "vrrp", peers))
    scrapers = host_addresses(cluster, cluster.in_group("monitoring"))
    rules.append(FirewallRule("HAProxy stats from monitoring", HAPROXY_STATS_PORT, "tcp", scrapers))
    return {"loadbalancer": rules}


ROLE = Role(
    name="loadbalancer",
    config=LoadBalancerConfig,
    # One balancer at a time: the other keeps (or takes over) the VIP meanwhile.
    phases=(
        Phase(
            ("loadbalancer",),
            lazy("roles.loadbalancer.files:managed_files"),
            lazy("roles.loadbalancer.deploy:apply"),
            Rolling.one_at_a_time,
        ),
    ),
    ports=ports,
    summary="HAProxy in front of the API servers, keepalived for a shared address",
)
