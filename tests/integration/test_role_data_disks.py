"""The data_disks role on a lab host of its own with three loop-backed disks (vdb, vdc, vdd, by
stable name from the lab's udev stand-in): a blank disk formatted (xfs) and mounted by UUID
with noatime,nofail; drift exit 3 (fast path and --exact alike) when the mount is gone or
read-only, and an apply that restores it; a disk with a foreign signature and a mounted disk
refused with one line naming them, left as they were; the verify suite. The lab's kernel has
no md driver: the RAID 0 path is checked offline (tests/unit/test_role_data_disks.py).

Its lab: one host, `<GPUINFRA_LAB_NAME>-disks` (GPUINFRA_DISKS_LAB_NAME overrides).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from cli.exitcodes import ExitCode
from lab import lifecycle
from lab.topology import HostSpec, Topology, disk_id
from tests.helpers import gpuinfra
from tests.integration.conftest import KEEP_ENV, LAB_NAME, boot_lab
from tests.integration.roles_helpers import apply_roles, failed_run, pending

pytestmark = pytest.mark.integration

DISKS_LAB = os.environ.get("GPUINFRA_DISKS_LAB_NAME", f"{LAB_NAME}-disks")[:24]
HOST = "cpu-1"
DATA = disk_id("/dev/vdb")
FOREIGN = disk_id("/dev/vdc")
BUSY = disk_id("/dev/vdd")


@pytest.fixture(scope="module")
def lab():
    inventory = Path(f"/tmp/gpuinfra-itest-{DISKS_LAB}/cluster.yml")
    # vdb is the host's data volume (lab/inventory.py); vdc and vdd stay free for the refusals.
    spec = HostSpec(HOST, ("cpu_worker",), disk_bytes=512 * 2**20, extra_disks=(2**26, 2**26))
    cluster = boot_lab(DISKS_LAB, Topology((spec,), "disks"), inventory)
    # Package lists: the base role refreshes them on a real cluster; this lab runs this role
    # alone (the base role's apply would double the module's time).
    cluster.ssh(
        HOST, 'test -n "$(ls /var/lib/apt/lists/*Packages* 2>/dev/null)" || apt-get update -q'
    )
    yield cluster
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(DISKS_LAB)


def drift_code(inventory: Path, *flags: str) -> tuple[int, dict]:
    result = gpuinfra("drift", str(inventory), "--roles", "data_disks", "-f", "json", *flags)
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}


def with_volume(lab, tmp_path: Path, volume: dict) -> Path:
    """The lab's inventory with one more volume on the host."""
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["hosts"][HOST]["vars"]["data_disks"]["volumes"].append(volume)
    path = tmp_path / "cluster.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_blank_disk_is_formatted_and_mounted_by_uuid_and_drift_sees_the_mount(lab):
    for disk in (DATA, FOREIGN, BUSY):
        assert lab.ssh(HOST, f"readlink -f {disk}").stdout.strip().startswith("/dev/vd")
    apply_roles(lab.inventory_path, "data_disks")
    fstype, options = lab.ssh(HOST, "findmnt -rn -o FSTYPE,OPTIONS /data").stdout.split()
    assert fstype == "xfs" and "noatime" in options.split(",") and "rw" in options.split(",")
    uuid = lab.ssh(HOST, f"blkid -s UUID -o value {DATA}").stdout.strip()
    fstab = lab.ssh(HOST, "awk '$2 == \"/data\"' /etc/fstab").stdout.split()
    assert fstab == [f"UUID={uuid}", "/data", "xfs", "noatime,nofail", "0", "2"]
    assert lab.ssh(HOST, f"blkid -s LABEL -o value {DATA}").stdout.strip() == "gpi-data"
    # The converged host is the control: no drift, either way.
    assert drift_code(lab.inventory_path)[0] == ExitCode.OK
    assert drift_code(lab.inventory_path, "--exact")[0] == ExitCode.OK

    breakages = {
        "the mount gone": "umount /data",
        "the mount read-only": "mount -o remount,ro /data",
    }
    for what, command in breakages.items():
        try:
            lab.ssh(HOST, command)
            fast, report = drift_code(lab.inventory_path)
            exact, _ = drift_code(lab.inventory_path, "--exact")
            assert (fast, exact) == (ExitCode.DRIFT, ExitCode.DRIFT), what
            assert pending(report) == {HOST: ["Data disks | Prepare and mount the data volumes"]}
            apply_roles(lab.inventory_path, "data_disks")
            options = lab.ssh(HOST, "findmnt -rn -o OPTIONS /data").stdout.split(",")
            assert "rw" in options and "noatime" in options, what
            # Repaired, never reformatted: the same filesystem.
            assert lab.ssh(HOST, f"blkid -s UUID -o value {DATA}").stdout.strip() == uuid
        finally:
            lab.ssh(HOST, "mountpoint -q /data || mount /data", check=False)
            lab.ssh(HOST, "mount -o remount,rw /data", check=False)
    assert drift_code(lab.inventory_path)[0] == ExitCode.OK


def test_a_foreign_signature_and_a_mounted_disk_are_refused_and_left_alone(lab, tmp_path):
    apply_roles(lab.inventory_path, "data_disks")
    # Someone else's filesystems are ext4 (the lab's data volume is xfs, and mkfs.xfs refuses
    # disks under 300 MB): the host's own mkfs.ext4.
    lab.ssh(HOST, "command -v mkfs.ext4 || apt-get install -y -q --no-install-recommends e2fsprogs")
    cases = [
        # someone's ext4 on vdc: refused, named with what is on it
        (
            f"mkfs.ext4 -q -F -L scratch {FOREIGN}",
            {"name": "scratch", "layout": "single", "disks": [FOREIGN], "mountpoint": "/scratch"},
            [FOREIGN, "ext4 filesystem labelled 'scratch'"],
            f"blkid -s LABEL -o value {FOREIGN}",
            "scratch",
        ),
        # a disk mounted elsewhere (even with a label of ours): refused, still mounted
        (
            f"mkfs.ext4 -q -F -L gpi-busy {BUSY} && mkdir -p /mnt/busy && mount {BUSY} /mnt/busy",
            {"name": "busy", "layout": "single", "disks": [BUSY], "mountpoint": "/busy"},
            [BUSY, "is mounted at /mnt/busy"],
            "findmnt -rn -o TARGET -S /dev/vdd",
            "/mnt/busy",
        ),
    ]
    try:
        for prepare, volume, words, probe, left in cases:
            lab.ssh(HOST, prepare)
            inventory = with_volume(lab, tmp_path, volume)
            result = gpuinfra(
                "apply", str(inventory), "--roles", "data_disks", "--yes", "-f", "json"
            )
            assert result.returncode == ExitCode.ERROR, failed_run(result)
            # Refused while the host's operations are prepared: nothing ran on it.
            host = json.loads(result.stdout)["hosts"][HOST]
            error = host["error"]
            assert host["status"] == "failed" and "\n" not in error, error
            assert error.startswith("data_disks: refusing volume "), error
            for word in words:
                assert word in error, error
            assert lab.ssh(HOST, probe).stdout.strip() == left  # never wiped nor unmounted
            assert lab.ssh(HOST, f"mountpoint -q {volume['mountpoint']}", check=False).returncode
    finally:
        lab.ssh(HOST, "umount /mnt/busy", check=False)
        lab.ssh(HOST, f"wipefs -q -a {FOREIGN} {BUSY}", check=False)


def test_verify_suite_passes_on_the_converged_host(lab):
    apply_roles(lab.inventory_path, "data_disks")
    result = gpuinfra("verify", str(lab.inventory_path), "--roles", "data_disks")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]


def test_the_data_volume_is_mounted_again_after_a_reboot(lab):
    """A rebooted host comes up with its volume, as a server's systemd mounts fstab at boot (in
    a lab host the lab's stand-in does it, lab/host.py); drift is clean without an apply."""
    apply_roles(lab.inventory_path, "data_disks")
    uuid = lab.ssh(HOST, f"blkid -s UUID -o value {DATA}").stdout.strip()
    for action in ("stop", "start"):
        done = gpuinfra("lab", action, HOST, "--name", DISKS_LAB)
        assert done.returncode == 0, done.stderr[-2000:]
    assert lab.ssh(HOST, "findmnt -rn -o UUID /data").stdout.strip() == uuid
    assert drift_code(lab.inventory_path)[0] == ExitCode.OK
