"""What a node should have (GPU count, model, driver) and which thresholds apply to it, taken
from the cluster inventory directly or from the expectations file rendered for the cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inventory.model import LoadedCluster
from roles.gpu_health.checks import Expectations
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
    name = _find(loaded.cluster.in_group("gpu_worker"), host)
    return _expectations(loaded, name)


def _expectations(loaded: LoadedCluster, name: str) -> tuple[Expectations, GpuHealthConfig]:
    """A GPU worker's expectations, by its inventory name (no lookup: the fleet-wide document
    asks for every worker, and a lookup per worker made it quadratic in the fleet)."""
    cluster = loaded.cluster
    gpu = cluster.hosts[name].gpu
    expect = Expectations(
        count=gpu.count if gpu else None,
        model=gpu.model if gpu else None,
        driver=cluster.versions.nvidia_driver,
    )
    cfg = host_config(loaded, name, "gpu_health", GpuHealthConfig)
    return expect, cfg


def expectations_document(loaded: LoadedCluster) -> dict[str, Any]:
    """Every GPU worker's expectations and settings, for nodes that cannot read the inventory
    (the in-cluster checks get it as a ConfigMap)."""
    hosts = {}
    for name in loaded.cluster.in_group("gpu_worker"):
        expect, cfg = _expectations(loaded, name)
        hosts[name] = {
            "count": expect.count,
            "model": expect.model,
            # Only what differs from the defaults, so the file stays readable.
            "config": cfg.model_dump(exclude_defaults=True),
        }
    return {"driver": loaded.cluster.versions.nvidia_driver, "hosts": hosts}


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


def cluster_config(loaded: LoadedCluster) -> GpuHealthConfig:
    """The settings that apply fleet-wide (fleet runs, in-cluster manifests): group vars for all
    hosts, then for gpu_worker; per-host vars only reach that host's own checks."""
    merged: dict[str, Any] = {}
    for group in ("all", "gpu_worker"):
        merged.update(loaded.cluster.group_vars.get(group, {}).get("gpu_health", {}))
    return GpuHealthConfig.model_validate(merged)
