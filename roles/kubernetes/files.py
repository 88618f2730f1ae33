"""The files the kubernetes role manages on each node, in the order the deploy writes them; each
subject has its module: source.py (packages or binaries), kubeadm.py (kubeadm's documents and the
component flags), apiproxy.py (the node-local API proxy), cni.py (Calico or the routed CNI),
audit.py (the audit policy), encryption.py (Secrets at rest), coredns.py (CoreDNS's replicas and
spread) and stages.py (the cluster's objects)."""

from __future__ import annotations

from roles.kubernetes import (
    apiproxy,
    audit,
    cni,
    coredns,
    encryption,
    kubeadm,
    models,
    source,
    stages,
)
from roles.kubernetes.settings import settings
from toolkit.spec import HostContext, ManagedFile

# Rendered documents that are read back into the typed models before they leave the controller.
VALIDATED = (
    kubeadm.KUBEADM_CONFIG,
    kubeadm.KUBELET_PATCH,
    cni.CALICO_RESOURCES,
    encryption.ENCRYPTION_CONFIG,
)


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = settings(ctx)
    if not cfg.enabled or not ctx.cluster.in_group("control_plane"):
        return []  # the deploy says why (no control plane: nothing for a worker to join)
    files = source.source_files(ctx, cfg)
    files.append(kubeadm.kubelet_patch_file(cfg))
    if apiproxy.node_local_balancing(ctx.cluster):
        files += apiproxy.proxy_files(ctx)
    if cfg.cni == "routes":
        files += cni.routes_files(ctx, cfg)
    if "control_plane" in ctx.host.groups:
        files.append(audit.policy_file())
        if cfg.encrypt_secrets:
            files.append(encryption.config_file(ctx.loaded))
        files.append(coredns.coredns_patch_file(ctx, cfg))
        if cfg.cni == "calico":
            files += cni.calico_files(ctx, cfg)
        scheduler = kubeadm.scheduler_files(ctx.loaded)
        files.append(ManagedFile("kubernetes", scheduler.config_path, scheduler.config))
        files += stages.stage_files(ctx)
    files.append(kubeadm.kubeadm_file(ctx, cfg))
    for managed in files:
        if managed.path in VALIDATED:
            models.validate_documents(managed.content)
    return files
