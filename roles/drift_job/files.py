"""The drift job's manifest, rendered from the inventory into OUT/_cluster/."""

from __future__ import annotations

import math
from typing import Any

from inventory.model import LoadedCluster
from roles.drift_job.config import DriftJobConfig
from toolkit.templates import render_template

MANIFEST = "drift-job/drift-job.yaml"  # not under kubernetes/: applied by hand, with its inputs


def job_config(loaded: LoadedCluster) -> DriftJobConfig:
    """Fleet-wide settings: group vars of `all` only (the job is one object for all hosts)."""
    merged: dict[str, Any] = dict(loaded.cluster.group_vars.get("all", {}).get("drift_job", {}))
    return DriftJobConfig.model_validate(merged)


def shard_count(cfg: DriftJobConfig, hosts: int) -> int:
    return cfg.shards or max(1, math.ceil(hosts / cfg.hosts_per_shard))


def cluster_files(loaded: LoadedCluster) -> dict[str, str]:
    cfg = job_config(loaded)
    hosts = len(loaded.cluster.hosts)
    manifest = render_template(
        "drift_job/drift-job.yaml.j2",
        cfg=cfg,
        cluster_name=loaded.cluster.name,
        hosts=hosts,
        shards=shard_count(cfg, hosts),
    )
    return {MANIFEST: manifest}
