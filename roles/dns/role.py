"""The dns role's record: Bind9 servers one at a time, then every host's resolver."""

from __future__ import annotations

from inventory.model import LoadedCluster
from inventory.topology import DNS_PORT, FirewallRule, collapse_sources
from roles.dns.config import DnsConfig
from toolkit.spec import Phase, Role, Rolling, lazy


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    """CoreDNS forwards from pod addresses to the cluster DNS servers; nodes and admins ask
    directly."""
    networks = loaded.cluster.networks
    clients = collapse_sources([str(networks.node), str(networks.pod), *map(str, networks.admin)])
    return {
        "dns": [
            FirewallRule("DNS from the cluster and admins", DNS_PORT, "udp", clients),
            FirewallRule("DNS from the cluster and admins", DNS_PORT, "tcp", clients),
        ]
    }


ROLE = Role(
    name="dns",
    config=DnsConfig,
    phases=(
        # One server at a time: the others keep answering while one reloads or reboots.
        Phase(
            ("dns",),
            lazy("roles.dns.files:server_files"),
            lazy("roles.dns.deploy:apply_server"),
            Rolling.one_at_a_time,
        ),
        # Every host then resolves through the cluster's DNS servers.
        Phase(None, lazy("roles.dns.files:client_files"), lazy("roles.dns.deploy:apply_client")),
    ),
    ports=ports,
    summary="Bind9 for the cluster domain (primary, secondaries) and every host's resolver",
)
