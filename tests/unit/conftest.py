"""Shared fixtures for unit tests: a small valid cluster to break one rule at a time."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "inventory" / "sample"

SMALL_CLUSTER: dict[str, Any] = {
    "name": "small",
    "domain": "small.test",
    "os": "debian-13",
    "networks": {"node": "10.0.0.0/24", "admin": ["192.0.2.0/24"]},
    "hosts": {
        "etcd-1": {"address": "10.0.0.11", "groups": ["etcd"]},
        "etcd-2": {"address": "10.0.0.12", "groups": ["etcd"]},
        "etcd-3": {"address": "10.0.0.13", "groups": ["etcd"]},
        "cp-1": {"address": "10.0.0.21", "groups": ["control_plane"]},
        "cp-2": {"address": "10.0.0.22", "groups": ["control_plane"]},
        "lb-1": {"address": "10.0.0.31", "groups": ["loadbalancer"]},
        "dns-1": {"address": "10.0.0.41", "groups": ["dns"]},
        "mon-1": {"address": "10.0.0.51", "groups": ["monitoring"]},
        "gpu-1": {
            "address": "10.0.0.61",
            "groups": ["gpu_worker"],
            "gpu": {"model": "H100-SXM5-80GB", "count": 8},
        },
        "cpu-1": {"address": "10.0.0.71", "groups": ["cpu_worker"]},
    },
}


@pytest.fixture
def small_cluster() -> dict[str, Any]:
    return copy.deepcopy(SMALL_CLUSTER)


@pytest.fixture
def write_cluster(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    def write(data: dict[str, Any], name: str = "cluster.yml") -> Path:
        folder = tmp_path / "inv"
        folder.mkdir(exist_ok=True)
        path = folder / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
