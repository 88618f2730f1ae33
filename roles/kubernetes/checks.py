"""Inventory rules of the kubernetes role that its config schema cannot express: (key, message)."""

from __future__ import annotations

from collections.abc import Iterator

from inventory import versions
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
    if any(_enabled(settings, name) for name in nodes):
        yield from _pinned_together(loaded)
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


def _enabled(settings: HostSettings, name: str) -> bool:
    kube = settings.get(name, {}).get("kubernetes")
    return isinstance(kube, KubernetesConfig) and kube.enabled


def _pinned_together(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    """The supported range first, then each pin below what the Kubernetes minor needs
    (inventory/versions.py holds the table and its sources)."""
    pins = loaded.cluster.versions
    unsupported = versions.unsupported_kubernetes(pins.kubernetes)
    if unsupported:
        yield "versions.kubernetes", unsupported
        return
    needs = versions.kubernetes_needs(pins.kubernetes)
    assert needs is not None  # a supported minor has its row
    minor = pins.kubernetes_version.major_minor
    for key, pinned, minimum, why in (
        ("etcd", pins.etcd, needs.min_etcd, "kubeadm refuses an older external etcd"),
        ("containerd", pins.containerd, needs.min_containerd, "kubelet refuses an older one"),
    ):
        have = versions.release_key(pinned)
        if have is not None and have < versions.release_key(minimum):  # type: ignore[operator]
            yield (
                f"versions.{key}",
                f"{pinned} is too old for Kubernetes {minor}: it needs {key} {minimum} or "
                f"later ({why})",
            )
