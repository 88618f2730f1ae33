"""The gpu_health role's record: cluster manifests, the DCGM exporter's port on GPU nodes, and
the periodic sample's checks and the service accounts its pods call the API server as."""

from __future__ import annotations

from inventory.model import LoadedCluster
from inventory.topology import DCGM_EXPORTER_PORT, FirewallRule, host_addresses
from roles.gpu_health.config import GpuHealthConfig, cluster_config
from roles.gpu_health.sampling import checks
from toolkit.nodes import GPU_HEALTH_CHECK_ACCOUNTS
from toolkit.spec import Role, lazy

# The periodic CronJob's pods, which draw the nodes and create their check Jobs
# (templates/gpu_health/gpu-health.yaml.j2, beside the check accounts).
SAMPLER_ACCOUNT = "gpu-health-sampler"


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    cluster = loaded.cluster
    scrapers = host_addresses(cluster, cluster.in_group("monitoring"))
    rule = FirewallRule("DCGM exporter from monitoring", DCGM_EXPORTER_PORT, "tcp", scrapers)
    return {"gpu_worker": [rule]}


def service_accounts(loaded: LoadedCluster) -> list[tuple[str, str]]:
    """(namespace, name) of each account the role's pods call the API server as: the preflight
    DaemonSet, the periodic CronJob's sampler and the check Jobs it creates."""
    namespace = cluster_config(loaded).namespace
    return [(namespace, name) for name in (*GPU_HEALTH_CHECK_ACCOUNTS, SAMPLER_ACCOUNT)]


ROLE = Role(
    name="gpu_health",
    config=GpuHealthConfig,
    ports=ports,
    cluster_files=lazy("roles.gpu_health.files:cluster_files"),
    checks=checks,
    provides={
        "cluster_config": lazy("roles.gpu_health.config:cluster_config"),
        "service_accounts": service_accounts,
    },
    summary="passive and active GPU checks, preflight taint, budgeted cordoning (in-cluster)",
)
