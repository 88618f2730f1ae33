"""Inventory rules of the kubernetes role that its config schema cannot express: (key, message)."""

from __future__ import annotations

from collections.abc import Iterator

from inventory.model import LoadedCluster
from roles.kubernetes.config import KubernetesConfig
from toolkit.spec import HostSettings


def cluster_checks(loaded: LoadedCluster, settings: HostSettings) -> Iterator[tuple[str, str]]:
    cluster = loaded.cluster
    nodes = [
        name
        for group in ("control_plane", "gpu_worker", "cpu_worker")
        for name in cluster.in_group(group)
    ]
    seen: set[tuple[str, str]] = set()
    for name in nodes:
        kube = settings.get(name, {}).get("kubernetes")
        runtime = settings.get(name, {}).get("container_runtime")
        if not isinstance(kube, KubernetesConfig) or not kube.enabled:
            continue
        problems = []
        if runtime is not None and (runtime.cgroup_driver != kube.cgroup_driver):
            problems.append(
                (
                    "kubernetes.cgroup_driver",
                    f"{kube.cgroup_driver}, but container_runtime.cgroup_driver is "
                    f"{runtime.cgroup_driver}: kubelet and containerd must use the same one",
                )
            )
        if kube.cni == "routes":
            pods, node_net = cluster.networks.pod, cluster.networks.node
            blocks = 2 ** max(kube.routes_block_prefix - pods.prefixlen, 0)
            if kube.routes_block_prefix < pods.prefixlen or blocks < node_net.num_addresses:
                problems.append(
                    (
                        "networks.pod",
                        f"{pods} holds {blocks} /{kube.routes_block_prefix} pod blocks, fewer "
                        f"than the {node_net.num_addresses} addresses of networks.node "
                        f"{node_net} (cni: routes gives each node address a block)",
                    )
                )
        for problem in problems:
            if problem not in seen:  # a group setting is reported once, not per host
                seen.add(problem)
                yield problem
