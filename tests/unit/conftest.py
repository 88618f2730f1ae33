"""Shared fixtures for unit tests: a small valid cluster to break one rule at a time."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from inventory.model import LoadedCluster

REPO = Path(__file__).resolve().parents[2]
INVENTORIES = REPO / "inventory"
SAMPLE = INVENTORIES / "sample"

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


@pytest.fixture
def load_small(small_cluster: dict[str, Any], write_cluster) -> Callable[[], LoadedCluster]:
    """Write and load the small cluster as the test has changed it so far: call it after each
    change (`small_cluster` is the same dictionary the test holds)."""
    from engine.context import load

    return lambda: load(write_cluster(small_cluster))


@pytest.fixture
def loaded(load_small) -> LoadedCluster:
    """The small cluster as written and loaded, for tests that change nothing in it first (a
    module may define a `loaded` of its own, which then wins)."""
    return load_small()


def _state_dirs() -> set[Path]:
    return {path for path in INVENTORIES.glob("*/.state") if path.is_dir()}


@pytest.fixture(autouse=True, scope="session")
def _state_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests load the committed inventories and render them, which makes their state (the
    etcd CA, the secrets) as any library caller does: here into a folder of the session, never
    into the checkout, where a later `gpuinfra apply inventory/sample` would find a CA it never
    made. A test that still writes there (a gpuinfra subprocess) fails the session."""
    root = tmp_path_factory.mktemp("inventory-state")
    original = LoadedCluster.state_dir.fget
    before = _state_dirs()

    def state_dir(self: LoadedCluster) -> Path:
        base = self.base_dir.resolve()
        if base.is_relative_to(INVENTORIES):
            return root / base.relative_to(INVENTORIES) / ".state"
        return original(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LoadedCluster, "state_dir", property(state_dir))
        yield
    made = sorted(str(path.relative_to(REPO)) for path in _state_dirs() - before)
    if made:
        pytest.fail(f"unit tests wrote state into the checkout: {', '.join(made)}")
