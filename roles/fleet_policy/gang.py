"""Gang scheduling in-tree (KEP-4671): the feature gates and API group each control-plane
component needs for the GangScheduling plugin, per Kubernetes minor."""

from __future__ import annotations

from dataclasses import dataclass

from inventory.versions import KubernetesVersion


@dataclass(frozen=True)
class InTreeGang:
    """What one Kubernetes minor needs switched on for gang scheduling."""

    # The Workload API's group/version: kube-apiserver serves an alpha one only when its
    # --runtime-config names it.
    workload_api: str
    # kube-apiserver: serves Workloads, keeps pods' spec.workloadRef instead of dropping it, and
    # grants system:kube-scheduler read access to workloads (its bootstrap RBAC policy).
    api_server_gates: tuple[str, ...]
    # kube-scheduler: GenericWorkload watches Workloads; GangScheduling adds the plugin to the
    # default profile and may not be on without GenericWorkload (a gate dependency).
    scheduler_gates: tuple[str, ...]
    # kube-controller-manager: from 1.36 the API server stamps a finalizer on every PodGroup
    # and the controller manager's podgroup-protection controller (GenericWorkload) removes it;
    # without the gate there, no PodGroup could ever be deleted.
    controller_manager_gates: tuple[str, ...] = ()


# Read from Kubernetes v1.35.4's sources: pkg/features/kube_features.go (both gates alpha, off
# by default), pkg/scheduler/apis/config/v1/default_plugins.go, k8s.io/api scheduling/v1alpha1.
# kube-controller-manager reads neither gate: the Job controller copies workloadRef from the
# pod template like any other field. v1.36.3's: the same gates (alpha, off), the API moved to
# scheduling/v1alpha2 (Workload, PodGroup; pods name a schedulingGroup instead of a
# workloadRef), and cmd/kube-controller-manager/app/scheduling.go runs the podgroup-protection
# controller under GenericWorkload. Later minors move the API and the gates again (v1.37 has no
# GangScheduling gate), so a minor is added here only after reading its own sources.
IN_TREE = {
    "1.35": InTreeGang(
        workload_api="scheduling.k8s.io/v1alpha1",
        api_server_gates=("GenericWorkload",),
        scheduler_gates=("GenericWorkload", "GangScheduling"),
    ),
    "1.36": InTreeGang(
        workload_api="scheduling.k8s.io/v1alpha2",
        api_server_gates=("GenericWorkload",),
        scheduler_gates=("GenericWorkload", "GangScheduling"),
        controller_manager_gates=("GenericWorkload",),
    ),
}
# The in-tree plugin's name (pkg/scheduler/framework/plugins/names).
PLUGIN = "GangScheduling"


class UnsupportedKubernetes(ValueError):
    """Gang scheduling is not set up for this Kubernetes minor."""


def in_tree_gang(kubernetes: str) -> InTreeGang:
    """For a version spelt either way ("1.36.3", "v1.36.3")."""
    minor = KubernetesVersion.parse(kubernetes).major_minor
    try:
        return IN_TREE[minor]
    except KeyError:
        known = ", ".join(sorted(IN_TREE))
        raise UnsupportedKubernetes(
            f"gang scheduling is set up for Kubernetes {known} only (the in-tree "
            f"GangScheduling plugin; its gates and Workload API change between minors), "
            f"not {minor}"
        ) from None


def feature_gates(gates: tuple[str, ...]) -> str:
    """The value of a component's --feature-gates flag."""
    return ",".join(f"{gate}=true" for gate in gates)
