"""The drift job's record: one Kubernetes Indexed Job, a cluster file only."""

from __future__ import annotations

from roles.drift_job.config import DriftJobConfig
from toolkit.spec import Role, lazy

ROLE = Role(
    name="drift_job",
    config=DriftJobConfig,
    cluster_files=lazy("roles.drift_job.files:cluster_files"),
    summary="the fleet drift check as an Indexed Job, one pod per shard",
)
