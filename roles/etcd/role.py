"""The etcd role's record: members bootstrap together, then change and reboot one at a time."""

from __future__ import annotations

from collections.abc import Iterator

from inventory.model import LoadedCluster
from inventory.topology import FirewallRule, host_addresses
from roles.etcd.clusters import cluster_settings, clusters
from roles.etcd.config import EtcdConfig
from toolkit.spec import HostSettings, Phase, Role, Rolling, lazy


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    """Each cluster's three ports: clients from the control plane (the API servers) and the
    members (the rolling restart's cluster health check and the member list are asked through
    every member's client URL), peers from the members only, metrics from monitoring."""
    cluster = loaded.cluster

    members = cluster.in_group("etcd")
    clients = set(cluster.in_group("control_plane")) | set(members)
    rules = []
    for etcd in clusters(cluster_settings(loaded)):
        rules += [
            FirewallRule(
                f"{etcd.title} clients: control plane and members",
                etcd.client_port,
                "tcp",
                host_addresses(cluster, clients),
            ),
            FirewallRule(
                f"{etcd.title} peers: members only",
                etcd.peer_port,
                "tcp",
                host_addresses(cluster, members),
            ),
            FirewallRule(
                f"{etcd.title} metrics from monitoring",
                etcd.metrics_port,
                "tcp",
                host_addresses(cluster, cluster.in_group("monitoring")),
            ),
        ]
    return {"etcd": rules}


def events_agree(loaded: LoadedCluster, settings: HostSettings) -> Iterator[tuple[str, str]]:
    """The Events cluster is on for every member or for none: each member runs one member of
    it, and the API servers' flag follows the first member's setting."""
    values = {
        host: settings[host]["etcd"].events.enabled
        for host in loaded.cluster.in_group("etcd")
        if "etcd" in settings.get(host, {})
    }
    if len(set(values.values())) > 1:
        on = ", ".join(host for host, enabled in values.items() if enabled)
        yield "etcd.events.enabled", f"one value for every etcd member (on only for {on})"


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
    checks=events_agree,
    # The Events cluster's client URLs (the kubernetes role's --etcd-servers-overrides) and its
    # members (monitoring's scrape job).
    provides={
        "events_endpoints": lazy("roles.etcd.clusters:events_endpoints"),
        "events_members": lazy("roles.etcd.clusters:events_members"),
    },
    # Before an apply changes anything: the members must trust the controller's CA.
    pre_apply=lazy("roles.etcd.trust:check_live_ca"),
    summary="five dedicated members on local disk, mutual TLS, disk gate, day-2 commands",
)
