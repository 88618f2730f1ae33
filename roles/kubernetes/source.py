"""Where kubeadm, kubelet and kubectl come from (the role's `source`): the package repository of
the pinned minor (pkgs.k8s.io or a mirror), or the release binaries with kubelet's own unit."""

from __future__ import annotations

from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.settings import settings
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

REPO_SOURCES = "/etc/apt/sources.list.d/kubernetes.sources"
REPO_KEY = "/etc/apt/keyrings/kubernetes-apt-keyring.asc"
# kubelet's unit and kubeadm's drop-in, written by the role for source: binaries (the packages
# bring their own; the drop-in is the package's, pointing at /usr/local/bin).
KUBELET_UNIT = "/etc/systemd/system/kubelet.service"
KUBELET_DROPIN = "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"


def repository_url(ctx: HostContext) -> str:
    """The package repository of the pinned minor (pkgs.k8s.io's layout, or a mirror of it)."""
    cfg = settings(ctx)
    minor = ctx.cluster.versions.kubernetes_version.major_minor
    return f"{cfg.repo_url.rstrip('/')}/core:/stable:/v{minor}/deb/"


def source_files(ctx: HostContext, cfg: KubernetesConfig) -> list[ManagedFile]:
    """The repository's sources file, or kubelet's unit and drop-in; nothing for preinstalled."""
    if cfg.source in ("pkgs.k8s.io", "mirror"):
        sources = render_template(
            "kubernetes/kubernetes.sources.j2", url=repository_url(ctx), key=REPO_KEY
        )
        return [ManagedFile("kubernetes", REPO_SOURCES, sources)]
    if cfg.source == "binaries":
        unit = render_template("kubernetes/kubelet.service.j2")
        dropin = render_template("kubernetes/10-kubeadm.conf.j2")
        return [
            ManagedFile("kubernetes", KUBELET_UNIT, unit),
            ManagedFile("kubernetes", KUBELET_DROPIN, dropin),
        ]
    return []
