"""The fleet policy's record: cluster files only (Kubernetes objects, scheduler files, node
labels and taints), the series Prometheus keeps, and the inventory rules its settings need."""

from __future__ import annotations

from collections.abc import Iterator

from inventory.model import LoadedCluster
from roles.fleet_policy import checks
from roles.fleet_policy.config import FleetPolicyConfig
from toolkit.spec import HostSettings, Role, lazy


def cluster_checks(loaded: LoadedCluster, settings: HostSettings) -> Iterator[tuple[str, str]]:
    return checks.problems(loaded)


ROLE = Role(
    name="fleet_policy",
    config=FleetPolicyConfig,
    cluster_files=lazy("roles.fleet_policy.files:cluster_files"),
    checks=cluster_checks,
    provides={
        "scheduler_files": lazy("roles.fleet_policy.files:scheduler_files"),
        "metric_rules": lazy("roles.fleet_policy.files:metric_rules"),
    },
    summary="team isolation, balloons, gang scheduling and GPU metrics on the cluster",
)
