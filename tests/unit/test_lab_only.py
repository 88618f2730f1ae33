"""What `gpuinfra lab` writes differs from the sample only by lab/inventory.py's LAB_ONLY."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab import aptcache, offline, rootfs
from lab.inventory import LAB_ONLY, inventory_data
from lab.topology import default_topology
from tests.unit.test_lab_topology import NEWER, PUBLISHED, lab_state, labs_dir  # noqa: F401

SAMPLE = Path(__file__).resolve().parents[2] / "inventory" / "sample" / "cluster.yml"
# Hosts and addresses aside: each lab has its own, and the sample's are an example.
ASIDE = ("name", "domain", "networks", "ssh", "api", "hosts", "teams")


def leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """Every setting by its dotted key; a list is one setting."""
    if not isinstance(data, dict):
        return {prefix: data}
    found: dict[str, Any] = {}
    for key, value in data.items():
        found.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


def differences(lab: dict[str, Any]) -> set[str]:
    sample = leaves(yaml.safe_load(SAMPLE.read_text()))
    return {
        key
        for key, value in leaves(lab).items()
        if key.split(".")[0] not in ASIDE and str(sample.get(key)) != str(value)
    }


def declared(key: str) -> str | None:
    return next((d for d in LAB_ONLY if key == d or key.startswith(f"{d}.")), None)


@pytest.mark.parametrize("kubernetes", [True, False])
def test_every_difference_from_the_sample_is_declared(labs_dir, monkeypatch, kubernetes):  # noqa: F811
    monkeypatch.setattr(offline, "published", lambda version=None: PUBLISHED)
    monkeypatch.setattr(offline, "upgrades", lambda: [NEWER])
    monkeypatch.setattr(rootfs, "machine_mirror", lambda: rootfs.Mirror(
        "http://deb.example/debian", "http://deb.example/debian-security"))  # fmt: skip
    monkeypatch.setattr(rootfs, "resolve_mirror", lambda mirror: [("192.0.2.1", "deb.example")])
    monkeypatch.setattr(aptcache, "available", lambda: True)
    state = lab_state(labs_dir, "lab", default_topology())
    found = differences(inventory_data(replace(state, kubernetes=kubernetes)))
    assert {key for key in found if declared(key) is None} == set()
    if kubernetes:
        # Positive control: the lab's pod network and cgroup v1 settings are found, and the
        # versions it runs are the sample's (no difference to declare).
        assert {
            "group_vars.all.kubernetes.cni",
            "group_vars.all.kubernetes.fail_cgroup_v1",
        } <= found
        assert not {key for key in found if key.startswith("versions.")}
        # Each declared setting is still a difference: a stale entry would hide a new one.
        assert {d for d in LAB_ONLY if not any(declared(k) == d for k in found)} == {
            "versions.etcd",
            "versions.containerd",
        }
    else:
        assert {"versions.etcd", "versions.containerd"} <= found


def test_each_lab_only_setting_says_why():
    assert all(len(reason) > 20 for reason in LAB_ONLY.values())
