"""The kubernetes role's settings of a node and of the cluster, the node that leads (the first
control-plane node), every Kubernetes node, and the directory of the role's own files."""

from __future__ import annotations

from inventory.model import Cluster, LoadedCluster
from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.role import NODE_GROUPS
from toolkit.spec import HostContext, host_config

CONFIG_DIR = "/etc/kubernetes/gpuinfra"


def settings(ctx: HostContext) -> KubernetesConfig:
    return ctx.config(KubernetesConfig)


def cluster_settings(loaded: LoadedCluster) -> KubernetesConfig:
    """The first control-plane node's settings: the cluster-wide objects come from there."""
    nodes = loaded.cluster.in_group("control_plane")
    if not nodes:
        return KubernetesConfig()
    return host_config(loaded, nodes[0], "kubernetes", KubernetesConfig)


def first_control_plane(cluster: Cluster) -> str:
    nodes = cluster.in_group("control_plane")
    if not nodes:
        raise ValueError("the kubernetes role needs a host in the control_plane group")
    return nodes[0]


def is_first_control_plane(ctx: HostContext) -> bool:
    return ctx.name == first_control_plane(ctx.cluster)


def kubernetes_nodes(cluster: Cluster) -> list[str]:
    return [name for group in NODE_GROUPS for name in cluster.in_group(group)]
