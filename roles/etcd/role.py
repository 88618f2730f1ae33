"""The etcd role's record: members bootstrap together, then change and reboot one at a time."""

from __future__ import annotations

from inventory.model import LoadedCluster
from inventory.topology import (
    ETCD_CLIENT_PORT,
    ETCD_METRICS_PORT,
    ETCD_PEER_PORT,
    FirewallRule,
    host_addresses,
)
from roles.etcd.config import EtcdConfig
from toolkit.spec import Phase, Role, Rolling, lazy


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    cluster = loaded.cluster

    members = cluster.in_group("etcd")
    clients = set(cluster.in_group("control_plane")) | set(members)
    return {
        "etcd": [
            FirewallRule(
                "etcd clients: control plane and members",
                ETCD_CLIENT_PORT,
                "tcp",
                host_addresses(cluster, clients),
            ),
            FirewallRule(
                "etcd peers: members only", ETCD_PEER_PORT, "tcp", host_addresses(cluster, members)
            ),
            FirewallRule(
                "etcd metrics from monitoring",
                ETCD_METRICS_PORT,
                "tcp",
                host_addresses(cluster, cluster.in_group("monitoring")),
            ),
        ]
    }


ROLE = Role(
    name="etcd",
    config=EtcdConfig,
    phases=(
        # Together: a new cluster's members must start in the same step. Restarts inside the
        # deploy and reboots still go one member at a time (quorum).
        Phase(
            ("etcd",),
            lazy("roles.etcd.files:managed_files"),
            lazy("roles.etcd.deploy:apply"),
            Rolling.together,
        ),
        # The API servers' client certificates: one control-plane node at a time.
        Phase(
            ("control_plane",),
            lazy("roles.etcd.files:client_files"),
            lazy("roles.etcd.deploy:apply_clients"),
            Rolling.one_at_a_time,
        ),
    ),
    ports=ports,
    # Before an apply changes anything: the members must trust the controller's CA.
    pre_apply=lazy("roles.etcd.trust:check_live_ca"),
    summary="five dedicated members on local disk, mutual TLS, disk gate, day-2 commands",
)
