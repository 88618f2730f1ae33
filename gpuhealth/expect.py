"""What a node should have (GPU count, model, driver) and which thresholds apply to it, taken
from the cluster inventory directly or from the expectations file rendered for the cluster
(roles/gpu_health/files.py writes it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuhealth.checks import Expectations
from inventory.model import LoadedCluster
from roles.gpu_health.config import GpuHealthConfig
from toolkit.spec import host_config


class UnknownHost(LookupError):
    """The host is not a GPU worker of the inventory."""


def _find(names: list[str], host: str) -> str:
    """Inventory names are short; Kubernetes node names may be fully qualified."""
    for candidate in (host, host.split(".", 1)[0]):
        if candidate in names:
            return candidate
    raise UnknownHost(f"{host} is not a gpu_worker in the inventory (known: {', '.join(names)})")


def from_cluster(loaded: LoadedCluster, host: str) -> tuple[Expectations, GpuHealthConfig]:
    cluster = loaded.cluster
    name = _find(cluster.in_group("gpu_worker"), host)
    gpu = cluster.hosts[name].gpu
    expect = Expectations(
        count=gpu.count if gpu else None,
        model=gpu.model if gpu else None,
        driver=cluster.versions.nvidia_driver,
    )
    return expect, host_config(loaded, name, "gpu_health", GpuHealthConfig)


def from_document(document: dict[str, Any], host: str) -> tuple[Expectations, GpuHealthConfig]:
    hosts = document.get("hosts", {})
    name = _find(list(hosts), host)
    entry = hosts[name]
    expect = Expectations(
        count=entry.get("count"), model=entry.get("model"), driver=document.get("driver")
    )
    return expect, GpuHealthConfig.model_validate(entry.get("config", {}))


def from_file(path: Path, host: str) -> tuple[Expectations, GpuHealthConfig]:
    return from_document(json.loads(path.read_text()), host)
