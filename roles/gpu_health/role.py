"""The gpu_health role's record: cluster manifests, the DCGM exporter's port on GPU nodes, and
the periodic sample's checks."""

from __future__ import annotations

from inventory.model import LoadedCluster
from inventory.topology import DCGM_EXPORTER_PORT, FirewallRule, host_addresses
from roles.gpu_health.config import GpuHealthConfig
from roles.gpu_health.sampling import checks
from toolkit.spec import Role, lazy


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    cluster = loaded.cluster
    scrapers = host_addresses(cluster, cluster.in_group("monitoring"))
    rule = FirewallRule("DCGM exporter from monitoring", DCGM_EXPORTER_PORT, "tcp", scrapers)
    return {"gpu_worker": [rule]}


ROLE = Role(
    name="gpu_health",
    config=GpuHealthConfig,
    ports=ports,
    cluster_files=lazy("roles.gpu_health.files:cluster_files"),
    checks=checks,
    provides={"cluster_config": lazy("roles.gpu_health.config:cluster_config")},
    summary="passive and active GPU checks, preflight taint, budgeted cordoning (in-cluster)",
)
