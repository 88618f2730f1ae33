"""Each worker: the shared file system is mounted where the inventory says, with its options,
at boot too, and a file written there reads back."""

from __future__ import annotations

import pytest

from roles.shared_fs.config import SharedFsConfig
from roles.shared_fs.files import has_storage, mount_spec, mount_unit_name

TARGET_GROUPS = ("gpu_worker", "cpu_worker")
# What the kernel reports for each kind of mount (findmnt's FSTYPE).
FSTYPES = {
    "cephfs-fuse": "fuse.ceph-fuse",
    "cephfs": "ceph",
    "nfs": "nfs4",
    "lustre": "lustre",
    "beegfs": "beegfs",
}


@pytest.fixture(autouse=True)
def _storage(ctx) -> None:
    # The role mounts nothing where the cluster has neither storage hosts nor a site's storage.
    if not has_storage(ctx):
        pytest.skip("no shared file system in this cluster (no storage hosts, no existing)")


def test_shared_fs_is_mounted(host, ctx) -> None:
    cfg = ctx.config(SharedFsConfig)
    mount = host.mount_point(cfg.mount_point)
    assert mount.exists
    assert mount.filesystem == FSTYPES[mount_spec(ctx).kind]
    if "noatime" in cfg.mount_options:
        assert "noatime" in mount.options


def test_mount_starts_at_boot(host, ctx) -> None:
    unit = mount_unit_name(ctx.config(SharedFsConfig).mount_point)
    assert host.service(unit).is_enabled


def test_a_written_file_reads_back(host, ctx) -> None:
    cfg = ctx.config(SharedFsConfig)
    probe = f"{cfg.mount_point}/.gpuinfra-verify-{ctx.name}"
    result = host.run(f"echo ok > {probe} && cat {probe} && rm -f {probe}")
    assert result.rc == 0 and result.stdout.strip() == "ok", result.stderr
