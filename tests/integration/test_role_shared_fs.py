"""The shared_fs role on the default lab: three storage hosts with a loop disk each (monitors,
managers, MDS, one OSD each) and the two workers mounting the CephFS with ceph-fuse. A file
written on one worker is read on the other; with one storage host stopped the workers still read
and write; with it back the cluster is HEALTH_OK again; drift is clean after apply (fast path
and --exact agree) and exits 3 after a hand change of a mount, a mode or a quota.

About 5 minutes on the shared lab, the storage host stopped and started again included
(`pytest -m sharedfs` selects it alone)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from cli.exitcodes import ExitCode
from lab import lifecycle
from tests.integration.conftest import LAB_NAME, LabCluster
from tests.integration.roles_helpers import apply_roles, gpuinfra, pending
from toolkit.ssh import ssh_argv

pytestmark = [pytest.mark.integration, pytest.mark.sharedfs]
ROLES = "base,shared_fs"
STORAGE = ("stor-1", "stor-2", "stor-3")
WORKERS = ("cpu-1", "gpu-1")
MOUNT = "/shared"
ADMIN_ROOT = "/var/lib/gpuinfra/shared_fs_root"


def drift(lab: LabCluster, *extra: str) -> tuple[int, dict[str, list[str]]]:
    result = gpuinfra(
        "drift", str(lab.inventory_path), "--roles", "shared_fs", "--format", "json", *extra
    )
    return result.returncode, pending(json.loads(result.stdout))


def health(lab: LabCluster, host: str) -> str:
    return lab.ssh(host, "timeout 30 ceph health", check=False).stdout.strip()


def wait_healthy(lab: LabCluster, host: str, seconds: float = 300) -> str:
    deadline = time.monotonic() + seconds
    while (status := health(lab, host)).split()[:1] != ["HEALTH_OK"]:
        if time.monotonic() > deadline:
            break
        time.sleep(5)
    return status


def test_plan_after_apply_has_no_changes(converged):
    result = gpuinfra("plan", str(converged.inventory_path), "--roles", ROLES, "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    assert pending(json.loads(result.stdout)) == {}


def test_cluster_is_healthy_with_three_of_everything(converged):
    status = json.loads(converged.ssh("stor-1", "ceph status -f json").stdout)
    assert status["health"]["status"] == "HEALTH_OK"
    assert sorted(status["quorum_names"]) == list(STORAGE)
    assert status["osdmap"]["num_up_osds"] == status["osdmap"]["num_in_osds"] == 3
    assert status["fsmap"]["up"] == 1 and status["fsmap"]["up:standby"] == 2
    pools = json.loads(converged.ssh("stor-1", "ceph osd pool ls detail -f json").stdout)
    assert {(p["pool_name"], p["size"], p["min_size"]) for p in pools} == {
        ("cephfs_metadata", 3, 2),
        ("cephfs_data", 3, 2),
    }


def test_workers_key_is_limited_and_secret(converged):
    caps = json.loads(converged.ssh("stor-1", "ceph auth get client.training -f json").stdout)
    assert caps[0]["caps"]["mds"] == "allow rw fsname=cephfs"
    keyring = converged.ssh("cpu-1", "stat -c '%a %U' /etc/ceph/ceph.client.training.keyring")
    assert keyring.stdout.split() == ["600", "root"]
    # The admin key stays on the storage hosts (the control: it is there on stor-1).
    admin = "test -s /etc/ceph/ceph.client.admin.keyring"
    assert converged.ssh("stor-1", admin, check=False).returncode == 0
    assert converged.ssh("cpu-1", admin, check=False).returncode == 1


def test_the_crash_poster_is_kept_stopped_while_reports_it_cannot_post_stay(converged):
    """Debian 13's reef mgr loads no module, the crash one included: ceph-crash could post
    nothing and retried every report every 10 minutes (docs/roles/shared_fs.md)."""
    for host in STORAGE:
        state = converged.ssh(
            host, "systemctl is-active ceph-crash; systemctl is-enabled ceph-crash", check=False
        )
        assert state.stdout.split() == ["inactive", "disabled"], host
        # Control: the same query of a daemon the role runs reads it as running and enabled.
        mgr = converged.ssh(
            host, f"systemctl is-active ceph-mgr@{host}; systemctl is-enabled ceph-mgr@{host}"
        )
        assert mgr.stdout.split() == ["active", "enabled"], host
    # Why: the mgr's failed module loads are there as crash reports, never posted.
    reports = converged.ssh("stor-1", "ls /var/lib/ceph/crash | grep -c '^20' || true")
    assert int(reports.stdout) > 0


def test_verify_suites_pass(converged, tmp_path):
    junit = tmp_path / "verify.xml"
    result = gpuinfra(
        "verify", str(converged.inventory_path), "--roles", "shared_fs", "--junit", str(junit)
    )
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    report = junit.read_text()
    # Both suites ran: the storage hosts' daemons and the workers' mounts.
    assert "test_daemon_runs_and_starts_at_boot" in report and "test_shared_fs_is_mounted" in report


def test_a_file_written_on_one_worker_is_read_on_another(converged):
    written = converged.ssh(
        "cpu-1",
        f"head -c 8M /dev/urandom > {MOUNT}/scratch/from-cpu-1 && sync && "
        f"md5sum < {MOUNT}/scratch/from-cpu-1",
    ).stdout.split()[0]
    read = converged.ssh("gpu-1", f"md5sum < {MOUNT}/scratch/from-cpu-1").stdout.split()[0]
    assert read == written


def test_directories_have_owner_mode_and_quota(converged):
    stat = converged.ssh("cpu-1", f"stat -c '%u %g %a' {MOUNT}/datasets {MOUNT}/scratch").stdout
    assert stat.splitlines() == ["1000 1000 2775", "0 0 1777"]
    # The quota (1 GiB) holds on a worker: writing past it fails (EDQUOT) while a small write
    # into the same directory (the control) succeeds.
    small = converged.ssh("cpu-1", f"head -c 1M /dev/zero > {MOUNT}/datasets/small", check=False)
    assert small.returncode == 0, small.stderr
    big = converged.ssh(
        "cpu-1",
        f"dd if=/dev/zero of={MOUNT}/datasets/big bs=4M count=400 conv=fsync 2>&1",
        check=False,
        timeout=300,
    )
    converged.ssh("cpu-1", f"rm -f {MOUNT}/datasets/big {MOUNT}/datasets/small", check=False)
    assert big.returncode != 0 and "quota" in big.stdout.lower(), big.stdout[-500:]


def test_drift_is_clean_then_sees_hand_changes(converged):
    assert drift(converged) == (ExitCode.OK, {})
    assert drift(converged, "--exact") == (ExitCode.OK, {})
    try:
        converged.ssh("gpu-1", "systemctl stop shared.mount")
        converged.ssh("stor-1", f"chmod 0777 {ADMIN_ROOT}/datasets")
        converged.ssh("stor-2", "systemctl start ceph-crash")
        for extra in ((), ("--exact",)):
            code, changes = drift(converged, *extra)
            assert code == ExitCode.DRIFT
            assert changes == {
                "gpu-1": ["Shared FS client | Mount the shared file system"],
                "stor-1": ["Shared FS storage | Keep the shared directories"],
                "stor-2": ["Shared FS storage | Keep the crash poster stopped"],
            }
    finally:
        converged.ssh("gpu-1", "systemctl start shared.mount", check=False)
        converged.ssh("stor-1", f"chmod 2775 {ADMIN_ROOT}/datasets", check=False)
        converged.ssh("stor-2", "systemctl stop ceph-crash", check=False)
    assert drift(converged) == (ExitCode.OK, {})


def test_one_storage_host_down_keeps_data_readable_and_writable(converged):
    before = converged.ssh(
        "cpu-1",
        f"head -c 4M /dev/urandom > {MOUNT}/scratch/before && md5sum < {MOUNT}/scratch/before",
    ).stdout.split()[0]
    stopped = "stor-1"  # the first monitor, and often the active MDS: the harder case
    try:
        assert lifecycle.stop_host(LAB_NAME, stopped)
        write = converged.ssh(
            "gpu-1",
            f"timeout 240 sh -c 'head -c 4M /dev/urandom > {MOUNT}/scratch/during && sync "
            f"&& md5sum < {MOUNT}/scratch/during && md5sum < {MOUNT}/scratch/before'",
            check=False,
            timeout=300,
        )
        assert write.returncode == 0, write.stderr
        during, read_before = (line.split()[0] for line in write.stdout.splitlines())
        assert read_before == before
        # The others see the host down: drift says the cluster is not healthy.
        assert health(converged, "stor-2").startswith("HEALTH_WARN")
        code, changes = drift(converged, "--limit", "stor-2")
        assert code == ExitCode.DRIFT
        assert "Shared FS storage | Wait for HEALTH_OK" in changes["stor-2"]
    finally:
        lifecycle.start_host(LAB_NAME, stopped)
    assert wait_healthy(converged, "stor-2").startswith("HEALTH_OK")
    after = converged.ssh("cpu-1", f"md5sum < {MOUNT}/scratch/during").stdout.split()[0]
    assert after == during
    assert drift(converged) == (ExitCode.OK, {})


def test_a_configuration_change_restarts_one_storage_host_at_a_time(converged):
    """A changed ceph.conf (the MDS cache here) restarts each storage host's daemons in turn,
    the next only once the cluster is HEALTH_OK again; the workers keep writing throughout."""
    path = converged.inventory_path
    original = path.read_text()
    data = yaml.safe_load(original)
    settings = data["group_vars"]["all"]["shared_fs"]
    settings["mds_cache_memory_limit"] = settings["mds_cache_memory_limit"] + 2**20
    writer = (
        f"for i in $(seq 60); do echo $i >> {MOUNT}/scratch/during-restart || exit 1; sleep 1; done"
    )
    try:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        background = subprocess.Popen(
            [*ssh_argv(converged.loaded, "cpu-1"), writer], stdout=subprocess.DEVNULL
        )
        report = apply_roles(path, "shared_fs")
        restarted = [
            name
            for name, host in report["hosts"].items()
            for op in host["operations"]
            if op["changed"] and op["name"].startswith("Shared FS storage | Restart the Ceph")
        ]
        assert sorted(restarted) == list(STORAGE)
        assert background.wait(timeout=120) == 0  # every append went through
        assert health(converged, "stor-3").startswith("HEALTH_OK")
        # The restarted MDS runs with the new value (asked through its admin socket).
        running = converged.ssh(
            "stor-2", "ceph daemon mds.stor-2 config get mds_cache_memory_limit"
        )
        limit = json.loads(running.stdout)["mds_cache_memory_limit"]
        assert int(limit) == settings["mds_cache_memory_limit"]
    finally:
        path.write_text(original)
        apply_roles(path, "shared_fs")
