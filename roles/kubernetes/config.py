"""Defaults of the kubernetes role; inventory group_vars/host vars under `kubernetes:` override
them. The Kubernetes version itself is the cluster's `versions.kubernetes`."""

from __future__ import annotations

import re
from ipaddress import IPv4Address
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from inventory.grammar import (
    CheckName,
    DebianRevision,
    Duration,
    ImageRef,
    KeyFingerprint,
    LabelValue,
    QualifiedName,
    Quantity,
    ReleaseTag,
    Sha256,
    Threshold,
    Url,
    VersionText,
)
from toolkit.pacing import Rate, RateInvalid

# kubeadm's preflight checks that stop it from writing over a node's existing directories and
# files (an etcd data dir, a manifest, a kubeconfig).
_DATA_CHECKS = ("DirAvailable", "FileAvailable")


class KubernetesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # False: the role writes and runs nothing, for a cluster whose Kubernetes is managed
    # elsewhere, or a lab whose hosts cannot obtain kubeadm. Set it alike for every host.
    enabled: bool = True
    # Where kubeadm, kubelet and kubectl come from: the Kubernetes package repository for the
    # pinned minor (pkgs.k8s.io, key pinned by fingerprint), a mirror of it, the release binaries
    # checked against SHA-256 pins (Kubespray's way), or a host image that already holds them
    # ("preinstalled": the role only checks their version).
    source: Literal["pkgs.k8s.io", "mirror", "binaries", "preinstalled"] = "pkgs.k8s.io"
    # The repository root holding core:/stable:/v<minor>/deb/ (pkgs.k8s.io's layout).
    repo_url: Url = "https://pkgs.k8s.io"
    # The Kubernetes release key of the v1.28+ repositories (Release.key of every minor),
    # published at https://kubernetes.io/docs/setup/production-environment/tools/kubeadm/
    repo_key_fingerprint: KeyFingerprint = "DE15B14486CD377B9E876E1A234654DA9A296436"
    # Debian revision of the packages at the pinned version: pkgs.k8s.io publishes "-1.1".
    package_revision: DebianRevision = "1.1"
    # Base URL holding <version>/bin/linux/<arch>/{kubeadm,kubelet,kubectl} (source: binaries).
    binaries_url: Url = "https://dl.k8s.io/release"
    # SHA-256 for source: binaries, per download: the three binaries and the crictl and CNI
    # plugin tarballs. No defaults: a pin is only a pin when it was read from the release's own
    # checksum files by whoever sets the version.
    binary_sha256: dict[
        Literal["kubeadm", "kubelet", "kubectl", "crictl", "cni-plugins"], Sha256
    ] = Field(default_factory=dict)
    # SHA-256 of kubeadm, kubelet and kubectl of other releases, by version ("1.36.3"): where
    # `gpuinfra kubernetes upgrade` may take the cluster with source: binaries (Kubespray keeps
    # such a table of every release it knows). The target's own pins, read the same way.
    release_sha256: dict[VersionText, dict[Literal["kubeadm", "kubelet", "kubectl"], Sha256]] = (
        Field(default_factory=dict)
    )
    # The CNI plugins and crictl that go with Kubernetes 1.35 (source: binaries). No crictl
    # (None): kubeadm talks CRI itself; crictl is only the operator's debugging tool.
    cni_plugins_version: VersionText = "1.9.0"
    cri_tools_version: VersionText | None = "1.35.0"
    # Where source: binaries finds them: the projects' release downloads, or a file server of
    # the same layout (Kubespray's offline `files_repo`).
    cni_plugins_url: Url = "https://github.com/containernetworking/plugins/releases/download"
    cri_tools_url: Url = "https://github.com/kubernetes-sigs/cri-tools/releases/download"
    # Where kubeadm pulls the control plane's, kube-proxy's, CoreDNS's and pause images from;
    # a fleet mirror usually mirrors registry.k8s.io under the same names (container_runtime's
    # registry_mirrors) and leaves this alone.
    image_repository: ImageRef = "registry.k8s.io"
    # CoreDNS's image tag; None: the one this kubeadm release names.
    coredns_image_tag: str | None = Field(None, pattern=r"^v\d+\.\d+\.\d+$")
    # CoreDNS replicas, one node each while nodes allow. None: one per 16 nodes, at least 2
    # (cluster-proportional-autoscaler's linear rule, inventory/sizing.py).
    coredns_replicas: int | None = Field(None, ge=1)

    # The pod network. "calico": Calico in BGP mode (production). "routes": the reference CNI
    # plugins (bridge, host-local) with one pod block per node taken from the inventory and a
    # route to every other node's block: native routing with nothing running on the cluster,
    # for nodes on one layer-2 segment (the lab, where Calico's BIRD cannot run).
    cni: Literal["calico", "routes"] = "calico"
    # The pod block of each node in "routes" mode (a /24: 254 pods, over the 110-pod limit).
    routes_block_prefix: int = Field(24, ge=16, le=28)
    # "routes" mode: masquerade pod traffic leaving the pod network (nft table
    # gpuinfra-pod-nat, loaded by the pod routes unit), so hosts with no route back to the pod
    # blocks (etcd, load balancers, DNS) can answer a pod; Calico's calico_nat_outgoing does
    # the same, and is on by default too. CoreDNS needs it: it forwards every name outside the
    # cluster from its pod to the nodes' DNS servers (the conformance suite's DNS test timed out
    # on the nodes' search domain without it). Off only where the routers carry the pod blocks.
    routes_nat_outgoing: bool = True

    # Calico in BGP mode with no encapsulation: pod CIDRs routed natively between nodes (the
    # reference design left Flannel's overlay for ~2 Gbit/s against 10-15 host to host).
    calico_version: ReleaseTag = "v3.29.1"
    # Full node-to-node BGP mesh up to ~100 nodes (Calico's advice); past that, route reflectors:
    # the control-plane nodes, which every node peers with (None: by the fleet's size,
    # inventory/sizing.py).
    calico_node_mesh: bool | None = None
    # The route reflectors' cluster ID: an IPv4 address no node uses (Calico's own example).
    calico_route_reflector_cluster_id: IPv4Address = IPv4Address("244.0.0.1")
    # calico-node reaches the API server through Typha past 50 nodes (None: by the fleet's
    # size, inventory/sizing.py; 0: no Typha, Calico's plain manifest).
    calico_typha_replicas: int | None = Field(None, ge=0, le=20)
    calico_as_number: int = Field(64512, ge=1, le=4294967295)
    # A /26 per node: 64 pod addresses, over the 110-pod default only with maxPods raised below.
    calico_block_size: int = Field(26, ge=20, le=32)
    # Pods reach outside the cluster through their node's address.
    calico_nat_outgoing: bool = True
    # SHA-256 of the upstream manifest of calico_version (calico.yaml, or calico-typha.yaml with
    # Typha): applied only when set (the role never applies an unpinned download; this machine
    # could not fetch it to pin it).
    calico_manifest_sha256: Sha256 | None = None

    # Workers join at most this many per interval, slower when the API answers 429/5xx: joining
    # hundreds at once overloaded the API servers of the reference design.
    join_rate: str = "5/10s"
    # Bootstrap tokens live 15 minutes: long enough for one run's joins, useless afterwards.
    token_ttl: Duration = "15m"
    # Seconds a joined control-plane node gets to answer /healthz and to turn Ready.
    ready_timeout_s: int = Field(300, ge=10)

    # The API server's read and write slots (summed into its total concurrency under API
    # Priority and Fairness). None: derived from the inventory's node count, upstream's 400/200
    # up to ~670 nodes, 3,000/1,000 from 5,000 (inventory/sizing.py says why).
    max_requests_inflight: int | None = Field(None, ge=1)
    max_mutating_requests_inflight: int | None = Field(None, ge=1)
    # Events in their own etcd (large-cluster option): the etcd role's Events cluster when
    # etcd.events.enabled (nothing to set here), or these "https://host:2379" endpoints of an
    # external one, which win over it. The same etcd client certificate reaches both.
    events_etcd_endpoints: list[Url] = Field(default_factory=list)
    # Secrets encrypted at rest with a key kept in the cluster's state (encryption.py): etcd,
    # its snapshots and backups hold them as ciphertext (CIS benchmark 1.2.27/1.2.28).
    encrypt_secrets: bool = True
    # Audit log: kept 7 days, 10 files of 100 MB, so the control plane's disk never fills.
    audit_log_maxage: int = Field(7, ge=1)
    audit_log_maxbackup: int = Field(10, ge=1)
    audit_log_maxsize: int = Field(100, ge=1)
    # controller-manager and scheduler talk to the API at 20/30 QPS/burst by default: a
    # thousand-node cluster starves them (node lifecycle, endpoint updates lag minutes).
    controller_manager_qps: int = Field(100, ge=1)
    controller_manager_burst: int = Field(200, ge=1)
    scheduler_qps: int = Field(100, ge=1)
    scheduler_burst: int = Field(200, ge=1)

    # What production cannot carry but an inventory may take on purpose (the lab's nested
    # hosts on the machine's cgroup v1): "fail_cgroup_v1" lets fail_cgroup_v1 be false,
    # "ignore_preflight_errors" lets it name `all` or a check that keeps kubeadm from writing
    # over a node's existing files (DirAvailable--*, FileAvailable--*). Refused otherwise.
    # Declared before the settings it allows: their checks read it.
    accept_unsafe: list[Literal["fail_cgroup_v1", "ignore_preflight_errors"]] = Field(
        default_factory=list
    )
    # kubelet and containerd must use one cgroup driver: systemd wherever systemd runs the host
    # on cgroup v2 (every current Ubuntu LTS). cgroupfs only where systemd cannot delegate the
    # controllers (the lab's nested hosts on the machine's cgroup v1).
    cgroup_driver: Literal["systemd", "cgroupfs"] = "systemd"
    # Kubernetes 1.35+ refuses cgroup v1 (KEP-5573); false lets kubelet start there. A lab-only
    # setting: a production host on cgroup v1 should move to v2, not carry this.
    fail_cgroup_v1: bool = True
    # kubeadm preflight checks to turn into warnings, e.g. SystemVerification on the lab's
    # cgroup v1 hosts. Empty in production: each failed check is a real problem there.
    ignore_preflight_errors: list[CheckName] = Field(default_factory=list)

    # kubelet: the 110-pod upstream limit; GPU nodes run few large pods, so no reason to raise.
    max_pods: int = Field(110, ge=10, le=250)
    # Reserved for the OS and for kubelet/containerd, so a pod burst never starves sshd.
    system_reserved: dict[QualifiedName, Quantity] = Field(
        default_factory=lambda: {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"}
    )
    kube_reserved: dict[QualifiedName, Quantity] = Field(
        default_factory=lambda: {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"}
    )
    # Evict before the node itself runs out (kubelet's defaults plus a memory margin).
    eviction_hard: dict[QualifiedName, Threshold] = Field(
        default_factory=lambda: {
            "memory.available": "500Mi",
            "nodefs.available": "10%",
            "imagefs.available": "15%",
            "nodefs.inodesFree": "5%",
        }
    )
    # Labels every node of this group/host registers with (GPU workers add theirs).
    node_labels: dict[QualifiedName, LabelValue] = Field(default_factory=dict)

    # kube-proxy in IPVS mode: O(1) service lookups where iptables mode walks long chains at
    # thousands of services (Kubespray's default too).
    kube_proxy_mode: Literal["ipvs", "iptables", "nftables"] = "ipvs"
    # kube-proxy raises nf_conntrack_max to 32768 per core by default; 0 leaves the kernel's
    # value, for hosts where it is the machine's and read-only (the lab, like kind's nodes).
    kube_proxy_conntrack_max_per_core: int | None = Field(None, ge=0)

    # Clusters without load-balancer nodes: an HAProxy on every node in front of every API
    # server (Kubespray's default), so kubelets survive the loss of one API server.
    node_local_lb_port: int = Field(6444, ge=1, le=65535)

    @field_validator("join_rate")
    @classmethod
    def _rate(cls, value: str) -> str:
        try:
            Rate.parse(value)
        except RateInvalid as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("release_sha256")
    @classmethod
    def _release_versions(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for version in value:
            if not re.fullmatch(r"\d+\.\d+\.\d+", version):
                raise ValueError(f"{version!r} is not a Kubernetes version (1.36.3)")
        return value

    @field_validator("fail_cgroup_v1")
    @classmethod
    def _cgroup_v1_on_purpose(cls, fail: bool, info: ValidationInfo) -> bool:
        if not fail and "fail_cgroup_v1" not in info.data.get("accept_unsafe", ()):
            raise ValueError(
                "false runs kubelet on cgroup v1, which Kubernetes 1.35 refuses (KEP-5573): "
                "move the hosts to cgroup v2, or take it on purpose with "
                "accept_unsafe: [fail_cgroup_v1]"
            )
        return fail

    @field_validator("ignore_preflight_errors")
    @classmethod
    def _preflight_on_purpose(cls, checks: list[str], info: ValidationInfo) -> list[str]:
        unsafe = [c for c in checks if c.lower() == "all" or c.startswith(_DATA_CHECKS)]
        if unsafe and "ignore_preflight_errors" not in info.data.get("accept_unsafe", ()):
            raise ValueError(
                f"{', '.join(unsafe)} would let kubeadm run over every check at once or over "
                "what protects a node's files: name the checks that fail, or take it on "
                "purpose with accept_unsafe: [ignore_preflight_errors]"
            )
        return checks

    @model_validator(mode="after")
    def _binaries_need_pins(self) -> KubernetesConfig:
        if self.source == "binaries":
            wanted = {"kubeadm", "kubelet", "kubectl", "cni-plugins"}
            if self.cri_tools_version is not None:
                wanted.add("crictl")
            missing = wanted - set(self.binary_sha256)
            if missing:
                raise ValueError(f"source: binaries needs binary_sha256 for {sorted(missing)}")
        return self
