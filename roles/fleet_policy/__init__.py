"""GPU fleet policy on the cluster: team isolation (labels, taints, an admission policy),
balloons that keep capacity warm, gang scheduling (scheduler-plugins Coscheduling) and GPU
metrics (device plugin, DCGM exporter, scrape jobs). The preflight gate and the budgeted
periodic check are gpu_health's (roles/gpu_health/gate.py and its manifest).

Cluster-wide only: no host phases; the kubernetes role applies the rendered objects with
server-side apply and places the scheduler files. For that role: `team_of`, `node_labels`,
`node_taints` and the label/taint constants below.
"""

from __future__ import annotations

from collections.abc import Mapping

from inventory.model import LoadedCluster
from roles.fleet_policy.config import FleetPolicyConfig
from roles.fleet_policy.teams import (
    TEAM_LABEL_KEY,
    TEAM_TAINT_EFFECT,
    TEAM_TAINT_KEY,
    node_labels,
    node_taints,
    team_of,
    team_taint,
)
from roles.spec import Role

__all__ = [
    "ROLE",
    "TEAM_LABEL_KEY",
    "TEAM_TAINT_EFFECT",
    "TEAM_TAINT_KEY",
    "node_labels",
    "node_taints",
    "team_of",
    "team_taint",
]


def cluster_files(loaded: LoadedCluster) -> Mapping[str, str]:
    # Deferred: files.py reaches the engine's render_template and gpu_health's settings, which
    # import the registry; the registry imports this package for FleetPolicyConfig.
    from roles.fleet_policy import files

    return files.cluster_files(loaded)


def cluster_checks(loaded: LoadedCluster, settings: object) -> list[tuple[str, str]]:
    from roles.fleet_policy.checks import problems

    return list(problems(loaded))


ROLE = Role(
    name="fleet_policy",
    config=FleetPolicyConfig,
    cluster_files=cluster_files,
    checks=cluster_checks,
    summary="team isolation, balloons, gang scheduling and GPU metrics on the cluster",
)
