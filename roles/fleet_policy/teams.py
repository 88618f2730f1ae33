"""Which team owns a node: the inventory's `teams:` section becomes node labels and taints.

The kubernetes role applies these at join (kubeadm's nodeRegistration: taints and kubelet's
`node-labels`); the admission policy in templates/fleet_policy/teams.yaml.j2 keeps each team's
pods off the others' nodes. Validation (inventory/validate.py) already refused a host in two teams.
"""

from __future__ import annotations

from inventory.model import Cluster

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
