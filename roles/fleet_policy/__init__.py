"""GPU fleet policy on the cluster: team isolation (labels, taints, an admission policy),
balloons that keep capacity warm, gang scheduling (Kubernetes' in-tree GangScheduling plugin)
and GPU metrics (device plugin, DCGM exporter, scrape jobs). The preflight gate and the budgeted
periodic check are gpu_health's (gpuhealth/gate.py and its manifest).

Cluster-wide only (the record in role.py has no host phases): the kubernetes role applies the
rendered objects with server-side apply and places the scheduler files (`scheduler_files`,
which the record provides). The team labels and taints are the role toolkit's
(toolkit/nodes.py), re-exported here.
"""

from __future__ import annotations

from toolkit.nodes import (
    TEAM_LABEL_KEY,
    TEAM_TAINT_EFFECT,
    TEAM_TAINT_KEY,
    node_labels,
    node_taints,
    team_of,
    team_taint,
)

__all__ = [
    "TEAM_LABEL_KEY",
    "TEAM_TAINT_EFFECT",
    "TEAM_TAINT_KEY",
    "node_labels",
    "node_taints",
    "team_of",
    "team_taint",
]
