"""The data_disks role, checked on each worker: every volume mounted read-write from its own
device with the inventory's options, in fstab by UUID, its size what its disks hold; for a RAID 0
the array's level, members, chunk size and health, and its line in mdadm.conf."""

from __future__ import annotations

import pytest

from roles.data_disks.config import DataDisksConfig, Volume
from roles.data_disks.mdadm import parse_detail
from roles.data_disks.operations import VISIBLE_OPTIONS

# A filesystem shows a little less than its device: ext4's inode tables take about 2%, and xfs
# keeps a log of at least 64 MiB (seen: 448 of 512 MiB on the lab's disk); a tenth missing on
# top of that means a wrong device or a failed grow.
MIN_FILESYSTEM_SHARE = 0.9
LOG_ALLOWANCE_BYTES = 128 * 2**20


def volumes(ctx) -> list[Volume]:
    """The host's volumes; a host without any has nothing to verify (said, not passed)."""
    found = ctx.config(DataDisksConfig).volumes
    if not found:
        pytest.skip("no data volumes on this host")
    return found


def resolved(host, path: str) -> str:
    return host.check_output(f"readlink -f {path}")


def test_each_volume_is_mounted_read_write_from_its_device_with_its_options(host, ctx) -> None:
    for volume in volumes(ctx):
        mounted = host.run(f"findmnt -rn -o SOURCE,OPTIONS --mountpoint {volume.mountpoint}")
        assert mounted.rc == 0 and mounted.stdout.strip(), f"{volume.mountpoint} is not mounted"
        source, options = mounted.stdout.split()[-2:]
        assert resolved(host, source) == resolved(host, volume.device), volume.name
        shown = options.split(",")
        assert "rw" in shown, f"{volume.mountpoint} is mounted {options}"
        for option in volume.options:
            if option in VISIBLE_OPTIONS:
                assert option in shown, f"{volume.mountpoint}: {option} missing from {options}"


def test_each_volume_is_in_fstab_by_uuid_with_nofail(host, ctx) -> None:
    for volume in volumes(ctx):
        uuid = host.check_output(f"blkid -s UUID -o value {volume.device}")
        line = host.check_output(f"awk '$1 !~ /^#/ && $2 == \"{volume.mountpoint}\"' /etc/fstab")
        assert line.split() == [
            f"UUID={uuid}",
            volume.mountpoint,
            volume.filesystem,
            ",".join(volume.options),
            "0",
            "2",
        ]


def test_each_volume_holds_what_its_disks_hold(host, ctx) -> None:
    for volume in volumes(ctx):
        disks = sum(int(host.check_output(f"blockdev --getsize64 {d}")) for d in volume.disks)
        filesystem = int(host.check_output(f"df -B1 --output=size {volume.mountpoint} | tail -1"))
        least = MIN_FILESYSTEM_SHARE * disks - LOG_ALLOWANCE_BYTES
        assert filesystem >= least, f"{volume.name}: {filesystem} bytes on {disks} of disks"


def test_each_array_is_a_whole_raid0_of_the_inventorys_disks(host, ctx) -> None:
    arrays = [volume for volume in volumes(ctx) if volume.array is not None]
    if not arrays:
        pytest.skip("no RAID 0 volume on this host")
    for volume in arrays:
        detail = parse_detail(host.check_output(f"mdadm --detail {volume.array}"))
        assert detail is not None, f"{volume.array}: no array"
        assert detail.level == "raid0" and detail.chunk_kib == volume.chunk_kib
        assert detail.raid_devices == len(volume.disks)
        assert sorted(detail.members) == sorted(resolved(host, d) for d in volume.disks)
        assert detail.healthy, f"{volume.array} is {detail.state}"
        conf = host.check_output("grep -E '^ARRAY' /etc/mdadm/mdadm.conf || true")
        assert f"UUID={detail.uuid}" in conf, f"{volume.array} is not in mdadm.conf"
