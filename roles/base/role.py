"""The base role's record: every host, SSH admitted from the admin networks."""

from __future__ import annotations

from inventory.model import LoadedCluster
from inventory.topology import FirewallRule, collapse_sources
from roles.base import deploy, files
from roles.base.config import BaseConfig
from roles.spec import Phase, Role


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    """SSH on the port the controller connects to (ssh.port), from the node and admin
    networks: a rule on another port would lock the controller out mid-run."""
    cluster = loaded.cluster
    admin = collapse_sources([str(cluster.networks.node), *map(str, cluster.networks.admin)])
    return {"all": [FirewallRule("SSH from admin networks", cluster.ssh.port, "tcp", admin)]}


ROLE = Role(
    name="base",
    config=BaseConfig,
    phases=(Phase(None, files.managed_files, deploy.apply),),
    ports=ports,
    summary="hostname, /etc/hosts, apt sources, packages, time sync, journald, sshd",
)
