"""The cluster-wide GPU health manifests (DaemonSet, CronJob, RBAC), rendered from the inventory."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from inventory.model import LoadedCluster
from roles import gpu_health
from roles.gpu_health.config import GpuHealthConfig, cluster_config
from roles.gpu_health.sampling import periodic_sample
from toolkit.spec import host_config
from toolkit.templates import render_template

MANIFEST = "kubernetes/gpu-health.yaml"


def expectations_document(loaded: LoadedCluster) -> dict[str, Any]:
    """Every GPU worker's expectations and settings, for nodes that cannot read the inventory
    (the in-cluster checks get it as a ConfigMap; gpuhealth/expect.py reads it). Each worker by
    its inventory name, with no lookup: a lookup per worker made it quadratic in the fleet."""
    cluster = loaded.cluster
    hosts = {}
    for name in cluster.in_group("gpu_worker"):
        gpu = cluster.hosts[name].gpu
        cfg = host_config(loaded, name, "gpu_health", GpuHealthConfig)
        hosts[name] = {
            "count": gpu.count if gpu else None,
            "model": gpu.model if gpu else None,
            # Only what differs from the defaults, so the file stays readable.
            "config": cfg.model_dump(exclude_defaults=True),
        }
    return {"driver": cluster.versions.nvidia_driver, "hosts": hosts}


def cluster_files(loaded: LoadedCluster) -> dict[str, str]:
    """{relative path: content}; nothing for a cluster without GPU workers."""
    cluster = loaded.cluster
    workers = cluster.in_group("gpu_worker")
    if not workers:
        return {}
    cfg = cluster_config(loaded)
    context = {
        "cluster_name": cluster.name,
        "cfg": cfg,
        "taint": gpu_health.PREFLIGHT_TAINT,
        "taint_key": gpu_health.PREFLIGHT_TAINT_KEY,
        "taint_value": gpu_health.PREFLIGHT_TAINT_VALUE,
        "taint_effect": gpu_health.PREFLIGHT_TAINT_EFFECT,
        "label_key": gpu_health.GPU_WORKER_LABEL_KEY,
        "label_value": gpu_health.GPU_WORKER_LABEL_VALUE,
        "annotation": gpu_health.HEALTH_ANNOTATION,
        "condition": gpu_health.HEALTH_CONDITION,
        "gpu_workers": len(workers),
        "sample": periodic_sample(cfg, len(workers)),
        # The CronJob asks for a whole node; the largest one still fits on itself.
        "gpus_per_node": max(gpu.count for name in workers if (gpu := cluster.hosts[name].gpu)),
    }
    script = render_template("gpu_health/health-node.sh.j2", **context)
    expect_json = json.dumps(expectations_document(loaded), indent=2, sort_keys=True)
    digest = hashlib.sha256((script + expect_json).encode()).hexdigest()
    manifest = render_template(
        "gpu_health/gpu-health.yaml.j2",
        **context,
        script=script.rstrip("\n"),
        expect_json=expect_json,
        config_sha256=digest,
    )
    return {MANIFEST: manifest}
