"""The kubernetes role's record: the control plane one node at a time, then workers in paced
batches; the API, kubelet and Calico BGP ports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from inventory.model import LoadedCluster
from inventory.topology import (
    BGP_PORT,
    KUBE_CONTROLLER_MANAGER_PORT,
    KUBE_SCHEDULER_PORT,
    KUBELET_PORT,
    FirewallRule,
    api_clients,
    host_addresses,
)
from roles.kubernetes.checks import cluster_checks
from roles.kubernetes.config import KubernetesConfig
from toolkit.spec import Phase, Role, Rolling, lazy

CONTROL_PLANE_NODE_GROUPS = ("control_plane",)
WORKER_GROUPS = ("gpu_worker", "cpu_worker")
NODE_GROUPS = CONTROL_PLANE_NODE_GROUPS + WORKER_GROUPS


def ports(loaded: LoadedCluster) -> Mapping[str, Iterable[FirewallRule]]:
    cluster = loaded.cluster

    control_plane = cluster.in_group("control_plane")
    api = FirewallRule(
        "Kubernetes API from nodes, pods and admins", cluster.api.port, "tcp", api_clients(cluster)
    )
    # The API server calls kubelets (logs, exec); Prometheus scrapes their cAdvisor metrics.
    kubelet_clients = set(control_plane) | set(cluster.in_group("monitoring"))
    kubelet = FirewallRule(
        "kubelet from the control plane and monitoring",
        KUBELET_PORT,
        "tcp",
        host_addresses(cluster, kubelet_clients) if control_plane else (),
    )
    # BGP between every Kubernetes node: the routes to each node's pod block.
    nodes = [name for group in NODE_GROUPS for name in cluster.in_group(group)]
    bgp = FirewallRule(
        "Calico BGP between Kubernetes nodes", BGP_PORT, "tcp", host_addresses(cluster, nodes)
    )
    rules: dict[str, list[FirewallRule]] = {group: [kubelet, bgp] for group in NODE_GROUPS}
    rules["control_plane"].insert(0, api)
    # Prometheus reads the scheduler's and controller manager's /metrics (they listen beyond
    # 127.0.0.1 only when a monitoring host exists: roles/kubernetes/kubeadm.py).
    monitoring = cluster.in_group("monitoring")
    if monitoring:
        scrapers = host_addresses(cluster, monitoring)
        rules["control_plane"] += [
            FirewallRule("kube-scheduler from monitoring", KUBE_SCHEDULER_PORT, "tcp", scrapers),
            FirewallRule(
                "kube-controller-manager from monitoring",
                KUBE_CONTROLLER_MANAGER_PORT,
                "tcp",
                scrapers,
            ),
        ]
    return rules


ROLE = Role(
    name="kubernetes",
    config=KubernetesConfig,
    phases=(
        Phase(
            CONTROL_PLANE_NODE_GROUPS,
            lazy("roles.kubernetes.files:managed_files"),
            lazy("roles.kubernetes.deploy:apply_control_plane"),
            Rolling.one_at_a_time,
        ),
        Phase(
            WORKER_GROUPS,
            lazy("roles.kubernetes.files:managed_files"),
            lazy("roles.kubernetes.deploy:apply_workers"),
            Rolling.batches,
        ),
    ),
    ports=ports,
    cluster_files=lazy("roles.kubernetes.cni:cluster_files"),
    # What Prometheus scrapes of the cluster and where its credentials come from (monitoring).
    provides={"metrics_access": lazy("roles.kubernetes.metrics:metrics_access")},
    checks=cluster_checks,
    summary="kubeadm HA control plane on the external etcd, Calico BGP, rate-limited joins",
)
