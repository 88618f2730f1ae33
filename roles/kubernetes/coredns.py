"""CoreDNS's replicas and spread, sized for the fleet: kubeadm's `corednsdeployment` patch on the
control-plane nodes, which kubeadm applies to the Deployment it creates at init and writes again
at each upgrade (`--patches`, day2/kubernetes.py)."""

from __future__ import annotations

from inventory.sizing import cluster_sizing
from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.kubeadm import PATCHES_DIR
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

COREDNS_PATCH = f"{PATCHES_DIR}/corednsdeployment+strategic.yaml"


def coredns_replicas(ctx: HostContext, cfg: KubernetesConfig) -> tuple[int, str]:
    """The replicas and why: the inventory's, or one per 16 nodes and at least two."""
    if cfg.coredns_replicas is not None:
        return cfg.coredns_replicas, "set in the inventory (kubernetes.coredns_replicas)"
    fleet = cluster_sizing(ctx.cluster)
    why = (
        f"one per 16 of the {fleet.nodes} nodes, at least 2 (cluster-proportional-autoscaler's "
        "linear rule, inventory/sizing.py)"
    )
    return fleet.coredns_replicas, why


def coredns_patch_file(ctx: HostContext, cfg: KubernetesConfig) -> ManagedFile:
    replicas, why = coredns_replicas(ctx, cfg)
    text = render_template(
        "kubernetes/corednsdeployment+strategic.yaml.j2", replicas=replicas, why=why
    )
    return ManagedFile("kubernetes", COREDNS_PATCH, text)
