"""The kubernetes role's deploy: packages, kubeadm files, then init, joins and Calico.

Two phases: the control plane, then the workers. On the control plane the first node runs
`kubeadm init --upload-certs` once, Calico and then every role's cluster objects (server-side
apply, CRDs first) are applied from it, and the other nodes join one at a time (`_serial`),
each waiting for /healthz (and Ready, with a CNI) before the next starts.
Workers join in parallel, paced by the run's shared rate limit (toolkit/pacing.py), which they
acquire inside the join itself, so nodes that are already joined never wait.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from roles.kubernetes import encryption
from roles.kubernetes import operations as kube_ops
from roles.kubernetes.apiproxy import API_PROXY_CONFIG, API_PROXY_UNIT, node_local_balancing
from roles.kubernetes.cni import (
    CALICO_CONFIG,
    CALICO_RESOURCES,
    POD_ROUTES_SCRIPT,
    POD_ROUTES_UNIT,
    calico_scale,
    route_reflectors,
)
from roles.kubernetes.facts import (
    CgroupVersion,
    EncryptionKeyNames,
    KubeletConfigFile,
    ManifestFlags,
)
from roles.kubernetes.files import managed_files
from roles.kubernetes.kubeadm import (
    API_SERVER_MANIFEST,
    INIT_CONFIG,
    JOIN_CONFIG,
    KUBELET_CONFIG_FILE,
    PATCHES_DIR,
    SECRET_DIR,
    STATIC_PODS_DIR,
    cgroup_findings,
    kubeadms_static_pods,
    kubelet_differences,
    kubelet_patch,
)
from roles.kubernetes.metrics import OPERATOR_KUBECONFIG
from roles.kubernetes.settings import (
    CONFIG_DIR,
    first_control_plane,
    is_first_control_plane,
    settings,
)
from roles.kubernetes.source import (
    KUBELET_DROPIN,
    KUBELET_UNIT,
    REPO_KEY,
    REPO_SOURCES,
    repository_url,
)
from roles.kubernetes.stages import apply_stages
from toolkit import record
from toolkit.effective import nothing_overrides, only_ours, ours_or_declared, unit_dropins
from toolkit.operations import put_file, restart_if_running, service_running
from toolkit.pyinfra_api import op_hash
from toolkit.spec import HostContext

POD_ROUTES_SERVICE = "gpuinfra-pod-routes"


def _common(ctx: HostContext, control_plane: bool) -> dict[str, str]:
    """Packages and files every node gets; returns the written files' contents by path."""
    cfg = settings(ctx)
    release = ctx.cluster.versions.kubernetes_version
    version = release.plain
    nothing_overrides(
        "Check that kubelet can run on this host's cgroups",
        cgroup_findings(host.get_fact(CgroupVersion), cfg, (release.major, release.minor)),
    )
    managed = {f.path: f for f in managed_files(ctx)}
    sources = put_file(managed[REPO_SOURCES]) if REPO_SOURCES in managed else None
    kube_ops.repository_key(
        name="Fetch the Kubernetes repository key",
        enabled=cfg.source in ("pkgs.k8s.io", "mirror"),
        url=f"{repository_url(ctx)}Release.key",
        fingerprint=cfg.repo_key_fingerprint,
        dest=REPO_KEY,
    )
    if sources is not None:
        apt.update(
            name="Refresh package lists for the Kubernetes repository", _if=sources.did_change
        )
    kube_ops.kubernetes_installed(
        name="Install kubeadm, kubelet and kubectl",
        cfg=cfg,
        version=version,
        repo=repository_url(ctx),
    )
    local_proxy = node_local_balancing(ctx.cluster)
    if local_proxy:
        apt.packages(
            name="Install HAProxy for the node-local API proxy",
            packages=["haproxy"],
            no_recommends=True,
            update=True,
            cache_time=3600,
        )
    if encryption.ENCRYPTION_CONFIG in managed:
        on_node = host.get_fact(EncryptionKeyNames, path=encryption.ENCRYPTION_CONFIG)
        nothing_overrides(
            "Check that the API server's encryption key is the kept one",
            encryption.rotation_findings(ctx.loaded)
            or encryption.lost_keys(on_node or [], encryption.key(ctx.loaded)),
        )
        running = host.get_fact(ManifestFlags, path=API_SERVER_MANIFEST)
        nothing_overrides(
            "Check that the API server encrypts Secrets",
            encryption.unencrypted(running, API_SERVER_MANIFEST),
        )
    written = {
        path: put_file(managed_file)
        for path, managed_file in managed.items()
        if path != REPO_SOURCES
    }
    if cfg.source == "binaries":
        kubelet_units = [written[KUBELET_UNIT], written[KUBELET_DROPIN]]
        systemd.daemon_reload(
            name="Reload systemd for kubelet's unit",
            _if=lambda: any(unit.did_change() for unit in kubelet_units),
        )
    if cfg.cni == "routes":
        routes_unit, routes = written[POD_ROUTES_UNIT], written[POD_ROUTES_SCRIPT]
        systemd.daemon_reload(
            name="Reload systemd for the pod routes unit", _if=routes_unit.did_change
        )
        service_running(name="Route to the other nodes' pod blocks", unit=POD_ROUTES_SERVICE)
        restart_if_running(
            name="Route again for the new list of nodes",
            unit=POD_ROUTES_SERVICE,
            _if=routes.did_change,
        )
    if local_proxy:
        unit, proxy = written[API_PROXY_UNIT], written[API_PROXY_CONFIG]
        systemd.daemon_reload(name="Reload systemd for the API proxy unit", _if=unit.did_change)
        service_running(name="Run the node-local API proxy", unit="kube-api-proxy")
        restart_if_running(
            name="Reload the node-local API proxy for its new configuration",
            unit="kube-api-proxy",
            reload=True,
            _if=proxy.did_change,
        )
    files.directory(
        name="Keep join secrets private (0700)", path=SECRET_DIR, mode="0700", present=True
    )
    files.directory(name="Own the kubeadm file directory", path=CONFIG_DIR, mode="0755")
    service_running(name="Run kubelet", unit="kubelet")
    live = host.get_fact(KubeletConfigFile, path=KUBELET_CONFIG_FILE)
    differs = kubelet_differences(live, kubelet_patch(cfg)) if live is not None else []
    if differs:
        # Per-group settings changed after the join (or the file edited): kubeadm merges the
        # node's patch again, and kubelet starts on it (its static pods keep running).
        rewritten = server.shell(
            name="Write the node's kubelet settings again (kubeadm's kubelet-config phase)",
            commands=[
                f"kubeadm upgrade node phase kubelet-config --patches {PATCHES_DIR}",
                "systemctl restart kubelet",
            ],
        )
        record.host(host.name).details[op_hash(rewritten)] = "\n".join(differs)
    allowed = ours_or_declared(ctx)
    unit_dropins("Check the drop-ins of kubelet", ("kubelet",), allowed)
    only_ours(
        "Check that kubelet runs only kubeadm's static pods",
        f"{STATIC_PODS_DIR}/*",
        (*allowed, *kubeadms_static_pods(control_plane)),
        "kubelet runs it as a static pod",
    )
    only_ours(
        "Check that kubeadm applies only gpuinfra's patches",
        f"{PATCHES_DIR}/*",
        allowed,
        "kubeadm applies it to the node's components at init, join and upgrade",
    )
    return {path: f.content for path, f in managed.items()}


@deploy("Kubernetes control plane")
def apply_control_plane(ctx: HostContext) -> None:
    cfg = settings(ctx)
    if not cfg.enabled:
        kube_ops.disabled(name="Skip Kubernetes (disabled)")
        return
    contents = _common(ctx, control_plane=True)
    first = is_first_control_plane(ctx)
    kube_ops.control_plane_initialised(
        name="Initialise the first control-plane node",
        first=first,
        config=INIT_CONFIG,
        timeout_s=cfg.ready_timeout_s,
    )
    kube_ops.operator_kubeconfig(
        name="Copy the operator kubeconfig to the controller (0600)",
        first=first,
        local=str(ctx.loaded.state_dir / OPERATOR_KUBECONFIG),
        # Nodes dial their own proxy or api.<domain>, a name the controller need not resolve:
        # it dials the API's address (the VIP or the balancer), or the first API server itself.
        server=(
            f"https://{ctx.address}:{ctx.cluster.api.port}"
            if node_local_balancing(ctx.cluster)
            else f"https://{ctx.topology.api_address}:{ctx.cluster.api.port}"
        ),
    )
    kube_ops.calico_applied(
        name="Apply Calico (BGP, no encapsulation)",
        first=first,
        cfg=cfg,
        scale=calico_scale(ctx.loaded, cfg),
        resources=[CALICO_CONFIG, CALICO_RESOURCES],
        marker=f"{CONFIG_DIR}/calico-applied",
    )
    kube_ops.cluster_objects_applied(
        name="Apply the cluster's objects (server-side, CRDs first)",
        first=first,
        stages=apply_stages(ctx.cluster_files()),
        timeout_s=cfg.ready_timeout_s,
    )
    kube_ops.control_plane_joined(
        name="Join the control plane, one node at a time",
        first_name=first_control_plane(ctx.cluster),
        content=contents.get(JOIN_CONFIG, ""),
        token_ttl=cfg.token_ttl,
        timeout_s=cfg.ready_timeout_s,
        wait_ready=cfg.cni == "routes" or cfg.calico_manifest_sha256 is not None,
        _serial=True,
    )
    if ctx.name in route_reflectors(ctx.loaded, cfg):
        kube_ops.route_reflector_annotated(
            name="Reflect Calico's routes (the full mesh is off at this size)",
            node=ctx.name,
            cluster_id=str(cfg.calico_route_reflector_cluster_id),
            marker=f"{CONFIG_DIR}/route-reflector",
        )


@deploy("Kubernetes workers")
def apply_workers(ctx: HostContext) -> None:
    cfg = settings(ctx)
    if not cfg.enabled:
        kube_ops.disabled(name="Skip Kubernetes (disabled)")
        return
    if not ctx.cluster.in_group("control_plane"):
        kube_ops.disabled(
            name="Skip Kubernetes (no control_plane host to join)",
            reason="no control_plane host in the inventory: nothing for this worker to join",
        )
        return
    contents = _common(ctx, control_plane=False)
    kube_ops.worker_joined(
        name="Join the workers, rate-limited",
        first_name=first_control_plane(ctx.cluster),
        content=contents[JOIN_CONFIG],
        token_ttl=cfg.token_ttl,
        rate=cfg.join_rate,
    )
