"""The roles in the order they converge a cluster, and which groups each one targets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inventory.model import LoadedCluster
from roles.base import deploy as base_deploy
from roles.base import files as base_files
from roles.drift_job import files as drift_job_files
from roles.gpu_health import files as gpu_health_files
from roles.render import HostContext, ManagedFile


@dataclass(frozen=True)
class Phase:
    role: str
    groups: tuple[str, ...] | None  # None: every host
    files: Callable[[HostContext], list[ManagedFile]] | None = None
    deploy: Callable[[HostContext], None] | None = None

    def applies_to(self, host_groups: list[str]) -> bool:
        return self.groups is None or any(g in self.groups for g in host_groups)


PHASES: list[Phase] = [
    Phase("base", None, base_files.managed_files, base_deploy.apply),
]

# Producers of cluster-wide files (Kubernetes manifests): relative path -> content.
CLUSTER_FILES: list[Callable[[LoadedCluster], dict[str, str]]] = [gpu_health_files.cluster_files]
CLUSTER_FILES.append(drift_job_files.cluster_files)
