"""The cluster inventory model: one validated description of a GPU cluster, from cluster.yml."""

from __future__ import annotations

import functools
import ipaddress
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from inventory.grammar import ConfigPath, DnsName, LabelValue, LoginName, PlainPath, VersionText
from inventory.versions import (
    DEFAULT_CONTAINERD,
    DEFAULT_ETCD,
    DEFAULT_KUBERNETES,
    KubernetesVersion,
    check_kubernetes_version,
)

# The groups a host can belong to, and what each one means. Documented in docs/inventory.md too.
# `Group` below spells the same names for type checkers, in the same order (pydantic's error
# lists them so); tests/unit/test_validation.py keeps the two equal.
GROUPS: dict[str, str] = {
    "etcd": "dedicated etcd members (odd count; 5 in the reference design), data on local disk",
    "control_plane": "Kubernetes API server, controller-manager and scheduler (kubeadm)",
    "loadbalancer": "HAProxy in front of the API servers; two share a keepalived virtual address",
    "dns": "Bind9 for the cluster domain: the first host is the primary, the rest secondaries",
    "monitoring": "Prometheus (and Grafana where used) scraping every host",
    "gpu_worker": "Kubernetes workers with NVIDIA GPUs; need a gpu spec",
    "cpu_worker": "Kubernetes workers without GPUs",
    "storage": "CephFS storage hosts (mon, mgr, MDS, one OSD per data disk); 3 or more",
}
Group = Literal[
    "etcd",
    "control_plane",
    "loadbalancer",
    "dns",
    "monitoring",
    "gpu_worker",
    "cpu_worker",
    "storage",
]
TargetOS = Literal["ubuntu-22.04", "ubuntu-24.04", "debian-12", "debian-13"]

HostName = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"),
]

# "1.36.3" (or "v1.36.3"), kept as written; `Versions.kubernetes_version` is the parsed value.
KubernetesVersionText = Annotated[str, AfterValidator(check_kubernetes_version)]

# [user@]host[:port], as `ssh -J` takes it.
JumpHost = Annotated[str, StringConstraints(pattern=r"^([^@\s:]+@)?[^@\s:]+(:\d{1,5})?$")]


class Strict(BaseModel):
    """Every model forbids unknown keys: a typo in the inventory must never pass silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Versions(Strict):
    """Pinned versions; the NVIDIA stack is checked against each other by the nvidia role."""

    # What the lab builds and runs together; why each, in inventory/versions.py.
    kubernetes: KubernetesVersionText = DEFAULT_KUBERNETES
    etcd: VersionText = DEFAULT_ETCD
    containerd: VersionText = DEFAULT_CONTAINERD
    docker: VersionText = "26.1.5"
    nvidia_driver: str = "550.163.01"
    cuda: str = "12.4"
    cudnn: str = "9.1.0"
    nccl: str = "2.22.3"

    @property
    def kubernetes_version(self) -> KubernetesVersion:
        return KubernetesVersion.parse(self.kubernetes)


class Networks(Strict):
    node: ipaddress.IPv4Network
    pod: ipaddress.IPv4Network = ipaddress.IPv4Network("10.128.0.0/12")
    service: ipaddress.IPv4Network = ipaddress.IPv4Network("10.96.0.0/16")
    # Networks allowed to reach SSH and the Kubernetes API; the node network always may.
    admin: list[ipaddress.IPv4Network] = Field(default_factory=list)


class SSH(Strict):
    user: LoginName = "root"
    # Private key on the controller; relative paths are taken from the cluster file's folder.
    key: ConfigPath | None = None
    # known_hosts used for strict host-key checking; never turned off.
    known_hosts: ConfigPath = Path("~/.ssh/known_hosts")
    port: int = Field(22, ge=1, le=65535)
    # Jump host as [user@]host[:port] (the user defaults to `user`), when the nodes are not
    # directly reachable. Its host key is checked against `known_hosts` like the nodes'.
    bastion: JumpHost | None = None


class API(Strict):
    # Virtual address keepalived holds on the load balancers (needed with two of them).
    vip: ipaddress.IPv4Address | None = None
    port: int = Field(6443, ge=1, le=65535)


class GPUSpec(Strict):
    # nvidia.com/gpu.product, a node label: H100-SXM5-80GB.
    model: LabelValue
    count: int = Field(ge=1, le=16)


class EtcdHost(Strict):
    # A dedicated local SSD/NVMe for etcd's data, e.g. /dev/nvme1n1; a plain directory without.
    disk: PlainPath | None = None
    # etcd member name when it must differ from the host name (imported Kubespray inventories).
    member_name: HostName | None = None


class Host(Strict):
    address: ipaddress.IPv4Address
    groups: list[Group] = Field(min_length=1)
    gpu: GPUSpec | None = None
    etcd: EtcdHost | None = None
    # Per-host role settings, shaped like group_vars: {role: {key: value}}.
    vars: dict[str, dict[str, Any]] = Field(default_factory=dict)


class Team(Strict):
    """Nodes one team owns: they carry its label and taint, and only its pods tolerate them."""

    hosts: list[HostName] = Field(default_factory=list)
    groups: list[Group] = Field(default_factory=list)
    # Namespaces whose pods run as this team (an admission policy holds them to its nodes).
    namespaces: list[HostName] = Field(default_factory=list)


class Cluster(Strict):
    name: HostName
    domain: DnsName
    os: TargetOS = "ubuntu-22.04"
    versions: Versions = Field(default_factory=Versions)
    networks: Networks
    ssh: SSH = Field(default_factory=SSH)
    api: API = Field(default_factory=API)
    hosts: dict[HostName, Host]
    # Role settings per group: {group: {role: {key: value}}}. "all" applies to every host,
    # then each of the host's groups in the order it lists them, then the host's own vars.
    group_vars: dict[Literal["all"] | Group, dict[str, dict[str, Any]]] = Field(
        default_factory=dict
    )
    # Team -> its hosts or groups; see roles/fleet_policy (labels, taints, admission policy).
    teams: dict[HostName, Team] = Field(default_factory=dict)

    def in_group(self, group: str) -> list[str]:
        """Host names in a group, in inventory order (indexed once: roles ask this for every
        host, and a scan of 7,500 hosts per question made each host's files cost O(fleet))."""
        return list(self._members.get(group, ()))

    @functools.cached_property
    def _members(self) -> dict[str, list[str]]:
        members: dict[str, list[str]] = {}
        for name, host in self.hosts.items():
            for group in host.groups:
                members.setdefault(group, []).append(name)
        return members

    def etcd_member(self, host: str) -> str:
        entry = self.hosts[host].etcd
        return entry.member_name if entry and entry.member_name else host

    def fqdn(self, host: str) -> str:
        return f"{host}.{self.domain}"


class StateAccess(StrEnum):
    """What a command may do with the controller's state (`.state/`: the etcd CA and
    certificates, the TSIG and VRRP secrets, zone serials) when a piece of it is missing."""

    # apply (and etcd day-2): make what is missing; only apply may start a cluster's state.
    create = "create"
    # plan, drift, verify: read it; a missing secret is an error, nothing is ever written.
    existing = "existing"
    # render: read it; a missing secret is rendered as a placeholder, nothing is written.
    placeholder = "placeholder"


class LoadedCluster(BaseModel):
    """A validated cluster and where it came from (for messages and relative paths)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    cluster: Cluster
    source: Path  # the file that was read (cluster.yml or the Ansible inventory)
    base_dir: Path  # relative paths in the file are taken from here
    # sha256 of the text a cluster file was parsed from (paths.text_digest); None for imports.
    text_digest: str | None = Field(default=None, repr=False)
    # Line of each key path in the source (for errors found after load); empty for imports.
    lines: dict[tuple[str, ...], int] = Field(default_factory=dict, repr=False)
    # host -> role -> the role's typed settings, merged and validated as a whole at load by the
    # roles' layer (engine/context.py); empty when only the inventory layer loaded the cluster.
    settings: dict[str, dict[str, Any]] = Field(default_factory=dict, repr=False)
    # Set by each command (`with_state_access`); library callers and day-2 commands create.
    state_access: StateAccess = StateAccess.create

    def with_state_access(self, access: StateAccess) -> LoadedCluster:
        return self.model_copy(update={"state_access": access})

    def resolve(self, path: Path) -> Path:
        path = path.expanduser()
        return path if path.is_absolute() else (self.base_dir / path)

    @property
    def state_dir(self) -> Path:
        """Where generated secrets (PKI, TSIG keys) and run reports live; ignored by git."""
        return self.base_dir / ".state"
