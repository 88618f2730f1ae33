"""Typed models of the kubeadm v1beta4 and kubelet/kube-proxy configuration fields this role
writes, and of the two Calico resources it renders; `dump` writes them as YAML and
`validate_documents` reads a rendered file back into them.

Every model forbids unknown fields and uses the upstream field names, so a typo or a field that
does not exist in the pinned API version is an error here, offline, before `kubeadm config
validate` sees the file on a host. Only the fields the role sets are modelled: kubeadm fills in
the rest with its defaults. Sources: kubeadm's v1beta4 API reference (kubeadm.k8s.io/v1beta4),
kubelet.config.k8s.io/v1beta1, kubeproxy.config.k8s.io/v1alpha1, Calico's
crd.projectcalico.org/v1 IPPool, BGPConfiguration and BGPPeer reference.
"""

from __future__ import annotations

import re
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

KUBEADM_API = "kubeadm.k8s.io/v1beta4"
KUBELET_API = "kubelet.config.k8s.io/v1beta1"
KUBE_PROXY_API = "kubeproxy.config.k8s.io/v1alpha1"
CALICO_API = "crd.projectcalico.org/v1"

# Placeholders for what only exists at join time (a bootstrap token, the CA's hash, the
# certificate key): the rendered file never holds a secret; the join step fills them into a
# copy in a 0700 directory, validates it and removes it after the join.
TOKEN_PLACEHOLDER = "GPUINFRA_JOIN_TOKEN"
CA_HASH_PLACEHOLDER = "GPUINFRA_CA_CERT_HASH"
CERT_KEY_PLACEHOLDER = "GPUINFRA_CERTIFICATE_KEY"

_TOKEN = re.compile(r"^[a-z0-9]{6}\.[a-z0-9]{16}$")
_CA_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_CERT_KEY = re.compile(r"^[0-9a-f]{64}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Arg(Strict):
    """v1beta4 passes component flags as name/value pairs (v1beta3 used a map)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    value: str


class Taint(Strict):
    key: str
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodeRegistration(Strict):
    name: str
    criSocket: str = "unix:///run/containerd/containerd.sock"
    # None lets kubeadm taint control-plane nodes; a list (even empty) replaces its default.
    taints: list[Taint] | None = None
    kubeletExtraArgs: list[Arg] = Field(default_factory=list)
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    ignorePreflightErrors: list[str] | None = None


class APIEndpoint(Strict):
    advertiseAddress: str
    bindPort: int = Field(ge=1, le=65535)


class Patches(Strict):
    directory: str


class BootstrapToken(Strict):
    """A token kubeadm init creates; without `token` kubeadm generates it (never in a file)."""

    description: str
    ttl: str = Field(pattern=r"^(\d+h)?(\d+m)?(\d+s)?$")
    usages: list[Literal["signing", "authentication"]]
    groups: list[str]


class InitConfiguration(Strict):
    apiVersion: Literal["kubeadm.k8s.io/v1beta4"] = KUBEADM_API
    kind: Literal["InitConfiguration"] = "InitConfiguration"
    bootstrapTokens: list[BootstrapToken] = Field(default_factory=list)
    nodeRegistration: NodeRegistration
    localAPIEndpoint: APIEndpoint
    patches: Patches | None = None


class BootstrapTokenDiscovery(Strict):
    apiServerEndpoint: str
    token: str
    caCertHashes: list[str] = Field(min_length=1)
    # Present only to be refused: discovery is always pinned to the CA's hash.
    unsafeSkipCAVerification: Literal[False] = False

    @field_validator("token")
    @classmethod
    def _token(cls, value: str) -> str:
        if value != TOKEN_PLACEHOLDER and not _TOKEN.match(value):
            raise ValueError("a bootstrap token is [a-z0-9]{6}.[a-z0-9]{16}")
        return value

    @field_validator("caCertHashes")
    @classmethod
    def _hashes(cls, values: list[str]) -> list[str]:
        for value in values:
            if value != CA_HASH_PLACEHOLDER and not _CA_HASH.match(value):
                raise ValueError(f"{value!r} is not sha256:<64 hex digits>")
        return values


class Discovery(Strict):
    bootstrapToken: BootstrapTokenDiscovery


class JoinControlPlane(Strict):
    localAPIEndpoint: APIEndpoint
    certificateKey: str

    @field_validator("certificateKey")
    @classmethod
    def _key(cls, value: str) -> str:
        if value != CERT_KEY_PLACEHOLDER and not _CERT_KEY.match(value):
            raise ValueError("a certificate key is 64 hex digits")
        return value


class JoinConfiguration(Strict):
    apiVersion: Literal["kubeadm.k8s.io/v1beta4"] = KUBEADM_API
    kind: Literal["JoinConfiguration"] = "JoinConfiguration"
    nodeRegistration: NodeRegistration
    discovery: Discovery
    controlPlane: JoinControlPlane | None = None
    patches: Patches | None = None


class ExternalEtcd(Strict):
    endpoints: list[str] = Field(min_length=1)
    caFile: str
    certFile: str
    keyFile: str

    @field_validator("endpoints")
    @classmethod
    def _https(cls, values: list[str]) -> list[str]:
        for value in values:
            if not value.startswith("https://"):
                raise ValueError(f"etcd endpoint {value!r} is not https://")
        return values


class Etcd(Strict):
    external: ExternalEtcd


class HostPathMount(Strict):
    name: str
    hostPath: str
    mountPath: str
    readOnly: bool = False
    pathType: Literal["DirectoryOrCreate", "Directory", "File", "FileOrCreate"]


class ControlPlaneComponent(Strict):
    extraArgs: list[Arg] = Field(default_factory=list)
    extraVolumes: list[HostPathMount] = Field(default_factory=list)


class APIServer(ControlPlaneComponent):
    certSANs: list[str] = Field(default_factory=list)


class Networking(Strict):
    podSubnet: str
    serviceSubnet: str
    dnsDomain: str = "cluster.local"


class DNS(Strict):
    """kubeadm's CoreDNS image; the repository follows imageRepository unless set here."""

    imageTag: str | None = None


class ClusterConfiguration(Strict):
    apiVersion: Literal["kubeadm.k8s.io/v1beta4"] = KUBEADM_API
    kind: Literal["ClusterConfiguration"] = "ClusterConfiguration"
    kubernetesVersion: str = Field(pattern=r"^v\d+\.\d+\.\d+$")
    clusterName: str
    controlPlaneEndpoint: str = Field(pattern=r"^[A-Za-z0-9.-]+:\d+$")
    certificatesDir: str = "/etc/kubernetes/pki"
    imageRepository: str | None = None
    dns: DNS | None = None
    etcd: Etcd
    networking: Networking
    apiServer: APIServer
    controllerManager: ControlPlaneComponent
    scheduler: ControlPlaneComponent


Quantities = dict[str, str]


class KubeletConfiguration(Strict):
    apiVersion: Literal["kubelet.config.k8s.io/v1beta1"] = KUBELET_API
    kind: Literal["KubeletConfiguration"] = "KubeletConfiguration"
    cgroupDriver: Literal["systemd", "cgroupfs"] = "systemd"
    containerRuntimeEndpoint: str = "unix:///run/containerd/containerd.sock"
    serializeImagePulls: bool = False
    maxParallelImagePulls: int | None = Field(None, ge=1)
    maxPods: int = Field(ge=1)
    systemReserved: Quantities = Field(default_factory=dict)
    kubeReserved: Quantities = Field(default_factory=dict)
    evictionHard: Quantities = Field(default_factory=dict)
    rotateCertificates: bool = True
    # Serving certificates signed by the cluster CA instead of self-signed ones.
    serverTLSBootstrap: bool = False
    # The swap the kernel role turns off stays a hard requirement.
    failSwapOn: bool = True
    # Only ever written as false (a cgroup v1 host that must still run kubelet 1.35+).
    failCgroupV1: bool | None = None


class KubeletPatch(Strict):
    """A merge patch kubeadm applies to the cluster-wide KubeletConfiguration on one node:
    kubeadm's `patches.directory`, file `kubeletconfiguration+merge.yaml`."""

    apiVersion: Literal["kubelet.config.k8s.io/v1beta1"] = KUBELET_API
    kind: Literal["KubeletConfiguration"] = "KubeletConfiguration"
    maxPods: int = Field(ge=1)
    systemReserved: Quantities
    kubeReserved: Quantities
    evictionHard: Quantities


class IPVSConfiguration(Strict):
    strictARP: bool = False


class KubeProxyConfiguration(Strict):
    apiVersion: Literal["kubeproxy.config.k8s.io/v1alpha1"] = KUBE_PROXY_API
    kind: Literal["KubeProxyConfiguration"] = "KubeProxyConfiguration"
    mode: Literal["ipvs", "iptables", "nftables"]
    clusterCIDR: str
    ipvs: IPVSConfiguration | None = None
    conntrack: ConntrackConfiguration | None = None


class ConntrackConfiguration(Strict):
    # 0: leave the kernel's nf_conntrack_max as it is.
    maxPerCore: int = Field(ge=0)


class ObjectMeta(Strict):
    name: str


class IPPoolSpec(Strict):
    cidr: str
    blockSize: int = Field(ge=20, le=32)
    # Native routing: neither IP-in-IP nor VXLAN.
    ipipMode: Literal["Never"] = "Never"
    vxlanMode: Literal["Never"] = "Never"
    natOutgoing: bool
    nodeSelector: str = "all()"


class IPPool(Strict):
    apiVersion: Literal["crd.projectcalico.org/v1"] = CALICO_API
    kind: Literal["IPPool"] = "IPPool"
    metadata: ObjectMeta
    spec: IPPoolSpec


class BGPConfigurationSpec(Strict):
    nodeToNodeMeshEnabled: bool
    asNumber: int = Field(ge=1, le=4294967295)
    logSeverityScreen: Literal["Info", "Warning", "Error", "Debug"] = "Info"


class BGPConfiguration(Strict):
    apiVersion: Literal["crd.projectcalico.org/v1"] = CALICO_API
    kind: Literal["BGPConfiguration"] = "BGPConfiguration"
    metadata: ObjectMeta
    spec: BGPConfigurationSpec


class BGPPeerSpec(Strict):
    """Every node (`all()`) peers with the nodes the peer selector picks: the route reflectors."""

    nodeSelector: str
    peerSelector: str


class BGPPeer(Strict):
    apiVersion: Literal["crd.projectcalico.org/v1"] = CALICO_API
    kind: Literal["BGPPeer"] = "BGPPeer"
    metadata: ObjectMeta
    spec: BGPPeerSpec


class AuditGroupResources(Strict):
    group: str
    resources: list[str]


class AuditRule(Strict):
    level: Literal["None", "Metadata", "Request", "RequestResponse"]
    verbs: list[str] | None = None
    users: list[str] | None = None
    resources: list[AuditGroupResources] | None = None


class AuditPolicy(Strict):
    """audit.k8s.io/v1 Policy: a file the API server reads, not an object it serves, so the
    official OpenAPI schemas do not hold it."""

    apiVersion: Literal["audit.k8s.io/v1"] = "audit.k8s.io/v1"
    kind: Literal["Policy"] = "Policy"
    omitStages: list[Literal["RequestReceived", "ResponseStarted", "ResponseComplete", "Panic"]]
    rules: list[AuditRule] = Field(min_length=1)


class EncryptedResources(Strict):
    resources: list[str] = Field(min_length=1)
    # One provider per entry, keyed by its kind (secretbox, aescbc, kms, identity, ...); the
    # first one writes, all of them read.
    providers: list[dict[str, dict]] = Field(min_length=1)

    @field_validator("providers")
    @classmethod
    def _one_kind_each(cls, providers: list[dict[str, dict]]) -> list[dict[str, dict]]:
        for provider in providers:
            if len(provider) != 1:
                raise ValueError(f"a provider names one kind, not {sorted(provider)}")
        return providers


class EncryptionConfiguration(Strict):
    """apiserver.config.k8s.io/v1 EncryptionConfiguration: a file the API server reads."""

    apiVersion: Literal["apiserver.config.k8s.io/v1"] = "apiserver.config.k8s.io/v1"
    kind: Literal["EncryptionConfiguration"] = "EncryptionConfiguration"
    resources: list[EncryptedResources] = Field(min_length=1)


# kind -> model, for validating a rendered multi-document file by its documents' kinds.
MODELS: dict[tuple[str, str], type[Strict]] = {
    (KUBEADM_API, "InitConfiguration"): InitConfiguration,
    (KUBEADM_API, "JoinConfiguration"): JoinConfiguration,
    (KUBEADM_API, "ClusterConfiguration"): ClusterConfiguration,
    (KUBELET_API, "KubeletConfiguration"): KubeletConfiguration,
    (KUBE_PROXY_API, "KubeProxyConfiguration"): KubeProxyConfiguration,
    (CALICO_API, "IPPool"): IPPool,
    (CALICO_API, "BGPConfiguration"): BGPConfiguration,
    (CALICO_API, "BGPPeer"): BGPPeer,
    ("audit.k8s.io/v1", "Policy"): AuditPolicy,
    ("apiserver.config.k8s.io/v1", "EncryptionConfiguration"): EncryptionConfiguration,
}


def dump(documents: list[Strict], header: str = "") -> str:
    """YAML documents in field order, with a comment header; None fields are left out so
    kubeadm applies its own default."""
    parts = [
        yaml.safe_dump(doc.model_dump(exclude_none=True), sort_keys=False, width=1000)
        for doc in documents
    ]
    return header + "---\n".join(parts)


def validate_documents(text: str) -> list[Strict]:
    """Parse a rendered kubeadm/kubelet/Calico file back into the typed models: unknown kinds
    and fields are errors."""
    documents = []
    for data in yaml.load_all(text, Loader=yaml.CSafeLoader):  # libyaml: same data, faster
        if data is None:
            continue
        key = (data.get("apiVersion"), data.get("kind"))
        model = MODELS.get(key)  # type: ignore[arg-type]
        if model is None:
            raise ValueError(f"no model for {key[0]} {key[1]}")
        documents.append(model.model_validate(data))
    return documents
