"""The data_disks role offline: the inventory's rules, the judgement of each volume from given
facts (blank, ours, foreign, mounted, read-only), the mdadm path against recorded outputs of
`mdadm --detail` and /proc/mdstat (written from documentation: the lab has no md driver), and
the alerts on a degraded array."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.context import host_contexts, load
from inventory.errors import InventoryInvalid
from roles.data_disks import operations as disk_ops
from roles.data_disks.config import DataDisksConfig, Volume
from roles.data_disks.deploy import packages
from roles.data_disks.facts import ArrayDetail, DiskProbe, MdadmConfArrays, MdStat, MountedAt
from roles.data_disks.mdadm import parse_detail, parse_mdstat
from roles.monitoring.files import ALERT_RULES
from tests.helpers import files_of
from tests.unit.conftest import SAMPLE
from tests.unit.fake_host import keyed_host
from toolkit.disks import FstabEntry

RECORDINGS = Path(__file__).parent / "recordings" / "mdadm"
BY_ID = "/dev/disk/by-id/nvme-SAMSUNG_MZWLR3T8HCLS-00A07_S6CKNA0T"
MEMBERS = [f"{BY_ID}{i}" for i in range(1, 5)]
KERNEL = {disk: f"/dev/nvme{i}n1" for i, disk in enumerate(MEMBERS, start=1)}
UUID = "3f6b1c2a:9d4e5f60:7a8b9c0d:1e2f3a4b"
ARRAY_LINE = f"ARRAY /dev/md/data metadata=1.2 name=gpu-1:data UUID={UUID}"
FS_UUID = "0b4d6a8e-5c1f-4e2a-9a7b-3c2d1e0f9a8b"


def recorded(name: str) -> str:
    return (RECORDINGS / name).read_text()


def key(fact: type, **arguments: Any) -> tuple:
    return (fact, tuple(sorted(arguments.items())))


def table(entries: dict[tuple, Any]):
    """Facts keyed by their arguments: a lookup with a wrong argument fails (KeyError)."""

    def facts(fact: type, **arguments: Any) -> Any:
        return entries[key(fact, **arguments)]

    return facts


def probe(path: str, **found: Any) -> dict:
    return {
        "path": path,
        "probe": found.get("probe", {}),
        "holders": found.get("holders", []),
        "mounts": found.get("mounts", []),
    }


SINGLE = Volume(
    name="data", layout="single", disks=["/dev/disk/by-id/virtio-gpuinfra-vdb"], filesystem="ext4"
)
OURS = {"TYPE": "ext4", "LABEL": "gpi-data", "UUID": FS_UUID}
FSTAB = f"UUID={FS_UUID} /data ext4 noatime,nofail 0 2"


def single_facts(found: dict | None, fstab: str | None = FSTAB, mounted: Any = None) -> dict:
    return {
        key(DiskProbe, device=SINGLE.device): found,
        key(FstabEntry, path="/data"): fstab,
        key(MountedAt, path="/data"): mounted,
    }


# --- recorded outputs -------------------------------------------------------------------


def test_a_healthy_array_reads_as_raid0_with_its_members_chunk_and_size():
    detail = parse_detail(recorded("detail-healthy.txt"))
    assert detail is not None and detail.healthy
    assert detail.level == "raid0" and detail.chunk_kib == 512 and detail.raid_devices == 4
    assert detail.members == tuple(KERNEL.values())
    assert detail.uuid == UUID and detail.array_kib == 15002423296


def test_an_array_that_lost_a_member_is_not_healthy():
    detail = parse_detail(recorded("detail-member-removed.txt"))
    assert detail is not None and not detail.healthy
    assert detail.state == "broken, FAILED" and "removed" in detail.rows
    assert detail.members == ("/dev/nvme1n1", "/dev/nvme3n1", "/dev/nvme4n1")


def test_mdstat_healthy_failed_and_inactive():
    healthy = parse_mdstat(recorded("mdstat-healthy.txt"))["md127"]
    assert healthy.healthy and healthy.level == "raid0" and healthy.chunk_kib == 512
    assert healthy.members == ("nvme1n1", "nvme2n1", "nvme3n1", "nvme4n1")
    failed = parse_mdstat(recorded("mdstat-member-failed.txt"))["md127"]
    assert not failed.healthy and failed.failed == ("nvme2n1",)
    inactive = parse_mdstat(recorded("mdstat-inactive.txt"))["md127"]
    assert not inactive.active and not inactive.healthy and inactive.level is None
    assert parse_mdstat("Personalities : \nunused devices: <none>\n") == {}


def test_facts_parse_what_the_host_prints():
    assert DiskProbe().process([]) is None
    found = DiskProbe().process(
        ["path /dev/vdb", "mount /mnt/a\\x20b", "blkid TYPE=ext4", "blkid LABEL=x"]
    )
    assert found == probe("/dev/vdb", mounts=["/mnt/a b"], probe={"TYPE": "ext4", "LABEL": "x"})
    detail = ArrayDetail().process(
        ["device /dev/md127", *recorded("detail-healthy.txt").split("\n")]
    )
    assert detail is not None and detail[0] == "/dev/md127" and detail[1].uuid == UUID
    assert ArrayDetail().process([]) is None
    assert MountedAt().process(["/dev/vdb rw,noatime"]) == {
        "source": "/dev/vdb",
        "options": ["rw", "noatime"],
    }
    assert MountedAt().process([]) is None
    assert MdadmConfArrays().process([ARRAY_LINE]) == [ARRAY_LINE]
    assert MdStat().process(recorded("mdstat-healthy.txt").splitlines())["md127"].healthy


# --- the inventory ----------------------------------------------------------------------


def test_the_sample_gpu_workers_stripe_four_disks_into_raid0_at_data():
    loaded = load(SAMPLE)
    for name in loaded.cluster.in_group("gpu_worker"):
        (volume,) = loaded.settings[name]["data_disks"].volumes
        assert volume.layout == "raid0" and len(volume.disks) == 4
        assert volume.filesystem == "xfs" and volume.mountpoint == "/data"
        assert {"noatime", "nofail"} <= set(volume.options)
    assert loaded.settings["cpu-1"]["data_disks"].volumes == []


@pytest.mark.parametrize(
    ("disk", "words"),
    [
        ("/dev/sdb", "not a stable name"),
        ("/dev/nvme1n1", "not a stable name"),
        ("/dev/disk/by-uuid/1234", "not a stable name"),
    ],
)
def test_kernel_names_are_refused_naming_file_and_key(small_cluster, load_small, disk, words):
    small_cluster["hosts"]["gpu-1"]["vars"] = {
        "data_disks": {"volumes": [{"name": "data", "layout": "single", "disks": [disk]}]}
    }
    with pytest.raises(InventoryInvalid) as excinfo:
        load_small()
    (error,) = excinfo.value.errors
    assert error.key == "hosts.gpu-1.vars.data_disks.volumes.0.disks"
    assert words in error.message and disk in error.message


@pytest.mark.parametrize(
    ("volume", "words"),
    [
        ({"name": "data", "layout": "single", "disks": MEMBERS[:2]}, "single takes one disk"),
        ({"name": "data", "disks": MEMBERS[:1]}, "raid0 needs two disks"),
        ({"name": "data", "disks": MEMBERS, "options": ["noatime"]}, "nofail"),
        ({"name": "data", "disks": MEMBERS, "chunk_kib": 384}, "power of two"),
        ({"name": "data", "disks": MEMBERS, "stripe": 4}, "unknown key"),
        ({"name": "Data_Set_1", "disks": MEMBERS}, "should match pattern"),
    ],
)
def test_volumes_that_cannot_be_made_are_refused(small_cluster, load_small, volume, words):
    small_cluster["group_vars"] = {"gpu_worker": {"data_disks": {"volumes": [volume]}}}
    with pytest.raises(InventoryInvalid) as excinfo:
        load_small()
    assert any(words in e.message for e in excinfo.value.errors), excinfo.value.errors
    assert all(e.key.startswith("group_vars.gpu_worker.data_disks") for e in excinfo.value.errors)


def test_a_disk_in_two_volumes_and_volumes_on_non_workers_are_refused(small_cluster, load_small):
    one = {"name": "a", "layout": "single", "disks": MEMBERS[:1], "mountpoint": "/a"}
    two = {"name": "b", "layout": "single", "disks": MEMBERS[:1], "mountpoint": "/b"}
    small_cluster["hosts"]["gpu-1"]["vars"] = {"data_disks": {"volumes": [one, two]}}
    with pytest.raises(InventoryInvalid) as excinfo:
        load_small()
    assert "is in volumes a and b" in excinfo.value.errors[0].message
    small_cluster["hosts"]["gpu-1"]["vars"] = {}
    small_cluster["hosts"]["mon-1"]["vars"] = {"data_disks": {"volumes": [one]}}
    with pytest.raises(InventoryInvalid) as excinfo:
        load_small()
    assert [e.key for e in excinfo.value.errors] == ["hosts.mon-1"]


def test_packages_follow_the_volumes():
    assert packages(DataDisksConfig()) == []
    assert packages(DataDisksConfig(volumes=[SINGLE])) == ["e2fsprogs"]
    raid = Volume(name="data", disks=MEMBERS)
    assert packages(DataDisksConfig(volumes=[raid])) == ["mdadm", "xfsprogs"]


# --- one disk ---------------------------------------------------------------------------


def test_a_blank_disk_is_formatted_put_in_fstab_by_uuid_and_mounted():
    judged = disk_ops.judge(SINGLE, table(single_facts(probe("/dev/vdb"), fstab=None)))
    assert judged.refusal is None and judged.findings == []
    mkfs, fstab, mount = judged.commands
    assert mkfs == "mkfs.ext4 -q -L gpi-data /dev/disk/by-id/virtio-gpuinfra-vdb"
    assert "blkid -s UUID -o value /dev/disk/by-id/virtio-gpuinfra-vdb" in fstab
    assert 'echo "UUID=$uuid /data ext4 noatime,nofail 0 2"' in fstab
    assert mount.endswith("mount /data && mountpoint -q /data")


def test_our_mounted_filesystem_needs_nothing():
    mounted = {"source": "/dev/vdb", "options": ["rw", "noatime"]}
    found = probe("/dev/vdb", probe=OURS, mounts=["/data"])
    judged = disk_ops.judge(SINGLE, table(single_facts(found, mounted=mounted)))
    assert judged.commands == [] and judged.refusal is None and judged.findings == []


def test_our_filesystem_unmounted_is_mounted_again_never_formatted():
    judged = disk_ops.judge(SINGLE, table(single_facts(probe("/dev/vdb", probe=OURS))))
    assert len(judged.commands) == 1 and " mount /data " in judged.commands[0]


def test_a_read_only_mount_is_remounted_read_write_with_its_options():
    found = probe("/dev/vdb", probe=OURS, mounts=["/data"])
    for options in (["ro", "noatime"], ["rw", "relatime"]):
        mounted = {"source": "/dev/vdb", "options": options}
        judged = disk_ops.judge(SINGLE, table(single_facts(found, mounted=mounted)))
        assert judged.commands == ["mount -o remount,rw,noatime /data"]


def test_another_fstab_line_for_the_mount_point_is_replaced():
    mounted = {"source": "/dev/vdb", "options": ["rw", "noatime"]}
    found = probe("/dev/vdb", probe=OURS, mounts=["/data"])
    old = f"UUID={FS_UUID} /data ext4 defaults 0 2"
    judged = disk_ops.judge(SINGLE, table(single_facts(found, fstab=old, mounted=mounted)))
    assert len(judged.commands) == 1 and "/etc/fstab.gpuinfra" in judged.commands[0]


@pytest.mark.parametrize(
    ("found", "words"),
    [
        (probe("/dev/vdb", probe={"PTTYPE": "gpt"}), "holds a gpt partition table"),
        (
            probe("/dev/vdb", probe={"TYPE": "ext4", "LABEL": "scratch", "UUID": "u-1"}),
            "already holds a ext4 filesystem labelled 'scratch' (UUID u-1)",
        ),
        (probe("/dev/vdb", probe={"TYPE": "xfs", "UUID": "u-2"}), "already holds a xfs"),
        (probe("/dev/vdb", probe=OURS, mounts=["/mnt/old"]), "is mounted at /mnt/old"),
        (
            probe("/dev/vdb", probe={"TYPE": "linux_raid_member", "LABEL": "x:home"}),
            "is a member of the md array x:home",
        ),
        (probe("/dev/vdb", holders=["dm-0"]), "is in use by dm-0"),
    ],
)
def test_a_disk_holding_anything_else_is_refused_never_formatted(found, words):
    judged = disk_ops.judge(SINGLE, table(single_facts(found)))
    assert judged.commands == []
    assert judged.refusal is not None and words in judged.refusal
    assert SINGLE.device in judged.refusal and "/dev/vdb" in judged.refusal


def test_another_device_on_the_mount_point_is_refused():
    mounted = {"source": "/dev/vdz", "options": ["rw"]}
    found = probe("/dev/vdb", probe=OURS)
    judged = disk_ops.judge(SINGLE, table(single_facts(found, mounted=mounted)))
    assert (
        judged.refusal == "/data has /dev/vdz mounted, not " + SINGLE.device + ": unmount it first"
    )


def test_a_disk_gone_is_a_finding_not_a_command():
    judged = disk_ops.judge(SINGLE, table(single_facts(None)))
    assert judged.commands == [] and judged.refusal is None
    assert judged.findings == [f"data_disks: disk {SINGLE.device} of volume data is gone"]


def test_the_operation_raises_one_line_naming_the_disk_and_what_is_on_it():
    from pyinfra.api import OperationError

    foreign = probe("/dev/vdb", probe={"TYPE": "ext4", "LABEL": "scratch", "UUID": "u-1"})
    with keyed_host(single_facts(foreign)), pytest.raises(OperationError) as excinfo:
        list(disk_ops.volumes_ready._inner(volumes=[SINGLE]))
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("refusing volume data: ")
    assert SINGLE.device in message and "labelled 'scratch'" in message and "never wiped" in message


# --- RAID 0 -----------------------------------------------------------------------------

RAID = Volume(name="data", disks=MEMBERS)
MD_OURS = {"TYPE": "xfs", "LABEL": "gpi-data", "UUID": FS_UUID}


def raid_facts(
    members: dict[str, dict | None],
    detail_file: str | None,
    conf: list[str] | None = None,
    mounted: Any = None,
    mdstat: str | None = None,
) -> dict:
    facts: dict[tuple, Any] = {
        key(DiskProbe, device=disk): found for disk, found in members.items()
    }
    detail = parse_detail(recorded(detail_file)) if detail_file else None
    facts[key(ArrayDetail, array="/dev/md/data")] = ("/dev/md127", detail) if detail else None
    facts[key(MdadmConfArrays)] = conf if conf is not None else [ARRAY_LINE]
    facts[key(MdStat)] = parse_mdstat(recorded(mdstat)) if mdstat else {}
    facts[key(DiskProbe, device="/dev/md/data")] = probe(
        "/dev/md127", probe=MD_OURS, mounts=["/data"] if mounted else []
    )
    facts[key(FstabEntry, path="/data")] = f"UUID={FS_UUID} /data xfs noatime,nofail 0 2"
    facts[key(MountedAt, path="/data")] = mounted
    return facts


def members(**found: Any) -> dict[str, dict | None]:
    return {disk: probe(KERNEL[disk], **found) for disk in MEMBERS}


MOUNTED = {"source": "/dev/md127", "options": ["rw", "noatime"]}


def test_four_blank_disks_become_a_raid0_in_mdadm_conf_formatted_and_mounted():
    judged = disk_ops.judge(RAID, table(raid_facts(members(), None, conf=[])))
    assert judged.refusal is None and judged.findings == []
    create, conf, mkfs, fstab, mount = judged.commands
    assert create == (
        "mdadm --create /dev/md/data --name=data --level=0 --chunk=512K --raid-devices=4 "
        "--metadata=1.2 --run " + " ".join(MEMBERS)
    )
    assert "mdadm --detail --brief /dev/md/data" in conf and "update-initramfs -u" in conf
    assert mkfs == "mkfs.xfs -q -L gpi-data /dev/md/data"
    assert "blkid -s UUID -o value /dev/md/data" in fstab and " /data xfs noatime,nofail" in fstab
    assert "mount /data" in mount


def test_a_healthy_array_in_mdadm_conf_and_mounted_needs_nothing():
    facts = raid_facts(members(probe={"TYPE": "linux_raid_member"}), "detail-healthy.txt")
    facts[key(MountedAt, path="/data")] = MOUNTED
    judged = disk_ops.judge(RAID, table(facts))
    assert judged.commands == [] and judged.refusal is None and judged.findings == []


def test_an_array_missing_from_mdadm_conf_is_added_and_the_initramfs_rebuilt():
    facts = raid_facts(members(), "detail-healthy.txt", conf=[], mounted=MOUNTED)
    judged = disk_ops.judge(RAID, table(facts))
    (command,) = judged.commands
    assert command.startswith("mkdir -p /etc/mdadm && line=$(mdadm --detail --brief /dev/md/data)")
    assert command.endswith("update-initramfs -u; fi")


def test_a_member_gone_is_a_finding_naming_the_array_and_the_member():
    found = members()
    found[MEMBERS[1]] = None
    judged = disk_ops.judge(RAID, table(raid_facts(found, "detail-member-removed.txt")))
    assert judged.refusal is None and judged.commands == []
    assert judged.findings == [
        f"data_disks: array /dev/md/data: member {MEMBERS[1]} is gone",
        "data_disks: array /dev/md/data is broken, FAILED (3 of 4 devices active)",
    ]


def test_an_array_not_assembled_from_our_members_is_assembled_never_created():
    ours = members(probe={"TYPE": "linux_raid_member", "LABEL": "gpu-1:data", "UUID": UUID})
    judged = disk_ops.judge(RAID, table(raid_facts(ours, None)))
    assemble, conf, label_check, fstab, mount = judged.commands
    assert assemble == "mdadm --assemble /dev/md/data " + " ".join(MEMBERS)
    assert "mdadm --create" not in " ".join(judged.commands)
    assert "mkfs" not in " ".join(judged.commands)
    assert 'blkid -p -s LABEL -o value /dev/md/data)" = gpi-data' in label_check


def test_a_member_failed_in_mdstat_is_a_finding_even_when_detail_looks_whole():
    facts = raid_facts(
        members(), "detail-healthy.txt", mounted=MOUNTED, mdstat="mdstat-healthy.txt"
    )
    assert disk_ops.judge(RAID, table(facts)).findings == []  # the control
    facts = raid_facts(
        members(), "detail-healthy.txt", mounted=MOUNTED, mdstat="mdstat-member-failed.txt"
    )
    judged = disk_ops.judge(RAID, table(facts))
    assert judged.findings == [
        "data_disks: array /dev/md/data is active in /proc/mdstat, nvme2n1 failed"
    ]


def test_an_inactive_array_is_a_finding_never_assembled_again():
    ours = members(probe={"TYPE": "linux_raid_member", "LABEL": "gpu-1:data", "UUID": UUID})
    ours[MEMBERS[1]] = None
    judged = disk_ops.judge(RAID, table(raid_facts(ours, None, mdstat="mdstat-inactive.txt")))
    assert judged.commands == [] and judged.refusal is None
    assert judged.findings == [
        "data_disks: array /dev/md/data stands inactive as md127 in /proc/mdstat"
    ]


def test_a_missing_array_with_a_member_gone_is_a_finding():
    found = members(probe={"TYPE": "linux_raid_member", "LABEL": "gpu-1:data", "UUID": UUID})
    found[MEMBERS[3]] = None
    judged = disk_ops.judge(RAID, table(raid_facts(found, None)))
    assert judged.commands == [] and judged.refusal is None
    assert judged.findings == [
        f"data_disks: array /dev/md/data is missing and cannot be assembled: {MEMBERS[3]} gone"
    ]


def test_an_array_with_other_members_is_refused():
    found = members()
    del found[MEMBERS[3]]
    other = Volume(name="data", disks=MEMBERS[:3])
    judged = disk_ops.judge(other, table(raid_facts(found, "detail-healthy.txt")))
    assert judged.refusal == (
        "array /dev/md/data holds /dev/nvme4n1, which the inventory does not list for volume data"
    )
    assert judged.commands == []


def test_an_array_with_another_chunk_is_refused_never_recreated():
    judged = disk_ops.judge(RAID, table(raid_facts(members(), "detail-chunk-64k.txt")))
    assert judged.refusal is not None and "chunk 64K" in judged.refusal
    assert "never recreated" in judged.refusal and judged.commands == []


@pytest.mark.parametrize(
    ("found", "words"),
    [
        ({"probe": {"TYPE": "ext4", "LABEL": "old"}}, "already holds a ext4 filesystem"),
        ({"probe": {"TYPE": "xfs", "LABEL": "gpi-data"}}, "members of an array must be blank"),
        ({"mounts": ["/scratch"]}, "is mounted at /scratch"),
        (
            {"probe": {"TYPE": "linux_raid_member", "LABEL": "other:home", "UUID": "x"}},
            "member of the md array other:home",
        ),
    ],
)
def test_one_used_member_refuses_the_whole_array(found, words):
    disks = members()
    disks[MEMBERS[2]] = probe(KERNEL[MEMBERS[2]], **found)
    judged = disk_ops.judge(RAID, table(raid_facts(disks, None)))
    assert judged.commands == []
    assert judged.refusal is not None and words in judged.refusal
    assert MEMBERS[2] in judged.refusal


# --- alerts -----------------------------------------------------------------------------


def test_monitoring_alerts_on_a_degraded_or_inactive_array():
    loaded = load(SAMPLE)
    mon = next(c for c in host_contexts(loaded) if c.name == "mon-1")
    rules = yaml.safe_load(files_of(loaded, mon.name)[ALERT_RULES])
    found = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}
    degraded = " ".join(found["NodeMdArrayDegraded"]["expr"].split())
    assert degraded == (
        'node_md_disks{state="failed"} > 0 or (node_md_disks_required - ignoring(state) '
        'node_md_disks{state="active"}) > 0'
    )
    assert found["NodeMdArrayInactive"]["expr"] == 'node_md_state{state="inactive"} == 1'
    assert found["NodeMdArrayDegraded"]["labels"]["severity"] == "critical"
