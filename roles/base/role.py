"""The base role's record: every host, SSH admitted from the admin networks."""

from __future__ import annotations

import ipaddress

from inventory.model import Cluster, LoadedCluster
from inventory.topology import FirewallRule, collapse_sources
from roles.base.config import BaseConfig
from toolkit.spec import Phase, Role, lazy
from toolkit.ssh import ssh_settings


def bastion_address(cluster: Cluster) -> list[str]:
    """The bastion's address when the inventory gives one (an address, or a cluster host's
    name); a DNS name is not resolved offline: its network belongs in `networks.admin`."""
    if not cluster.ssh.bastion:
        return []
    host = cluster.ssh.bastion.rpartition("@")[2].partition(":")[0]
    if host in cluster.hosts:
        return [str(cluster.hosts[host].address)]
    try:
        return [str(ipaddress.IPv4Address(host))]
    except ValueError:
        return []


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    """SSH on the port the controller connects to (ssh.port), from the node and admin
    networks and the bastion: a drop policy that missed either would lock the controller out
    in the middle of its own run."""
    cluster = loaded.cluster
    clients = collapse_sources(
        [str(cluster.networks.node), *map(str, cluster.networks.admin), *bastion_address(cluster)]
    )
    port = ssh_settings(loaded).port
    return {"all": [FirewallRule("SSH from admin networks", port, "tcp", clients)]}


ROLE = Role(
    name="base",
    config=BaseConfig,
    phases=(Phase(None, lazy("roles.base.files:managed_files"), lazy("roles.base.deploy:apply")),),
    ports=ports,
    summary="hostname, /etc/hosts, apt sources, packages, time sync, journald, sshd",
)
