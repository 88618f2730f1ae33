"""The kubernetes role: kubeadm HA control plane on the external etcd, Calico with native
routing, GPU workers registered with the preflight taint, rate-limited joins."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from inventory.model import LoadedCluster
from inventory.topology import BGP_PORT, FirewallRule, collapse_sources
from roles.kubernetes import deploy, files
from roles.kubernetes.config import KubernetesConfig
from roles.spec import Phase, Role, Rolling


def ports(loaded: LoadedCluster) -> Mapping[str, Iterable[FirewallRule]]:
    """BGP between every Kubernetes node: the routes to each node's pod block."""
    cluster = loaded.cluster
    nodes = [name for group in files.NODE_GROUPS for name in cluster.in_group(group)]
    sources = collapse_sources(str(cluster.hosts[name].address) for name in nodes)
    rule = FirewallRule("Calico BGP between Kubernetes nodes", BGP_PORT, "tcp", sources)
    return {group: [rule] for group in files.NODE_GROUPS} if sources else {}


ROLE = Role(
    name="kubernetes",
    config=KubernetesConfig,
    phases=(
        Phase(
            files.CONTROL_PLANE_NODE_GROUPS,
            files.managed_files,
            deploy.apply_control_plane,
            Rolling.one_at_a_time,
        ),
        Phase(files.WORKER_GROUPS, files.managed_files, deploy.apply_workers, Rolling.batches),
    ),
    ports=ports,
    cluster_files=files.cluster_files,
    summary="kubeadm HA control plane on the external etcd, Calico BGP, rate-limited joins",
)
