"""The roles in the order they converge a cluster, and which groups each one targets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inventory.model import LoadedCluster
from roles.base import deploy as base_deploy
from roles.base import files as base_files
from roles.container_runtime import deploy as container_runtime_deploy
from roles.container_runtime import files as container_runtime_files
from roles.dns import deploy as dns_deploy
from roles.dns import files as dns_files
from roles.drift_job import files as drift_job_files
from roles.etcd import deploy as etcd_deploy
from roles.etcd import files as etcd_files
from roles.firewall import deploy as firewall_deploy
from roles.firewall import files as firewall_files
from roles.gpu_health import files as gpu_health_files
from roles.kernel import deploy as kernel_deploy
from roles.kernel import files as kernel_files
from roles.kubernetes import deploy as kubernetes_deploy
from roles.kubernetes import files as kubernetes_files
from roles.loadbalancer import deploy as loadbalancer_deploy
from roles.loadbalancer import files as loadbalancer_files
from roles.monitoring import deploy as monitoring_deploy
from roles.monitoring import files as monitoring_files
from roles.render import HostContext, ManagedFile


@dataclass(frozen=True)
class Phase:
    role: str
    groups: tuple[str, ...] | None  # None: every host
    files: Callable[[HostContext], list[ManagedFile]] | None = None
    deploy: Callable[[HostContext], None] | None = None

    def applies_to(self, host_groups: list[str]) -> bool:
        return self.groups is None or any(g in self.groups for g in host_groups)


PHASES: list[Phase] = [
    Phase("base", None, base_files.managed_files, base_deploy.apply),
    Phase("kernel", None, kernel_files.managed_files, kernel_deploy.apply),
    Phase(
        "container_runtime",
        ("control_plane", "gpu_worker", "cpu_worker"),
        container_runtime_files.managed_files,
        container_runtime_deploy.apply,
    ),
    Phase("firewall", None, firewall_files.managed_files, firewall_deploy.apply),
    Phase("dns", ("dns",), dns_files.server_files, dns_deploy.apply_server),
    # Every host then resolves through the cluster's DNS servers (same role: --roles dns).
    Phase("dns", None, dns_files.client_files, dns_deploy.apply_client),
    Phase(
        "loadbalancer",
        ("loadbalancer",),
        loadbalancer_files.managed_files,
        loadbalancer_deploy.apply,
    ),
    Phase("etcd", ("etcd",), etcd_files.managed_files, etcd_deploy.apply),
    Phase("etcd", ("control_plane",), etcd_files.client_files, etcd_deploy.apply_clients),
    # kubeadm: the control plane (init, then joins one at a time), then rate-limited workers.
    Phase(
        "kubernetes",
        ("control_plane",),
        kubernetes_files.managed_files,
        kubernetes_deploy.apply_control_plane,
    ),
    Phase(
        "kubernetes",
        ("gpu_worker", "cpu_worker"),
        kubernetes_files.managed_files,
        kubernetes_deploy.apply_workers,
    ),
    # Two phases for one role: node exporter on every host, then Prometheus on its own group.
    Phase(
        "monitoring",
        None,
        monitoring_files.node_exporter_files,
        monitoring_deploy.apply_node_exporter,
    ),
    Phase(
        "monitoring",
        ("monitoring",),
        monitoring_files.prometheus_files,
        monitoring_deploy.apply_prometheus,
    ),
]

# Producers of cluster-wide files (Kubernetes manifests): relative path -> content.
CLUSTER_FILES: list[Callable[[LoadedCluster], dict[str, str]]] = [
    gpu_health_files.cluster_files,
    monitoring_files.cluster_files,
    drift_job_files.cluster_files,
    kubernetes_files.cluster_files,
]
