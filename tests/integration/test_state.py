"""Controller state and the apply lock on lab hosts (issue 13, defects 3 and 4): apply refuses a
cluster whose etcd member trusts another CA before anything changes, and of two applies started
on one cluster exactly one proceeds while the other exits 8 naming it.

Own lab (`GPUINFRA_STATE_LAB_NAME`, default `state`): one etcd member and one worker, bare
Debian 13 hosts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.exitcodes import ExitCode
from engine.context import load
from lab import lifecycle
from lab.topology import HostSpec, Topology
from roles.etcd.pki import ensure_pki, local_ca_fingerprint
from roles.etcd.trust import LIVE_CA, check_live_ca
from tests.integration.conftest import KEEP_ENV, LabCluster, boot_lab
from tests.integration.roles_helpers import GPUINFRA, gpuinfra
from tests.unit.loopback import loopback_cluster

pytestmark = pytest.mark.integration

LAB_NAME = os.environ.get("GPUINFRA_STATE_LAB_NAME", "state")
TOPOLOGY = Topology((HostSpec("etcd-1", ("etcd",)), HostSpec("cpu-1", ("cpu_worker",))), "state")
# What apply would change on a bare host first (base writes it): unchanged means untouched.
WATCHED = "/etc/hosts"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    inventory = tmp_path_factory.mktemp("state-inventory") / "cluster.yml"
    cluster = boot_lab(LAB_NAME, TOPOLOGY, inventory)
    yield cluster
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(LAB_NAME)


def digest(lab: LabCluster, host: str, path: str) -> str:
    return hashlib.sha256(lab.ssh(host, f"cat {path}").stdout.encode()).hexdigest()


def foreign_ca(tmp_path: Path) -> str:
    """The CA certificate of another cluster's state (a checkout applied elsewhere)."""
    loaded = load(loopback_cluster(tmp_path / "other"))
    ensure_pki(loaded)
    return (loaded.state_dir / "etcd-pki/ca.crt").read_text()


@pytest.fixture
def live_foreign_ca(lab: LabCluster, tmp_path: Path) -> Iterator[str]:
    """etcd-1 holds another cluster's CA; removed afterwards."""
    pem = foreign_ca(tmp_path)
    lab.ssh("etcd-1", f"mkdir -p {Path(LIVE_CA).parent} && cat > {LIVE_CA} <<'EOF'\n{pem}EOF")
    yield pem
    lab.ssh("etcd-1", f"rm -f {LIVE_CA}")
    shutil.rmtree(lab.loaded.state_dir, ignore_errors=True)


def test_apply_without_state_refuses_a_member_holding_a_ca(lab, live_foreign_ca):
    before = digest(lab, "etcd-1", WATCHED)
    result = gpuinfra("apply", str(lab.inventory_path), "--roles", "base", "--yes")
    assert result.returncode == ExitCode.BAD_INPUT, result.stdout[-2000:] + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "etcd-1: holds an etcd CA" in lines[0], result.stderr
    assert not lab.loaded.state_dir.exists()  # no state made
    assert digest(lab, "etcd-1", WATCHED) == before  # nothing changed on the host


def test_apply_with_another_local_ca_refuses_naming_the_member(lab, live_foreign_ca):
    ensure_pki(lab.loaded)  # this checkout's own, different CA
    before = digest(lab, "etcd-1", WATCHED)
    result = gpuinfra("apply", str(lab.inventory_path), "--roles", "base", "--yes")
    assert result.returncode == ExitCode.BAD_INPUT, result.stdout[-2000:] + result.stderr
    assert "etcd-1: its etcd CA" in result.stderr and "is not the controller's" in result.stderr
    assert digest(lab, "etcd-1", WATCHED) == before
    assert digest(lab, "etcd-1", LIVE_CA) == hashlib.sha256(live_foreign_ca.encode()).hexdigest()


def test_the_live_ca_is_read_over_ssh(lab, live_foreign_ca, tmp_path):
    """Positive control of the two tests above, on the same host: the same CA on both sides
    passes, and no CA on the member passes."""
    state = lab.loaded.state_dir / "etcd-pki"
    state.mkdir(parents=True)
    (state / "ca.crt").write_text(live_foreign_ca)
    [entry] = check_live_ca(lab.loaded)
    assert entry.fingerprint == local_ca_fingerprint(lab.loaded)
    lab.ssh("etcd-1", f"rm -f {LIVE_CA}")
    assert [e.fingerprint for e in check_live_ca(lab.loaded)] == [None]


def test_two_applies_at_once_one_proceeds_the_other_names_it(lab):
    """The first apply takes the lock and waits at its confirmation prompt (so it holds the lock
    for as long as this test needs, whatever the machine's speed); the second exits 8 naming it,
    drift says it runs; then the first is confirmed and converges the kernel role."""
    first = subprocess.Popen(
        [GPUINFRA, "apply", str(lab.inventory_path), "--roles", "kernel", "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    lock = lab.loaded.state_dir / "apply.lock"
    try:
        while True:  # until the first apply has written its record (or ended)
            record = lock.read_text() if lock.exists() else ""
            if record.strip() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert first.poll() is None, first.stderr.read()
        holder = json.loads(record)
        assert holder["pid"] == first.pid
        second = gpuinfra("apply", str(lab.inventory_path), "--roles", "kernel", "--yes")
        assert second.returncode == ExitCode.LOCKED, second.stdout[-2000:] + second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first.pid}" in lines[0], second.stderr
        drift = gpuinfra("drift", str(lab.inventory_path), "--roles", "kernel")
        assert "an apply is running on this cluster" in drift.stderr, drift.stderr
        assert f"pid {first.pid}" in drift.stderr
        assert json.loads(lock.read_text())["pid"] == first.pid  # drift took nothing
        stdout, stderr = first.communicate("y\n", timeout=900)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == ExitCode.OK, stdout[-3000:] + stderr[-2000:]
    report = json.loads(stdout)
    assert set(report["hosts"]) == {"etcd-1", "cpu-1"}
    assert {host["status"] for host in report["hosts"].values()} <= {"ok", "changed"}
    assert lock.read_text() == ""  # released at exit
