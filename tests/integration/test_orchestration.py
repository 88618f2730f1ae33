"""Topology-aware rolling on lab hosts: `apply --batch 1` still bootstraps etcd from bare hosts
(its members start in the same step), and `apply --reboot --batch 50%` reboots etcd members one
at a time, read from the members' own journals (shared clock: the lab hosts share the machine's).

Own lab (`orch`): three etcd members and one worker, bare Debian 13 hosts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from lab import lifecycle
from lab.topology import HostSpec, Topology
from tests.integration.conftest import KEEP_ENV, LabCluster, boot_lab
from tests.integration.roles_helpers import gpuinfra

pytestmark = pytest.mark.integration

LAB_NAME = os.environ.get("GPUINFRA_ORCH_LAB_NAME", "orch")
MEMBERS = ["etcd-1", "etcd-2", "etcd-3"]
TOPOLOGY = Topology(
    (*(HostSpec(name, ("etcd",)) for name in MEMBERS), HostSpec("cpu-1", ("cpu_worker",))),
    "orchestration",
)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    inventory = tmp_path_factory.mktemp("orch-inventory") / "cluster.yml"
    cluster = boot_lab(LAB_NAME, TOPOLOGY, inventory)
    yield cluster
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(LAB_NAME)


@pytest.fixture(scope="module")
def bootstrapped(bare: LabCluster) -> tuple[LabCluster, dict]:
    """`apply --batch 1` of base and etcd on bare hosts: before the rolling policy, each member
    went alone and waited forever for a quorum that could not form."""
    for host in MEMBERS:  # etcd never ran here: bare hosts, no data directory
        assert bare.ssh(host, "test -e /var/lib/etcd/member", check=False).returncode != 0
    result = gpuinfra(
        "apply", str(bare.inventory_path), "--roles", "base,etcd", "--batch", "1",
        "--yes", "--format", "json", timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    return bare, json.loads(result.stdout)


def test_batch_one_bootstraps_etcd_with_its_members_in_one_step(bootstrapped):
    lab, report = bootstrapped
    steps = next(n for n in report["notes"] if n.startswith("2 steps: ")).removeprefix("2 steps: ")
    assert steps.split(" | ") == [",".join(MEMBERS), "cpu-1"]
    health = lab.ssh(
        "etcd-1",
        "set -a; . /etc/etcd/etcdctl.env; etcdctl endpoint health --cluster -w json",
    )
    members = json.loads(health.stdout)
    assert len(members) == 3 and all(m["health"] for m in members), health.stdout


def etcd_down_intervals(lab: LabCluster, host: str) -> list[tuple[float, float]]:
    """(stopping, started again) of etcd.service from the member's persistent journal."""
    lines = lab.ssh(
        host, "journalctl -u etcd.service -o short-unix --no-pager | grep -E 'Stopping|Started'"
    ).stdout.splitlines()
    intervals, stopping = [], None
    for line in lines:
        stamp = float(line.split()[0])
        if "Stopping" in line:
            stopping = stamp
        elif stopping is not None:
            intervals.append((stopping, stamp))
            stopping = None
    return intervals


def test_reboot_with_half_batches_takes_etcd_members_down_one_at_a_time(bootstrapped):
    lab, _ = bootstrapped
    for host in lab.hosts:
        # A persistent journal, so each member's stop and start outlive the reboot; then ask
        # for a reboot the way apt does.
        lab.ssh(host, "mkdir -p /var/log/journal && journalctl --flush")
        lab.ssh(host, "touch /run/reboot-required")
    result = gpuinfra(
        "apply", str(lab.inventory_path), "--roles", "base", "--reboot", "--batch", "50%",
        "--yes", "--format", "json", timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    for host in lab.hosts:
        assert any(note.startswith(f"{host}: rebooted") for note in report["notes"]), report
        assert report["hosts"][host]["reboot_required"] is False
    downs = sorted(
        (interval, host) for host in MEMBERS for interval in etcd_down_intervals(lab, host)
    )
    assert [host for _, host in downs] and {host for _, host in downs} == set(MEMBERS), downs
    for (previous, _), (following, host) in zip(downs, downs[1:], strict=False):
        # Each member went down only after the one before it was serving again.
        assert following[0] >= previous[1], f"{host} stopped before the previous member was back"
    health = lab.ssh(
        "etcd-1", "set -a; . /etc/etcd/etcdctl.env; etcdctl endpoint health --cluster -w json"
    )
    assert all(m["health"] for m in json.loads(health.stdout))
