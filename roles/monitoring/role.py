"""The monitoring role's record: node exporter everywhere, Prometheus on its group."""

from __future__ import annotations

from inventory.model import LoadedCluster
from inventory.topology import (
    NODE_EXPORTER_PORT,
    PROMETHEUS_PORT,
    FirewallRule,
    collapse_sources,
    host_addresses,
)
from roles.monitoring.config import MonitoringConfig
from toolkit.spec import Phase, Role, lazy


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    cluster = loaded.cluster
    scrapers = host_addresses(cluster, cluster.in_group("monitoring"))
    admin = collapse_sources([str(cluster.networks.node), *map(str, cluster.networks.admin)])
    return {
        "all": [FirewallRule("node exporter from monitoring", NODE_EXPORTER_PORT, "tcp", scrapers)],
        "monitoring": [
            FirewallRule("Prometheus from admin networks", PROMETHEUS_PORT, "tcp", admin)
        ],
    }


ROLE = Role(
    name="monitoring",
    config=MonitoringConfig,
    phases=(
        Phase(
            None,
            lazy("roles.monitoring.files:node_exporter_files"),
            lazy("roles.monitoring.deploy:apply_node_exporter"),
        ),
        Phase(
            ("monitoring",),
            lazy("roles.monitoring.files:prometheus_files"),
            lazy("roles.monitoring.deploy:apply_prometheus"),
        ),
    ),
    ports=ports,
    cluster_files=lazy("roles.monitoring.files:cluster_files"),
    summary="node exporter on every host, Prometheus with alert rules, Grafana dashboards",
)
