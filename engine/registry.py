"""Every role, listed once, in the order they converge a cluster.

A role is a package `roles/<name>/` whose `role.py` declares `ROLE = Role(...)` (toolkit/spec.py):
its config model, phases and target groups, files, deploy, ports, checks and rolling policy.
Adding a role is that folder plus its name in `ROLE_PACKAGES` below.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from pydantic import BaseModel

from inventory.model import Cluster
from toolkit.spec import Phase, Role

ROLE_PACKAGES: tuple[str, ...] = (
    "base",
    "kernel",
    "container_runtime",
    "nvidia",
    "fabric",
    "firewall",
    "dns",
    "loadbalancer",
    "etcd",
    "data_disks",
    "kubernetes",
    "monitoring",
    "shared_fs",
    "gpu_health",
    "drift_job",
    "rollout_job",
    "fleet_policy",
)


def _load(name: str) -> Role:
    role = importlib.import_module(f"roles.{name}.role").ROLE
    if role.name != name:
        raise RuntimeError(f"roles/{name}/role.py declares the role {role.name!r}")
    return role


ROLES: tuple[Role, ...] = tuple(_load(name) for name in ROLE_PACKAGES)
ROLES_BY_NAME: dict[str, Role] = {role.name: role for role in ROLES}
# Every host phase of every role, in converge order.
PHASES: tuple[Phase, ...] = tuple(phase for role in ROLES for phase in role.phases)
ROLE_CONFIGS: dict[str, type[BaseModel]] = {role.name: role.config for role in ROLES}


def select_phases(roles: Iterable[str], cluster: Cluster) -> list[Phase]:
    """The phases of `roles` (all when empty), without those the inventory has turned off
    (Phase.when): those prepare nothing and are not timed, as if they did not exist."""
    wanted = set(roles)
    return [
        phase
        for phase in PHASES
        if (not wanted or phase.role in wanted) and (phase.when is None or phase.when(cluster))
    ]
