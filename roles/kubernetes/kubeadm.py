"""kubeadm's configuration of each node and the component flags in it: init on the first
control-plane node (InitConfiguration, ClusterConfiguration with the API server's, controller
manager's and scheduler's flags, KubeletConfiguration, KubeProxyConfiguration), join on the
others and on workers, and the per-node kubelet patch. Every document is a typed model of
`models.py`; each flag carries the reason printed above the document it is in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inventory.model import Cluster
from inventory.sizing import cluster_sizing, explicit_or
from roles.kubernetes import apiproxy, cni
from roles.kubernetes import models as m
from roles.kubernetes.apiproxy import api_endpoint
from roles.kubernetes.audit import AUDIT_LOG_DIR, AUDIT_POLICY
from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.encryption import ENCRYPTION_CONFIG, ENCRYPTION_DIR, FLAG
from roles.kubernetes.settings import CONFIG_DIR, is_first_control_plane
from toolkit import nodes
from toolkit.nodes import SchedulerFiles
from toolkit.spec import HostContext, ManagedFile, provided

DEFAULT_IMAGE_REPOSITORY = "registry.k8s.io"
# One path for the init file (first control-plane node) and the join files (every other node):
# pyinfra matches operations by position, so every node of a phase writes the same paths.
KUBEADM_CONFIG = f"{CONFIG_DIR}/kubeadm.yaml"
INIT_CONFIG = KUBEADM_CONFIG
JOIN_CONFIG = KUBEADM_CONFIG
PATCHES_DIR = f"{CONFIG_DIR}/patches"
KUBELET_PATCH = f"{PATCHES_DIR}/kubeletconfiguration+merge.yaml"
# kubelet runs every file here as a pod; with an external etcd kubeadm writes these three on a
# control-plane node and none on a worker, so any other file is a pod nobody declared.
STATIC_PODS_DIR = "/etc/kubernetes/manifests"
CONTROL_PLANE_PODS = ("kube-apiserver.yaml", "kube-controller-manager.yaml", "kube-scheduler.yaml")
API_SERVER_MANIFEST = f"{STATIC_PODS_DIR}/{CONTROL_PLANE_PODS[0]}"
# The join step writes the filled-in copy here (0700) and removes it after the join.
SECRET_DIR = f"{CONFIG_DIR}/private"
# Files kubeadm writes: "initialised" and "joined" are read from them (Kubespray's tests too).
ADMIN_CONF = "/etc/kubernetes/admin.conf"
KUBELET_CONF = "/etc/kubernetes/kubelet.conf"
# kubelet's configuration as kubeadm writes it at join and upgrade: the cluster's
# KubeletConfiguration with this node's patch merged over it. kubelet reads it at start.
KUBELET_CONFIG_FILE = "/var/lib/kubelet/config.yaml"
# Where the etcd role's client phase puts the API servers' etcd CA and client certificate
# (roles/etcd/files.py APISERVER_PKI and client_files; kubeadm's external-etcd layout).
APISERVER_PKI = "/etc/kubernetes/pki"

# fleet_policy renders the scheduler's files; this role places them on the control plane.
scheduler_files = provided("fleet_policy", "scheduler_files")
# The etcd role's Events cluster (etcd.events), when it runs one: its client URLs.
etcd_events_endpoints = provided("etcd", "events_endpoints")


@dataclass(frozen=True)
class Flag:
    """One component flag and why the role sets it (printed above the document it is in)."""

    name: str
    value: str
    reason: str


def inflight_flags(ctx: HostContext, cfg: KubernetesConfig) -> list[Flag]:
    """The API server's slots: the inventory's, or sized for its node count. No watch cache
    flag: the API server sizes its watch caches itself (inventory/sizing.py)."""
    fleet = cluster_sizing(ctx.cluster)
    reads, writes = cfg.max_requests_inflight, cfg.max_mutating_requests_inflight

    def origin(explicit: int | None, rule: str) -> str:
        if explicit is not None:
            return "set in the inventory"
        return f"sized for {fleet.nodes} nodes, {rule} (inventory/sizing.py)"

    return [
        Flag(
            "max-requests-inflight",
            str(explicit_or(reads, fleet.max_requests_inflight)),
            "read slots, summed with the write slots into what API Priority and Fairness "
            f"shares out; {origin(reads, 'upstream 400 up to 0.6 a node, at most 3,000')}",
        ),
        Flag(
            "max-mutating-requests-inflight",
            str(explicit_or(writes, fleet.max_mutating_requests_inflight)),
            "write slots (node status, leases); "
            + origin(writes, "a third of the read slots, at least upstream's 200"),
        ),
    ]


def api_server_flags(ctx: HostContext, cfg: KubernetesConfig) -> list[Flag]:
    cluster = ctx.cluster
    flags = [
        *inflight_flags(ctx, cfg),
        Flag(
            "audit-policy-file",
            AUDIT_POLICY,
            "who changed what: metadata of every write, nothing of reads or secrets' bodies",
        ),
        Flag("audit-log-path", f"{AUDIT_LOG_DIR}/audit.log", "on the host, rotated below"),
        Flag("audit-log-maxage", str(cfg.audit_log_maxage), "days of audit kept"),
        Flag("audit-log-maxbackup", str(cfg.audit_log_maxbackup), "rotated files kept"),
        Flag("audit-log-maxsize", str(cfg.audit_log_maxsize), "MB per file before rotation"),
        Flag(
            "profiling",
            "false",
            "CIS benchmark 1.2.18: no pprof endpoints on the API server",
        ),
        *encryption_flags(cfg),
        Flag(
            "shutdown-delay-duration",
            f"{apiproxy.detection_seconds(ctx) + apiproxy.SHUTDOWN_MARGIN_S}s",
            "an API server told to stop fails /readyz at once but serves on this long, past "
            "the time the slowest balancer in front of it takes to take it out of rotation "
            "(its checks' interval x fall + timeout, and a margin): a restart drops no request",
        ),
    ]
    # An explicit list (an external Events etcd) wins over the etcd role's Events cluster.
    events = cfg.events_etcd_endpoints or etcd_events_endpoints(ctx.loaded)
    if events:
        flags.append(
            Flag(
                "etcd-servers-overrides",
                "/events#" + ";".join(events),
                "Events in their own etcd: the churn of a large cluster's events stays out of "
                "the main etcd's quota and compaction",
            )
        )
    # Behind a balancer; the node-local proxies balance per connection as well, and the same
    # pinning of long-lived HTTP/2 connections happens there.
    if len(cluster.in_group("control_plane")) > 1:
        flags.append(
            Flag(
                "goaway-chance",
                "0.001",
                "HTTP/2 clients pinned to one API server behind the load balancer (or the "
                "node-local proxies) are sent away now and then, so load spreads again after a "
                "restart (never with one API server)",
            )
        )
    return flags + api_server_gang_flags(scheduler_files(ctx.loaded))


def encryption_flags(cfg: KubernetesConfig) -> list[Flag]:
    if not cfg.encrypt_secrets:
        return []
    return [
        Flag(
            FLAG,
            ENCRYPTION_CONFIG,
            "Secrets encrypted at rest (roles/kubernetes/encryption.py): etcd and its "
            "snapshots hold them as ciphertext",
        ),
        Flag(
            "encryption-provider-config-automatic-reload",
            "true",
            "a rotated key is read from the file without restarting the API server",
        ),
    ]


def controller_manager_flags(ctx: HostContext, cfg: KubernetesConfig) -> list[Flag]:
    flags = [
        Flag(
            "kube-api-qps",
            str(cfg.controller_manager_qps),
            "default 20: node lifecycle and endpoint updates lag minutes at 1,000+ nodes",
        ),
        Flag("kube-api-burst", str(cfg.controller_manager_burst), "default 30"),
        Flag("profiling", "false", "CIS benchmark 1.3.2"),
        *metrics_bind_flags(ctx.cluster),
    ]
    if cfg.cni == "routes":
        flags.append(
            Flag(
                "allocate-node-cidrs",
                "false",
                "each node's pod block comes from the inventory (cni: routes), not from here",
            )
        )
    reasons = {
        "feature-gates": "in-tree gang scheduling (roles/fleet_policy): the podgroup-protection "
        "controller removes the finalizer the API server puts on every PodGroup (alpha)",
    }
    return flags + _fleet_policy_flags(scheduler_files(ctx.loaded).controller_manager, reasons)


def _fleet_policy_flags(section: dict[str, Any], reasons: dict[str, str]) -> list[Flag]:
    return [
        Flag(arg["name"], arg["value"], reasons.get(arg["name"], "roles/fleet_policy"))
        for arg in section.get("extraArgs", [])
    ]


def api_server_gang_flags(scheduler: SchedulerFiles) -> list[Flag]:
    """The API server's flags from the fleet policy's kubeadm section: in-tree gang
    scheduling's feature gate and API group."""
    reasons = {
        "feature-gates": "in-tree gang scheduling (roles/fleet_policy): serves the Workload API, "
        "keeps pods' spec.workloadRef and lets kube-scheduler read Workloads (alpha, off by "
        "default)",
        "runtime-config": "the Workload API's alpha group, which is not served by default",
    }
    return _fleet_policy_flags(scheduler.api_server, reasons)


def metrics_bind_flags(cluster: Cluster) -> list[Flag]:
    """kube-scheduler's and kube-controller-manager's listener beyond 127.0.0.1 (kubeadm's),
    where the cluster has a monitoring host to read their /metrics."""
    if not cluster.in_group("monitoring"):
        return []
    return [
        Flag(
            "bind-address",
            "0.0.0.0",
            "Prometheus on the monitoring hosts reads /metrics (a client certificate in "
            "system:monitoring; the firewall opens the port to those hosts only); kubeadm's "
            "health checks and probes still reach it on the node",
        )
    ]


def scheduler_flags(ctx: HostContext, scheduler: SchedulerFiles) -> list[Flag]:
    """The scheduler's flags from the fleet policy's kubeadm section: `config` (the default
    profile) and the gang scheduling gates, and its listener for Prometheus. kube-scheduler
    ignores --kube-api-qps/--kube-api-burst/--profiling once it reads a configuration file;
    that file sets them (clientConnection, enableProfiling)."""
    reasons = {
        "config": "the default profile (roles/fleet_policy); it also sets the client's "
        "qps/burst and enableProfiling: false (CIS 1.4.1), which kube-scheduler no longer takes "
        "as flags with --config",
        "feature-gates": "in-tree gang scheduling (roles/fleet_policy): the GangScheduling "
        "plugin joins the default profile and reads Workloads (alpha, off by default)",
    }
    return _fleet_policy_flags(scheduler.kubeadm, reasons) + metrics_bind_flags(ctx.cluster)


def scheduler_volumes(scheduler: SchedulerFiles) -> list[m.HostPathMount]:
    return [m.HostPathMount(**volume) for volume in scheduler.kubeadm.get("extraVolumes", [])]


def cert_sans(ctx: HostContext) -> list[str]:
    """The API server certificate's names: the API name, the VIP, every load balancer and every
    control-plane node by address, short name and FQDN, so any path a client takes verifies."""
    cluster = ctx.cluster
    names = [f"api.{cluster.domain}"]
    if cluster.api.vip is not None:
        names.append(str(cluster.api.vip))
    for name in cluster.in_group("loadbalancer") + cluster.in_group("control_plane"):
        names += [str(cluster.hosts[name].address), name, cluster.fqdn(name)]
    names += ["127.0.0.1", "localhost"]  # the node-local proxy and kubectl on the node itself
    return list(dict.fromkeys(names))


def _args(flags: list[Flag]) -> list[m.Arg]:
    return [m.Arg(name=flag.name, value=flag.value) for flag in flags]


def cluster_configuration(ctx: HostContext, cfg: KubernetesConfig) -> m.ClusterConfiguration:
    cluster = ctx.cluster
    scheduler = scheduler_files(ctx.loaded)
    volumes = [
        m.HostPathMount(
            name="audit-policy",
            hostPath=AUDIT_POLICY,
            mountPath=AUDIT_POLICY,
            readOnly=True,
            pathType="File",
        ),
        m.HostPathMount(
            name="audit-log",
            hostPath=AUDIT_LOG_DIR,
            mountPath=AUDIT_LOG_DIR,
            pathType="DirectoryOrCreate",
        ),
    ]
    if cfg.encrypt_secrets:
        # The folder, not the file: the file is replaced by a rename, which a file mount would
        # not see (the automatic reload reads the new one).
        volumes.append(
            m.HostPathMount(
                name="encryption-config",
                hostPath=ENCRYPTION_DIR,
                mountPath=ENCRYPTION_DIR,
                readOnly=True,
                pathType="DirectoryOrCreate",
            )
        )
    return m.ClusterConfiguration(
        kubernetesVersion=cluster.versions.kubernetes_version.tag,
        clusterName=cluster.name,
        controlPlaneEndpoint=api_endpoint(ctx),
        imageRepository=(
            cfg.image_repository if cfg.image_repository != DEFAULT_IMAGE_REPOSITORY else None
        ),
        dns=m.DNS(imageTag=cfg.coredns_image_tag) if cfg.coredns_image_tag else None,
        etcd=m.Etcd(
            external=m.ExternalEtcd(
                endpoints=list(ctx.topology.etcd_client_endpoints),
                # Written by the etcd role's client phase (roles/etcd/files.py client_files).
                caFile=f"{APISERVER_PKI}/etcd/ca.crt",
                certFile=f"{APISERVER_PKI}/apiserver-etcd-client.crt",
                keyFile=f"{APISERVER_PKI}/apiserver-etcd-client.key",
            )
        ),
        networking=m.Networking(
            podSubnet=str(cluster.networks.pod), serviceSubnet=str(cluster.networks.service)
        ),
        apiServer=m.APIServer(
            extraArgs=_args(api_server_flags(ctx, cfg)),
            extraVolumes=volumes,
            certSANs=cert_sans(ctx),
        ),
        controllerManager=m.ControlPlaneComponent(
            extraArgs=_args(controller_manager_flags(ctx, cfg))
        ),
        scheduler=m.ControlPlaneComponent(
            extraArgs=_args(scheduler_flags(ctx, scheduler)),
            extraVolumes=scheduler_volumes(scheduler),
        ),
    )


def node_labels(ctx: HostContext, cfg: KubernetesConfig) -> dict[str, str]:
    """kubelet's --node-labels: the inventory's own, the team's (`teams:`), the GPU's, and
    Calico's route reflector label on the control-plane nodes once the full mesh is off."""
    labels = dict(cfg.node_labels)
    labels.update(nodes.node_labels(ctx.cluster, ctx.name))
    if ctx.name in cni.route_reflectors(ctx.loaded, cfg):
        labels[cni.ROUTE_REFLECTOR_LABEL] = "true"
    gpu = ctx.host.gpu
    if "gpu_worker" in ctx.host.groups and gpu is not None:
        labels[nodes.GPU_WORKER_LABEL_KEY] = nodes.GPU_WORKER_LABEL_VALUE
        labels["nvidia.com/gpu.product"] = gpu.model
        labels["nvidia.com/gpu.count"] = str(gpu.count)
    return labels


def registration_taints(ctx: HostContext) -> list[m.Taint] | None:
    """GPU workers register with the preflight taint, so no pod lands before their GPUs passed
    the health checks (Kubespray taints after the join: pods can land first); a team's workers
    with the team's taint, so only its pods land there from the first moment. Control-plane
    nodes keep kubeadm's own taint (None; validation keeps them out of teams); other workers
    register untainted."""
    taints = []
    if "gpu_worker" in ctx.host.groups:
        taints.append(
            m.Taint(
                key=nodes.PREFLIGHT_TAINT_KEY,
                value=nodes.PREFLIGHT_TAINT_VALUE,
                effect=nodes.PREFLIGHT_TAINT_EFFECT,
            )
        )
    team = nodes.team_of(ctx.cluster, ctx.name)
    if team is not None:
        taints.append(m.Taint(key=nodes.TEAM_TAINT_KEY, value=team, effect=nodes.TEAM_TAINT_EFFECT))
    if not taints and "control_plane" in ctx.host.groups:
        return None
    return taints


def node_registration(ctx: HostContext, cfg: KubernetesConfig) -> m.NodeRegistration:
    labels = node_labels(ctx, cfg)
    extra = [m.Arg(name="node-ip", value=ctx.address)]
    if labels:
        text = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        extra.append(m.Arg(name="node-labels", value=text))
    return m.NodeRegistration(
        name=ctx.name,
        taints=registration_taints(ctx),
        kubeletExtraArgs=extra,
        ignorePreflightErrors=list(cfg.ignore_preflight_errors) or None,
    )


def kubelet_configuration(cfg: KubernetesConfig) -> m.KubeletConfiguration:
    return m.KubeletConfiguration(
        # systemd owns the cgroups (containerd is set the same way by container_runtime).
        cgroupDriver=cfg.cgroup_driver,
        failCgroupV1=None if cfg.fail_cgroup_v1 else False,
        # Parallel pulls: OpenAI turned serial pulls off; a GPU job's large images otherwise
        # queue behind each other for minutes.
        serializeImagePulls=False,
        maxParallelImagePulls=5,
        maxPods=cfg.max_pods,
        systemReserved=cfg.system_reserved,
        kubeReserved=cfg.kube_reserved,
        evictionHard=cfg.eviction_hard,
    )


def kubelet_patch(cfg: KubernetesConfig) -> m.KubeletPatch:
    return m.KubeletPatch(
        maxPods=cfg.max_pods,
        systemReserved=cfg.system_reserved,
        kubeReserved=cfg.kube_reserved,
        evictionHard=cfg.eviction_hard,
    )


# Kubernetes 1.35 is the first whose kubelet refuses to start on cgroup v1 (KEP-5573).
REFUSES_CGROUP_V1 = (1, 35)


def cgroup_findings(cgroup: str | None, cfg: KubernetesConfig, minor: tuple[int, int]) -> list[str]:
    """Why kubelet cannot run on this host's cgroups, before anything is installed: a join
    would otherwise wait minutes on a kubelet that exits at once."""
    if cgroup != "v1" or not cfg.fail_cgroup_v1 or minor < REFUSES_CGROUP_V1:
        return []
    return [
        f"kubernetes: this host runs cgroup v1, which kubelet {minor[0]}.{minor[1]} refuses "
        "(KEP-5573): boot it on cgroup v2 (systemd.unified_cgroup_hierarchy=1), or set "
        "kubernetes.fail_cgroup_v1: false with accept_unsafe: [fail_cgroup_v1]"
    ]


def kubelet_differences(live: dict[str, Any], patch: m.KubeletPatch) -> list[str]:
    """Each setting of the node's patch that kubelet's configuration file does not hold (a
    map's keys one by one), named with both values: what drift reports, and what the apply
    writes again. A patch written after the join changes nothing by itself; kubeadm merges it
    only at join and upgrade."""
    wanted = patch.model_dump(exclude_none=True, exclude={"apiVersion", "kind"})
    found = []
    for key, want in wanted.items():
        have = live.get(key)
        pairs = (
            [(f"{key}.{sub}", (have if isinstance(have, dict) else {}).get(sub), value)
             for sub, value in want.items()]
            if isinstance(want, dict)
            else [(key, have, want)]
        )  # fmt: skip
        found += [
            f"kubelet: {KUBELET_CONFIG_FILE} sets "
            + (f"{name} to {had}" if had is not None else f"no {name}")
            + f", the node's settings {name} to {value}"
            for name, had, value in pairs
            if had is None or str(had) != str(value)
        ]
    return found


def kube_proxy_configuration(ctx: HostContext, cfg: KubernetesConfig) -> m.KubeProxyConfiguration:
    return m.KubeProxyConfiguration(
        mode=cfg.kube_proxy_mode,
        clusterCIDR=str(ctx.cluster.networks.pod),
        ipvs=m.IPVSConfiguration(strictARP=False) if cfg.kube_proxy_mode == "ipvs" else None,
        conntrack=(
            None
            if cfg.kube_proxy_conntrack_max_per_core is None
            else m.ConntrackConfiguration(maxPerCore=cfg.kube_proxy_conntrack_max_per_core)
        ),
    )


def local_endpoint(ctx: HostContext) -> m.APIEndpoint:
    return m.APIEndpoint(advertiseAddress=ctx.address, bindPort=ctx.cluster.api.port)


def init_configuration(ctx: HostContext, cfg: KubernetesConfig) -> m.InitConfiguration:
    return m.InitConfiguration(
        # kubeadm init's own token: generated by kubeadm, never printed, gone in token_ttl.
        bootstrapTokens=[
            m.BootstrapToken(
                description="gpuinfra: kubeadm init",
                ttl=cfg.token_ttl,
                usages=["signing", "authentication"],
                groups=["system:bootstrappers:kubeadm:default-node-token"],
            )
        ],
        nodeRegistration=node_registration(ctx, cfg),
        localAPIEndpoint=local_endpoint(ctx),
        patches=m.Patches(directory=PATCHES_DIR),
    )


def join_configuration(ctx: HostContext, cfg: KubernetesConfig) -> m.JoinConfiguration:
    control_plane = None
    if "control_plane" in ctx.host.groups:
        control_plane = m.JoinControlPlane(
            localAPIEndpoint=local_endpoint(ctx), certificateKey=m.CERT_KEY_PLACEHOLDER
        )
    return m.JoinConfiguration(
        nodeRegistration=node_registration(ctx, cfg),
        discovery=m.Discovery(
            bootstrapToken=m.BootstrapTokenDiscovery(
                apiServerEndpoint=api_endpoint(ctx),
                token=m.TOKEN_PLACEHOLDER,
                caCertHashes=[m.CA_HASH_PLACEHOLDER],
            )
        ),
        controlPlane=control_plane,
        patches=m.Patches(directory=PATCHES_DIR),
    )


def reasons_header(title: str, groups: dict[str, list[Flag]]) -> str:
    lines = [f"# Managed by gpuinfra: {title}", "# Why each component flag is set:"]
    for component, flags in groups.items():
        for flag in flags:
            lines.append(f"#   {component} --{flag.name}: {flag.reason}")
    return "\n".join(lines) + "\n"


def kubelet_patch_file(cfg: KubernetesConfig) -> ManagedFile:
    header = (
        "# Managed by gpuinfra: this node's kubelet settings, merged by kubeadm over the "
        "cluster's KubeletConfiguration.\n"
    )
    return ManagedFile("kubernetes", KUBELET_PATCH, m.dump([kubelet_patch(cfg)], header))


def kubeadm_file(ctx: HostContext, cfg: KubernetesConfig) -> ManagedFile:
    """kubeadm init's documents on the first control-plane node, with why each component flag
    is set; a join document with placeholders on every other node."""
    if is_first_control_plane(ctx):
        header = reasons_header(
            f"kubeadm init of {ctx.cluster.name} on {ctx.name}",
            {
                "kube-apiserver": api_server_flags(ctx, cfg),
                "kube-controller-manager": controller_manager_flags(ctx, cfg),
                "kube-scheduler": scheduler_flags(ctx, scheduler_files(ctx.loaded)),
            },
        )
        documents: list[m.Strict] = [
            init_configuration(ctx, cfg),
            cluster_configuration(ctx, cfg),
            kubelet_configuration(cfg),
            kube_proxy_configuration(ctx, cfg),
        ]
        return ManagedFile("kubernetes", INIT_CONFIG, m.dump(documents, header), mode="0600")
    header = (
        f"# Managed by gpuinfra: kubeadm join of {ctx.name}. The GPUINFRA_* placeholders are "
        "filled in at join time\n# (a fresh short-lived token, the CA's hash) into a copy "
        f"under {SECRET_DIR} that is removed after the join.\n"
    )
    text = m.dump([join_configuration(ctx, cfg)], header)
    return ManagedFile("kubernetes", JOIN_CONFIG, text, mode="0600")


def kubeadms_static_pods(control_plane: bool) -> tuple[str, ...]:
    """The static pod manifests kubeadm writes on a node: the control plane's, or none."""
    return (
        tuple(f"{STATIC_PODS_DIR}/{name}" for name in CONTROL_PLANE_PODS) if control_plane else ()
    )
