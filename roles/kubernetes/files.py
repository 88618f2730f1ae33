"""Files the kubernetes role manages on each node: kubeadm's configuration (init on the first
control-plane node, join on the others and on workers), the per-node kubelet patch, the audit
policy, and the Calico resources; every kubeadm/kubelet document is checked against the typed
models in `models.py` as it is rendered."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from inventory.model import Cluster, LoadedCluster
from inventory.topology import pod_block
from roles.kubernetes import models as m
from roles.kubernetes.config import KubernetesConfig
from roles.kubernetes.role import NODE_GROUPS
from toolkit import nodes
from toolkit.nodes import SchedulerFiles
from toolkit.spec import HostContext, ManagedFile, host_config, provided

CONFIG_DIR = "/etc/kubernetes/gpuinfra"
DEFAULT_IMAGE_REPOSITORY = "registry.k8s.io"
# One path for the init file (first control-plane node) and the join files (every other node):
# pyinfra matches operations by position, so every node of a phase writes the same paths.
KUBEADM_CONFIG = f"{CONFIG_DIR}/kubeadm.yaml"
INIT_CONFIG = KUBEADM_CONFIG
JOIN_CONFIG = KUBEADM_CONFIG
PATCHES_DIR = f"{CONFIG_DIR}/patches"
KUBELET_PATCH = f"{PATCHES_DIR}/kubeletconfiguration+merge.yaml"
# The cluster's Kubernetes objects (every role's _cluster/kubernetes/ files), in apply stages.
CLUSTER_OBJECTS_DIR = f"{CONFIG_DIR}/cluster"
# The join step writes the filled-in copy here (0700) and removes it after the join.
SECRET_DIR = f"{CONFIG_DIR}/private"
MANIFESTS_DIR = f"{CONFIG_DIR}/manifests"
CALICO_RESOURCES = f"{MANIFESTS_DIR}/calico-resources.yaml"
CALICO_CONFIG = f"{MANIFESTS_DIR}/calico-config.yaml"
REPO_SOURCES = "/etc/apt/sources.list.d/kubernetes.sources"
# kubelet's unit and kubeadm's drop-in, written by the role for source: binaries (the packages
# bring their own).
KUBELET_UNIT = "/etc/systemd/system/kubelet.service"
KUBELET_DROPIN = "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
KUBELET_UNIT_TEXT = """\
# Managed by gpuinfra: kubelet from the release binaries (source: binaries).
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target containerd.service

[Service]
ExecStart=/usr/local/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""
# kubeadm's own drop-in (what its package installs), pointing at /usr/local/bin.
KUBELET_DROPIN_TEXT = """\
# Managed by gpuinfra: kubeadm's kubelet drop-in (source: binaries).
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=\\
--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \\
--kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS \\
 $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""
REPO_KEY = "/etc/apt/keyrings/kubernetes-apt-keyring.asc"
AUDIT_POLICY = "/etc/kubernetes/audit-policy.yaml"
AUDIT_LOG_DIR = "/var/log/kubernetes/audit"
# Files kubeadm writes: "initialised" and "joined" are read from them (Kubespray's tests too).
ADMIN_CONF = "/etc/kubernetes/admin.conf"
KUBELET_CONF = "/etc/kubernetes/kubelet.conf"
# Where the etcd role's client phase puts the API servers' etcd CA and client certificate
# (roles/etcd/files.py APISERVER_PKI and client_files; kubeadm's external-etcd layout).
APISERVER_PKI = "/etc/kubernetes/pki"

# fleet_policy renders the scheduler's files; this role places them on the control plane.
scheduler_files = provided("fleet_policy", "scheduler_files")


def settings(ctx: HostContext) -> KubernetesConfig:
    return ctx.config(KubernetesConfig)


def first_control_plane(cluster: Cluster) -> str:
    nodes = cluster.in_group("control_plane")
    if not nodes:
        raise ValueError("the kubernetes role needs a host in the control_plane group")
    return nodes[0]


def is_first_control_plane(ctx: HostContext) -> bool:
    return ctx.name == first_control_plane(ctx.cluster)


@dataclass(frozen=True)
class Flag:
    """One component flag and why the role sets it (printed above the document it is in)."""

    name: str
    value: str
    reason: str


API_PROXY_CONFIG = f"{CONFIG_DIR}/api-proxy.cfg"
API_PROXY_UNIT = "/etc/systemd/system/kube-api-proxy.service"


def node_local_balancing(cluster: Cluster) -> bool:
    """Several API servers and no load-balancer nodes: every node runs its own small proxy in
    front of every API server (Kubespray's default), so losing one API server loses nothing."""
    return len(cluster.in_group("control_plane")) > 1 and not cluster.in_group("loadbalancer")


def api_endpoint(ctx: HostContext) -> str:
    """What nodes dial: api.<domain>:<port> (the VIP, a balancer or the only API server behind
    it), or the node-local proxy on the loopback address where there is no balancer."""
    if node_local_balancing(ctx.cluster):
        return f"127.0.0.1:{settings(ctx).node_local_lb_port}"
    return ctx.topology.api_endpoint


def api_proxy_config(ctx: HostContext) -> str:
    cfg = settings(ctx)
    servers = "\n".join(
        f"    server {backend.name} {backend.address}:{backend.port}"
        for backend in ctx.topology.api_backends
    )
    return (
        "# Managed by gpuinfra: this node's own proxy in front of every API server (no load-"
        "balancer nodes).\n"
        "global\n"
        "    maxconn 4000\n"
        "defaults\n"
        "    mode tcp\n"
        "    timeout connect 5s\n"
        "    # kubelet's watches live for hours: a short timeout would cut them all.\n"
        "    timeout client 4h\n"
        "    timeout server 4h\n"
        "    timeout check 5s\n"
        "    # An API server that just went down: the connection is retried on another one.\n"
        "    retries 3\n"
        "    option redispatch\n"
        "frontend kube-apiserver\n"
        f"    bind 127.0.0.1:{cfg.node_local_lb_port}\n"
        "    default_backend kube-apiserver\n"
        "backend kube-apiserver\n"
        "    balance roundrobin\n"
        "    option tcp-check\n"
        "    default-server check inter 2s fall 3 rise 2\n"
        f"{servers}\n"
    )


API_PROXY_UNIT_TEXT = f"""\
# Managed by gpuinfra: the node-local API proxy (HAProxy from the distribution, own config).
[Unit]
Description=Node-local proxy in front of every Kubernetes API server
After=network-online.target
Wants=network-online.target
Before=kubelet.service

[Service]
# -Ws: HAProxy tells systemd when it is ready; as Type=simple, a reload right after a start
# could reach it before its signal handlers and kill it (USR2, seen in CI).
Type=notify
ExecStartPre=/usr/sbin/haproxy -c -q -f {API_PROXY_CONFIG}
ExecStart=/usr/sbin/haproxy -Ws -f {API_PROXY_CONFIG}
ExecReload=/bin/kill -USR2 $MAINPID
Restart=always
RestartSec=2s

[Install]
WantedBy=multi-user.target
"""


def api_server_flags(ctx: HostContext, cfg: KubernetesConfig) -> list[Flag]:
    cluster = ctx.cluster
    flags = [
        Flag(
            "max-requests-inflight",
            str(cfg.max_requests_inflight),
            "API Priority and Fairness shares this many read slots; the 400 default queues "
            "list calls of thousands of kubelets",
        ),
        Flag(
            "max-mutating-requests-inflight",
            str(cfg.max_mutating_requests_inflight),
            "writes (node status, leases) of a large fleet; default 200",
        ),
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
    ]
    if cfg.events_etcd_endpoints:
        flags.append(
            Flag(
                "etcd-servers-overrides",
                "/events#" + ";".join(cfg.events_etcd_endpoints),
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


def controller_manager_flags(ctx: HostContext, cfg: KubernetesConfig) -> list[Flag]:
    flags = [
        Flag(
            "kube-api-qps",
            str(cfg.controller_manager_qps),
            "default 20: node lifecycle and endpoint updates lag minutes at 1,000+ nodes",
        ),
        Flag("kube-api-burst", str(cfg.controller_manager_burst), "default 30"),
        Flag("profiling", "false", "CIS benchmark 1.3.2"),
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


def scheduler_flags(scheduler: SchedulerFiles) -> list[Flag]:
    """The scheduler's flags from the fleet policy's kubeadm section: `config` (the default
    profile) and the gang scheduling gates. kube-scheduler ignores --kube-api-qps/
    --kube-api-burst/--profiling once it reads a configuration file; that file sets them
    (clientConnection, enableProfiling)."""
    reasons = {
        "config": "the default profile (roles/fleet_policy); it also sets the client's "
        "qps/burst and enableProfiling: false (CIS 1.4.1), which kube-scheduler no longer takes "
        "as flags with --config",
        "feature-gates": "in-tree gang scheduling (roles/fleet_policy): the GangScheduling "
        "plugin joins the default profile and reads Workloads (alpha, off by default)",
    }
    return _fleet_policy_flags(scheduler.kubeadm, reasons)


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
    audit_volumes = [
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
            extraVolumes=audit_volumes,
            certSANs=cert_sans(ctx),
        ),
        controllerManager=m.ControlPlaneComponent(
            extraArgs=_args(controller_manager_flags(ctx, cfg))
        ),
        scheduler=m.ControlPlaneComponent(
            extraArgs=_args(scheduler_flags(scheduler)), extraVolumes=scheduler_volumes(scheduler)
        ),
    )


def node_labels(ctx: HostContext, cfg: KubernetesConfig) -> dict[str, str]:
    """kubelet's --node-labels: the inventory's own, the team's (`teams:`), the GPU's."""
    labels = dict(cfg.node_labels)
    labels.update(nodes.node_labels(ctx.cluster, ctx.name))
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


def dump(documents: list[m.Strict], header: str = "") -> str:
    """YAML documents in field order, with a comment header; None fields are left out so
    kubeadm applies its own default."""
    parts = [
        yaml.safe_dump(doc.model_dump(exclude_none=True), sort_keys=False, width=1000)
        for doc in documents
    ]
    return header + "---\n".join(parts)


def reasons_header(title: str, groups: dict[str, list[Flag]]) -> str:
    lines = [f"# Managed by gpuinfra: {title}", "# Why each component flag is set:"]
    for component, flags in groups.items():
        for flag in flags:
            lines.append(f"#   {component} --{flag.name}: {flag.reason}")
    return "\n".join(lines) + "\n"


def validate_documents(text: str) -> list[m.Strict]:
    """Parse a rendered kubeadm/kubelet/Calico file back into the typed models: unknown kinds
    and fields are errors."""
    documents = []
    for data in yaml.load_all(text, Loader=yaml.CSafeLoader):  # libyaml: same data, faster
        if data is None:
            continue
        key = (data.get("apiVersion"), data.get("kind"))
        model = m.MODELS.get(key)  # type: ignore[arg-type]
        if model is None:
            raise ValueError(f"no model for {key[0]} {key[1]}")
        documents.append(model.model_validate(data))
    return documents


AUDIT_POLICY_TEXT = """\
# Managed by gpuinfra: API audit policy. Metadata of every write; nothing of reads (kubelets and
# controllers read all day); Secrets, ConfigMaps and tokens only at metadata level, so no key or
# token ever lands in the audit log.
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    verbs: [get, list, watch]
  - level: None
    users: [system:kube-proxy, system:kube-scheduler, system:kube-controller-manager]
  - level: None
    resources:
      - group: coordination.k8s.io
        resources: [leases]
  - level: None
    resources:
      - group: ""
        resources: [events]
  - level: Metadata
    resources:
      - group: ""
        resources: [secrets, configmaps, serviceaccounts/token]
      - group: authentication.k8s.io
        resources: [tokenreviews]
  - level: Metadata
"""


def calico_resources(loaded: LoadedCluster, cfg: KubernetesConfig) -> list[m.Strict]:
    cluster = loaded.cluster
    return [
        m.IPPool(
            metadata=m.ObjectMeta(name="default-ipv4-ippool"),
            spec=m.IPPoolSpec(
                cidr=str(cluster.networks.pod),
                blockSize=cfg.calico_block_size,
                natOutgoing=cfg.calico_nat_outgoing,
            ),
        ),
        m.BGPConfiguration(
            metadata=m.ObjectMeta(name="default"),
            spec=m.BGPConfigurationSpec(
                nodeToNodeMeshEnabled=cfg.calico_node_mesh, asNumber=cfg.calico_as_number
            ),
        ),
    ]


def calico_config_map(loaded: LoadedCluster, cfg: KubernetesConfig) -> str:
    """The calico-config ConfigMap of the upstream manifest, as this role sets it: the BIRD BGP
    backend (no VXLAN-only mode) and MTU 0 (Calico detects the node's own; no overlay header)."""
    cni = {
        "name": "k8s-pod-network",
        "cniVersion": "0.3.1",
        "plugins": [
            {
                "type": "calico",
                "log_level": "info",
                "datastore_type": "kubernetes",
                "nodename": "__KUBERNETES_NODE_NAME__",
                "mtu": "__CNI_MTU__",
                "ipam": {"type": "calico-ipam"},
                "policy": {"type": "k8s"},
                "kubernetes": {"kubeconfig": "__KUBECONFIG_FILEPATH__"},
            },
            {"type": "portmap", "snat": True, "capabilities": {"portMappings": True}},
            {"type": "bandwidth", "capabilities": {"bandwidth": True}},
        ],
    }

    document = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "calico-config", "namespace": "kube-system"},
        "data": {
            "typha_service_name": "none",
            "calico_backend": "bird",
            "veth_mtu": "0",
            "cni_network_config": json.dumps(cni, indent=2),
        },
    }
    header = f"# Managed by gpuinfra: Calico {cfg.calico_version}, BGP, no encapsulation.\n"
    return header + yaml.safe_dump(document, sort_keys=False, width=1000)


def cluster_settings(loaded: LoadedCluster) -> KubernetesConfig:
    """The first control-plane node's settings: the cluster-wide objects come from there."""
    nodes = loaded.cluster.in_group("control_plane")
    if not nodes:
        return KubernetesConfig()
    return host_config(loaded, nodes[0], "kubernetes", KubernetesConfig)


CALICO_CONFIG_MANIFEST = "kubernetes/calico/calico-config.yaml"
CALICO_RESOURCES_MANIFEST = "kubernetes/calico/calico-resources.yaml"


def cluster_files(loaded: LoadedCluster) -> dict[str, str]:
    """The Calico objects this role sets, under _cluster/ (also on every control-plane node)."""
    if not loaded.cluster.in_group("control_plane"):
        return {}
    cfg = cluster_settings(loaded)
    if not cfg.enabled or cfg.cni != "calico":
        return {}
    resources = dump(calico_resources(loaded, cfg), _calico_header(cfg))
    return {
        CALICO_CONFIG_MANIFEST: calico_config_map(loaded, cfg),
        CALICO_RESOURCES_MANIFEST: resources,
    }


def _calico_header(cfg: KubernetesConfig) -> str:
    return (
        f"# Managed by gpuinfra: Calico {cfg.calico_version} pool and BGP settings: pod CIDR "
        "routed natively (ipipMode/vxlanMode Never).\n"
    )


def repository_url(ctx: HostContext) -> str:
    """The package repository of the pinned minor (pkgs.k8s.io's layout, or a mirror of it)."""
    cfg = settings(ctx)
    minor = ctx.cluster.versions.kubernetes_version.major_minor
    return f"{cfg.repo_url.rstrip('/')}/core:/stable:/v{minor}/deb/"


def repository_sources(ctx: HostContext) -> str:
    return (
        "# Managed by gpuinfra: the Kubernetes packages of one minor version; the key is "
        "pinned by fingerprint.\n"
        "Types: deb\n"
        f"URIs: {repository_url(ctx)}\n"
        "Suites: /\n"
        f"Signed-By: {REPO_KEY}\n"
    )


# ---------------------------------------------------------------- cni: routes

CNI_CONFIG = "/etc/cni/net.d/10-gpuinfra.conflist"
POD_ROUTES_SCRIPT = "/usr/local/sbin/gpuinfra-pod-routes"
POD_ROUTES_UNIT = "/etc/systemd/system/gpuinfra-pod-routes.service"
POD_BRIDGE = "cni0"
POD_ROUTES_UNIT_TEXT = f"""\
# Managed by gpuinfra (role kubernetes, cni: routes): a route to every other node's pod block.
[Unit]
Description=gpuinfra: routes to the other Kubernetes nodes' pod blocks
After=network-online.target
Wants=network-online.target
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={POD_ROUTES_SCRIPT}

[Install]
WantedBy=multi-user.target
"""


def kubernetes_nodes(cluster: Cluster) -> list[str]:
    return [name for group in NODE_GROUPS for name in cluster.in_group(group)]


def cni_config(ctx: HostContext, cfg: KubernetesConfig) -> str:
    """The reference bridge plugin with host-local addresses from this node's block. No IP
    masquerade: pod traffic keeps its address inside the cluster, answered over the routes."""
    block = pod_block(ctx.cluster, ctx.name, cfg.routes_block_prefix)
    document = {
        "cniVersion": "1.0.0",
        "name": "gpuinfra",
        "plugins": [
            {
                "type": "bridge",
                "bridge": POD_BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(block)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def pod_routes_script(ctx: HostContext, cfg: KubernetesConfig) -> str:
    """Replace the node's static routes into the pod network with one per other node, in one
    `ip -batch` (no window without routes); the local block stays on the bridge."""
    cluster = ctx.cluster
    lines = [f"route flush root {cluster.networks.pod} proto static"]
    for name in kubernetes_nodes(cluster):
        if name != ctx.name:
            block = pod_block(cluster, name, cfg.routes_block_prefix)
            address = cluster.hosts[name].address
            lines.append(f"route replace {block} via {address} proto static")
    batch = "\n".join(lines)
    script = (
        "#!/bin/sh\n"
        f"# Managed by gpuinfra (role kubernetes, cni: routes) for {ctx.name}.\n"
        "set -eu\n"
        f"ip -4 -batch - <<'EOF'\n{batch}\nEOF\n"
    )
    if cfg.routes_nat_outgoing:
        script += pod_nat_rules(pod_block(cluster, ctx.name, cfg.routes_block_prefix), cluster)
    return script


POD_NAT_TABLE = "gpuinfra-pod-nat"


def pod_nat_rules(block: ipaddress.IPv4Network, cluster: Cluster) -> str:
    """The nft table that masquerades this node's pods' traffic leaving the pod network: hosts
    with no route back to the pod blocks (etcd, load balancers, DNS) see the node's address.
    Replaced whole in one transaction (the table declared, deleted, declared again), so a rerun
    of the unit never leaves two rules or a moment with none."""
    return (
        "nft -f - <<'EOF'\n"
        f"table ip {POD_NAT_TABLE}\n"
        f"delete table ip {POD_NAT_TABLE}\n"
        f"table ip {POD_NAT_TABLE} {{\n"
        "  chain postrouting {\n"
        "    type nat hook postrouting priority srcnat; policy accept;\n"
        f"    ip saddr {block} ip daddr != {cluster.networks.pod} masquerade\n"
        "  }\n"
        "}\n"
        "EOF\n"
    )


def routes_files(ctx: HostContext, cfg: KubernetesConfig) -> list[ManagedFile]:
    return [
        ManagedFile("kubernetes", CNI_CONFIG, cni_config(ctx, cfg)),
        ManagedFile("kubernetes", POD_ROUTES_SCRIPT, pod_routes_script(ctx, cfg), mode="0755"),
        ManagedFile("kubernetes", POD_ROUTES_UNIT, POD_ROUTES_UNIT_TEXT),
    ]


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = settings(ctx)
    if not cfg.enabled or not ctx.cluster.in_group("control_plane"):
        return []  # the deploy says why (no control plane: nothing for a worker to join)
    files: list[ManagedFile] = []
    if cfg.source in ("pkgs.k8s.io", "mirror"):
        files.append(ManagedFile("kubernetes", REPO_SOURCES, repository_sources(ctx)))
    if cfg.source == "binaries":
        files.append(ManagedFile("kubernetes", KUBELET_UNIT, KUBELET_UNIT_TEXT))
        files.append(ManagedFile("kubernetes", KUBELET_DROPIN, KUBELET_DROPIN_TEXT))
    files.append(
        ManagedFile("kubernetes", KUBELET_PATCH, dump([kubelet_patch(cfg)], _patch_header()))
    )
    if node_local_balancing(ctx.cluster):
        files.append(
            ManagedFile(
                "kubernetes",
                API_PROXY_CONFIG,
                api_proxy_config(ctx),
                check="haproxy -c -q -f {path}",
            )
        )
        files.append(ManagedFile("kubernetes", API_PROXY_UNIT, API_PROXY_UNIT_TEXT))
    if cfg.cni == "routes":
        files += routes_files(ctx, cfg)
    if "control_plane" in ctx.host.groups:
        files.append(ManagedFile("kubernetes", AUDIT_POLICY, AUDIT_POLICY_TEXT, mode="0600"))
        if cfg.cni == "calico":
            resources = dump(calico_resources(ctx.loaded, cfg), _calico_header(cfg))
            files.append(ManagedFile("kubernetes", CALICO_RESOURCES, resources))
            calico = calico_config_map(ctx.loaded, cfg)
            files.append(ManagedFile("kubernetes", CALICO_CONFIG, calico))
        scheduler = scheduler_files(ctx.loaded)
        files.append(ManagedFile("kubernetes", scheduler.config_path, scheduler.config))
        # On every control-plane node (the same paths on each, as pyinfra needs); applied from
        # the first one only (operations.cluster_objects_applied).
        for stage in apply_stages(ctx.cluster_files()):
            managed = ManagedFile("kubernetes", stage.path, stage.content, mode="0600")
            files.append(replace(managed, secret=stage.secret))
    if is_first_control_plane(ctx):
        header = reasons_header(
            f"kubeadm init of {ctx.cluster.name} on {ctx.name}",
            {
                "kube-apiserver": api_server_flags(ctx, cfg),
                "kube-controller-manager": controller_manager_flags(ctx, cfg),
                "kube-scheduler": scheduler_flags(scheduler_files(ctx.loaded)),
            },
        )
        documents: list[m.Strict] = [
            init_configuration(ctx, cfg),
            cluster_configuration(ctx, cfg),
            kubelet_configuration(cfg),
            kube_proxy_configuration(ctx, cfg),
        ]
        files.append(ManagedFile("kubernetes", INIT_CONFIG, dump(documents, header), mode="0600"))
    else:
        header = (
            f"# Managed by gpuinfra: kubeadm join of {ctx.name}. The GPUINFRA_* placeholders are "
            "filled in at join time\n# (a fresh short-lived token, the CA's hash) into a copy "
            f"under {SECRET_DIR} that is removed after the join.\n"
        )
        text = dump([join_configuration(ctx, cfg)], header)
        files.append(ManagedFile("kubernetes", JOIN_CONFIG, text, mode="0600"))
    for managed in files:
        if managed.path in (INIT_CONFIG, KUBELET_PATCH, CALICO_RESOURCES):
            validate_documents(managed.content)
    return files


# ---------------------------------------------------------------- cluster objects

# Where the Kubernetes objects of every role are under _cluster/; Calico's are applied by the
# Calico step instead (its IPPool and BGPConfiguration need the CRDs of the upstream manifest).
OBJECTS_PREFIX = "kubernetes/"
CALICO_PREFIX = "kubernetes/calico/"


@dataclass(frozen=True)
class ApplyStage:
    """One file of cluster objects, applied in name order: CRDs before the objects that use
    them, namespaces before what lives in them."""

    path: str
    content: str
    kinds: str  # what the stage holds, for its header
    secret: bool = False
    crds: bool = False  # waited for (condition Established) before the next stage


STAGES = (
    ("00-crds.yaml", "custom resource definitions", {"CustomResourceDefinition"}),
    ("10-namespaces.yaml", "namespaces", {"Namespace"}),
    ("20-objects.yaml", "objects", None),  # every other kind
)


def cluster_objects(rendered: Mapping[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """(_cluster/ path, object) of every Kubernetes object the kubernetes role applies, in path
    and document order."""
    return [
        (path, obj)
        for path in sorted(rendered)
        if path.startswith(OBJECTS_PREFIX) and not path.startswith(CALICO_PREFIX)
        for obj in yaml.safe_load_all(rendered[path])
        if obj
    ]


def apply_stages(rendered: Mapping[str, str]) -> list[ApplyStage]:
    """The objects of `rendered` (every role's cluster files) split into the apply stages, each
    object under a comment naming the _cluster/ file it comes from; empty stages left out."""
    staged: list[list[tuple[str, dict[str, Any]]]] = [[] for _ in STAGES]
    for path, obj in cluster_objects(rendered):
        first = next(
            i for i, (_, _, kinds) in enumerate(STAGES) if kinds is None or obj.get("kind") in kinds
        )
        staged[first].append((path, obj))
    stages = []
    for (name, kinds, _), taken in zip(STAGES, staged, strict=True):
        if not taken:
            continue
        header = (
            f"# Managed by gpuinfra: the cluster's {kinds}, applied with `kubectl apply "
            f"--server-side --field-manager={FIELD_MANAGER}` from the first control-plane node,\n"
            f"# in file name order ({CLUSTER_OBJECTS_DIR}). Rendered under _cluster/ by every "
            "role; edit the inventory, not this file.\n"
        )
        documents = [
            f"# from _cluster/{path}\n" + yaml.safe_dump(obj, sort_keys=False, width=1000)
            for path, obj in taken
        ]
        stages.append(
            ApplyStage(
                path=f"{CLUSTER_OBJECTS_DIR}/{name}",
                content=header + "---\n".join(documents),
                kinds=kinds,
                secret=any(obj.get("kind") == "Secret" for _, obj in taken),
                crds=name.startswith("00-"),
            )
        )
    return stages


# Server-side apply records this manager as the owner of every field the role sets; a field
# another manager owns is taken over (--force-conflicts): the inventory is the source of truth.
FIELD_MANAGER = "gpuinfra"


def _patch_header() -> str:
    return (
        "# Managed by gpuinfra: this node's kubelet settings, merged by kubeadm over the "
        "cluster's KubeletConfiguration.\n"
    )
