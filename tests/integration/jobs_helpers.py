"""The lab both in-cluster Jobs' integration tests boot: test_kubernetes.py's, with one Job
enabled on one node, the lab's own gpuinfra image, and `cni: routes` masquerading pod traffic."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.test_kubernetes import Cluster, applied_lab, lab_inventory


def job_inventory(path: Path, role: str, node: str, settings: dict) -> None:
    """The Kubernetes lab's inventory with `role` (drift_job, rollout_job) enabled on `node`
    and these other `settings` of it."""
    lab_inventory(path)
    data = yaml.safe_load(path.read_text())
    everyone = data["group_vars"]["all"]
    image = everyone["gpu_health"]["image"]  # the lab's gpuinfra image, built from this checkout
    everyone[role] = {"enabled": True, "nodes": [node], "image": image, "cpu": "100m", **settings}
    everyone["kubernetes"]["routes_nat_outgoing"] = True
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def job_lab(
    tmp_path_factory: pytest.TempPathFactory, lab: str, role: str, node: str, **settings: object
) -> Iterator[Cluster]:
    """The lab booted and applied with the Job enabled, for a module's `cluster` fixture."""
    report = tmp_path_factory.mktemp(role) / "apply.json"
    prepare = functools.partial(job_inventory, role=role, node=node, settings=settings)
    yield from applied_lab(lab, report, prepare=prepare)
