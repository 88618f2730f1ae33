"""The labels and taints a node registers with, which the roles agree on.

The kubernetes role applies them at join (kubeadm's nodeRegistration: taints and kubelet's
`node-labels`); gpu_health lifts its preflight taint once a node's GPUs pass; fleet_policy's
admission policy (templates/fleet_policy/teams.yaml.j2) keeps each team's pods off the others'
nodes. Which team owns a node comes from the inventory's `teams:` section; validation
(inventory/validate.py) already refused a host in two teams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command line's --help reads these constants without pydantic
    from inventory.model import Cluster

# A new GPU node must not take work until its GPUs proved themselves (reference design: nodes
# join with a preflight taint that the GPU test DaemonSet removes). Kubelet flag form:
# `--register-with-taints=gpuinfra.io/preflight=true:NoSchedule`.
PREFLIGHT_TAINT_KEY = "gpuinfra.io/preflight"
PREFLIGHT_TAINT_VALUE = "true"
PREFLIGHT_TAINT_EFFECT = "NoSchedule"
PREFLIGHT_TAINT = f"{PREFLIGHT_TAINT_KEY}={PREFLIGHT_TAINT_VALUE}:{PREFLIGHT_TAINT_EFFECT}"
# The only pods that may tolerate it (fleet_policy's admission policy): gpu_health's preflight
# DaemonSet and periodic check Jobs run under these accounts (templates/gpu_health).
GPU_HEALTH_CHECK_ACCOUNTS = ("gpu-health-preflight", "gpu-health-periodic")

# The label kubelet sets on GPU workers (`--node-labels`) so the health DaemonSet lands on them
# only; gpuinfra.io is outside the kubernetes.io prefixes that NodeRestriction reserves.
GPU_WORKER_LABEL_KEY = "gpuinfra.io/gpu-worker"
GPU_WORKER_LABEL_VALUE = "true"

# On GPU workers whose nvidia role installs the container toolkit (containerd's `nvidia`
# runtime): the DaemonSets that run with runtimeClassName nvidia select it, so a node without
# the runtime shows nothing stuck in ContainerCreating.
NVIDIA_RUNTIME_LABEL_KEY = "gpuinfra.io/nvidia-runtime"
NVIDIA_RUNTIME_LABEL_VALUE = "true"

# Outside the kubernetes.io/k8s.io prefixes, so kubelet may set it on itself at registration
# (NodeRestriction reserves those); the reference design used `openai.com/team` the same way.
TEAM_LABEL_KEY = "gpuinfra.io/team"
TEAM_TAINT_KEY = TEAM_LABEL_KEY
# NoSchedule, not NoExecute: a team change must not kill running work; it drains on its own.
TEAM_TAINT_EFFECT = "NoSchedule"


def team_members(cluster: Cluster, team: str) -> list[str]:
    """The team's hosts, named directly or through a group, in inventory order."""
    spec = cluster.teams[team]
    return [
        name
        for name, host in cluster.hosts.items()
        if name in spec.hosts or any(group in host.groups for group in spec.groups)
    ]


def team_of(cluster: Cluster, host: str) -> str | None:
    """The team that owns the host, or None for a shared node."""
    for team in cluster.teams:
        if host in team_members(cluster, team):
            return team
    return None


def team_namespaces(cluster: Cluster, team: str) -> list[str]:
    """Namespaces whose pods count as the team's; the team's own name when none are listed."""
    return list(cluster.teams[team].namespaces) or [team]


def team_taint(team: str) -> str:
    """Kubelet's `--register-with-taints` form."""
    return f"{TEAM_TAINT_KEY}={team}:{TEAM_TAINT_EFFECT}"


def node_labels(cluster: Cluster, host: str) -> dict[str, str]:
    team = team_of(cluster, host)
    return {TEAM_LABEL_KEY: team} if team else {}


def node_taints(cluster: Cluster, host: str) -> list[str]:
    team = team_of(cluster, host)
    return [team_taint(team)] if team else []


@dataclass(frozen=True)
class SchedulerFiles:
    """What the kubernetes role puts on every control-plane node for gang scheduling, as
    fleet_policy renders it (its record provides `scheduler_files`): the upstream
    kube-scheduler, so no image patch."""

    config_path: str  # where kube-scheduler reads `config` from (mounted by kubeadm)
    config: str  # the KubeSchedulerConfiguration: the default profile, client limits
    kubeadm: dict[str, Any]  # the ClusterConfiguration's `scheduler` section (extraArgs, volumes)
    api_server: dict[str, Any]  # its `apiServer` section: feature gates and runtime-config
    controller_manager: dict[str, Any]  # its `controllerManager` section ({} when none)
