"""The shared_fs role offline: its settings, the storage hosts' ceph.conf and keyrings, every
worker's mount unit (the cluster's own CephFS, or a site's CephFS, NFS, Lustre or BeeGFS), the
facts' parsing and the operations' decisions against given facts."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess

import pytest
from pydantic import ValidationError
from pyinfra.facts.files import File

from engine.context import load
from roles.shared_fs.config import SharedFsConfig
from roles.shared_fs.facts import CephCluster, MountedAt, OsdDisk, SharedDirectories
from roles.shared_fs.files import mount_unit_name
from roles.shared_fs.operations import (
    directories_kept,
    filesystem_created,
    healthy,
    monitor_created,
    mounted,
    osd_created,
    osd_refusal,
)
from roles.shared_fs.secrets import new_cephx_key
from tests.helpers import files_of
from tests.unit.conftest import SAMPLE
from tests.unit.fake_host import commands

UUID = "0d1110d0-e868-4000-aabf-c0711de09885"


@pytest.fixture(scope="module")
def sample():
    return load(SAMPLE)


def test_sample_storage_hosts_get_ceph_conf_with_three_monitors(sample):
    files = files_of(sample, "stor-1", "shared_fs")
    conf = files["/etc/ceph/ceph.conf"]
    assert "mon_initial_members = stor-1, stor-2, stor-3" in conf
    assert "mon_host = [v2:10.40.30.11:3300,v1:10.40.30.11:6789], " in conf
    assert "osd_pool_default_size = 3" in conf and "osd_pool_default_min_size = 2" in conf
    assert "auth_allow_insecure_global_id_reclaim = false" in conf
    assert "ms_bind_port_min = 6800" in conf and "ms_bind_port_max = 6823" in conf


def test_keyrings_are_secret_and_each_daemon_has_its_own(sample):
    managed = files_of(sample, "stor-2", "shared_fs", contents=False)
    for path in (
        "/etc/ceph/ceph.client.admin.keyring",
        "/etc/ceph/gpuinfra-mon.keyring",
        "/var/lib/ceph/osd/ceph-1/keyring",  # stor-2 is the second storage host: osd.1
        "/var/lib/ceph/mgr/ceph-stor-2/keyring",
        "/var/lib/ceph/mds/ceph-stor-2/keyring",
    ):
        assert managed[path].mode == "0600" and managed[path].secret, path
    assert managed["/var/lib/ceph/osd/ceph-1/keyring"].user == "ceph"
    osd = managed["/var/lib/ceph/osd/ceph-1/keyring"].content
    assert osd.startswith("[osd.1]\n\tkey = ") and 'caps mon = "allow profile osd"' in osd


def test_workers_get_only_their_limited_key_and_a_fuse_mount(sample):
    files = files_of(sample, "gpu-1", "shared_fs", contents=False)
    assert "/etc/ceph/ceph.client.admin.keyring" not in files
    keyring = files["/etc/ceph/ceph.client.training.keyring"]
    assert keyring.mode == "0600" and keyring.secret
    assert "caps" not in keyring.content  # caps live in the cluster, not on the worker
    unit = files["/etc/systemd/system/shared.mount"].content
    assert "Where=/shared\n" in unit and "Type=fuse.ceph\n" in unit
    assert (
        "Options=ceph.id=training,ceph.client_mountpoint=/,ceph.conf=/etc/ceph/ceph.conf,"
        "noatime,_netdev,nofail\n" in unit
    )
    assert "WantedBy=remote-fs.target" in unit
    conf = files["/etc/ceph/ceph.conf"].content
    assert "mon_host = " in conf and "osd_pool_default_size" not in conf


def test_non_workers_get_no_shared_fs_files(sample):
    assert files_of(sample, "etcd-1", "shared_fs") == {}


def test_no_storage_hosts_means_no_mount(loaded):
    assert files_of(loaded, "gpu-1", "shared_fs") == {}


def test_client_caps_are_those_of_ceph_fs_authorize():
    """Recorded on the lab (Debian 13, ceph 18.2.7): `ceph fs authorize cephfs client.training
    /training rw` then `ceph auth get client.training` gave these three lines."""
    from roles.shared_fs.files import client_caps

    caps = dict(client_caps(SharedFsConfig(client_path="/training")))
    assert caps == {
        "mds": "allow rw fsname=cephfs path=/training",
        "mon": "allow r fsname=cephfs",
        "osd": "allow rw tag cephfs data=cephfs",
    }
    assert dict(client_caps(SharedFsConfig()))["mds"] == "allow rw fsname=cephfs"


def existing_cluster(small_cluster, write_cluster, tmp_path, existing: dict):
    small_cluster.setdefault("group_vars", {}).setdefault("all", {})["shared_fs"] = {
        "mount_point": "/data",
        "existing": existing,
    }
    return load(write_cluster(small_cluster))


def test_client_only_cephfs_uses_the_kernel_client_and_a_secret_file(
    small_cluster, write_cluster, tmp_path
):
    key_file = tmp_path / "site-ceph.key"
    key_file.write_text("AQBuMwhrAAAAABAAw5rA1FNW6dC3VpZNnQclKA==\n")
    loaded = existing_cluster(
        small_cluster,
        write_cluster,
        tmp_path,
        {
            "type": "cephfs",
            "servers": ["10.1.0.1", "10.1.0.2", "10.1.0.3"],
            "export": "/training",
            "fsid": UUID,
            "key_file": str(key_file),
            "fs_name": "prod",
        },
    )
    files = files_of(loaded, "cpu-1", "shared_fs", contents=False)
    unit = files["/etc/systemd/system/data.mount"].content
    assert "What=10.1.0.1,10.1.0.2,10.1.0.3:/training\n" in unit and "Type=ceph\n" in unit
    assert (
        "Options=name=training,secretfile=/etc/ceph/training.secret,fs=prod,noatime,"
        "_netdev,nofail\n" in unit
    )
    secret = files["/etc/ceph/training.secret"]
    assert secret.mode == "0600" and secret.secret
    assert f"fsid = {UUID}" in files["/etc/ceph/ceph.conf"].content
    # No storage hosts in this cluster, and none would be made: the site runs them.
    assert files_of(loaded, "etcd-1", "shared_fs") == {}


@pytest.mark.parametrize(
    ("existing", "what", "type_", "options"),
    [
        (
            {"type": "nfs", "servers": ["nfs.site"], "export": "/exports/train"},
            "nfs.site:/exports/train",
            "nfs",
            "vers=4.2,proto=tcp,hard,timeo=600,nconnect=8,noatime,_netdev,nofail",
        ),
        (
            {"type": "lustre", "servers": ["10.2.0.1@o2ib", "10.2.0.2@o2ib"], "export": "lfs1"},
            "10.2.0.1@o2ib:10.2.0.2@o2ib:/lfs1",
            "lustre",
            "flock,noatime,_netdev,nofail",
        ),
        (
            {"type": "beegfs", "servers": ["mgmt.site"], "options": ["ro"]},
            "beegfs_nodev",
            "beegfs",
            "cfgFile=/etc/beegfs/beegfs-client.conf,noatime,ro,_netdev,nofail",
        ),
    ],
)
def test_client_only_mount_units(
    small_cluster, write_cluster, tmp_path, existing, what, type_, options
):
    loaded = existing_cluster(small_cluster, write_cluster, tmp_path, existing)
    files = files_of(loaded, "gpu-1", "shared_fs")
    unit = files["/etc/systemd/system/data.mount"]
    assert f"What={what}\n" in unit and f"Type={type_}\n" in unit
    assert f"Options={options}\n" in unit
    if type_ == "beegfs":
        assert "After=network-online.target beegfs-helperd.service\n" in unit
        assert "sysMgmtdHost = mgmt.site\n" in files["/etc/beegfs/beegfs-client.conf"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"mount_point": "relative"}, "not an absolute path"),
        ({"mount_point": "/mnt/shared-data"}, "names a mount unit"),
        ({"mount_options": ["noatime,ro"]}, "one option per item"),
        ({"replicas": 2, "min_replicas": 3}, "min_replicas is above replicas"),
        ({"directories": [{"path": "/x/../etc"}]}, "not an absolute path"),
        ({"directories": [{"path": "/x", "mode": "999"}]}, "not octal"),
        ({"existing": {"type": "cephfs", "servers": ["m1"]}}, "needs fsid, key_file"),
        ({"existing": {"type": "gluster", "servers": ["m1"]}}, "cephfs"),
        ({"typo": 1}, "Extra inputs are not permitted"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValidationError, match=message):
        SharedFsConfig.model_validate(settings)


def test_bad_inventory_names_the_key(small_cluster, write_cluster):
    from typer.testing import CliRunner

    from cli.main import app

    small_cluster["hosts"]["cpu-1"]["vars"] = {"shared_fs": {"mount_point": "rel"}}
    result = CliRunner().invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert "cpu-1" in result.output and "mount_point" in result.output


@pytest.mark.parametrize(
    ("path", "unit"),
    [("/shared", "shared.mount"), ("/mnt/data", "mnt-data.mount"), ("/a/.b", "a-\\x2eb.mount")],
)
def test_mount_unit_names_follow_systemd_escape(path, unit):
    assert mount_unit_name(path) == unit


def test_cephx_keys_are_encoded_as_ceph_does():
    key = base64.b64decode(new_cephx_key(now=1_700_000_000, random=bytes(range(16))))
    kind, seconds, nanoseconds, length = struct.unpack("<HIIH", key[:12])
    assert (kind, seconds, nanoseconds, length) == (1, 1_700_000_000, 0, 16)
    assert key[12:] == bytes(range(16))


@pytest.mark.parametrize(
    ("found", "refused"),
    [
        ({}, None),  # blank: made into the OSD
        ({"type": "ceph_bluestore", "osd_uuid": UUID}, None),  # already this OSD's
        ({"type": "ext4"}, "/dev/vdb holds a ext4 signature"),
        ({"type": "ceph_bluestore", "osd_uuid": "other"}, "another OSD's bluestore"),
        (None, "not a block device"),
    ],
)
def test_osd_disk_refusal(found, refused):
    reason = osd_refusal("/dev/vdb", found, UUID)
    assert reason == refused or (refused and refused in reason)


def test_osd_created_refuses_a_foreign_disk_and_formats_a_blank_one():
    from pyinfra.api import OperationError

    with pytest.raises(OperationError, match="refusing to make osd.0: /dev/vdb holds a xfs"):
        commands(osd_created, {OsdDisk: {"type": "xfs"}, CephCluster: {}}, device="/dev/vdb",
                 osd_id=0, osd_uuid=UUID)  # fmt: skip
    yielded, _ = commands(
        osd_created, {OsdDisk: {}, CephCluster: {"osds": []}},
        device="/dev/vdb", osd_id=0, osd_uuid=UUID,
    )  # fmt: skip
    assert yielded[0].endswith(f"osd new {UUID} 0")
    assert "ceph-osd -i 0 --mkfs" in yielded[-1]
    done, noops = commands(
        osd_created, {OsdDisk: {"type": "ceph_bluestore", "osd_uuid": UUID},
                      CephCluster: {"osds": [0]}},
        device="/dev/vdb", osd_id=0, osd_uuid=UUID,
    )  # fmt: skip
    assert done == [] and "osd.0 exists" in noops[0]


def test_filesystem_created_makes_only_what_is_missing():
    pools = {"cephfs_metadata": {"size": 3, "min_size": 2, "pg_num": 16}}
    yielded, _ = commands(
        filesystem_created, {CephCluster: {"pools": pools, "filesystems": []}},
        fs_name="cephfs", pg_nums={"cephfs_metadata": 16, "cephfs_data": 64}, size=3,
        min_size=2, bootstrap=True,
    )  # fmt: skip
    assert [c.split("--connect-timeout 20 ")[1] for c in yielded] == [
        "osd pool create cephfs_data 64 64 replicated --autoscale-mode=off",
        "osd pool set cephfs_data size 3",
        "osd pool set cephfs_data min_size 2",
        "fs new cephfs cephfs_metadata cephfs_data",
    ]
    other, _ = commands(filesystem_created, {}, fs_name="cephfs", pg_nums={}, size=3,
                        min_size=2, bootstrap=False)  # fmt: skip
    assert other == []


@pytest.mark.parametrize(("status", "waits"), [("HEALTH_OK", False), ("HEALTH_WARN", True)])
def test_healthy_waits_unless_health_ok(status, waits):
    yielded, _ = commands(healthy, {CephCluster: {"health": {"status": status}}}, timeout_s=60)
    assert bool(yielded) is waits


@pytest.mark.parametrize(("fstype", "starts"), [("fuse.ceph-fuse", False), (None, True)])
def test_mounted_starts_the_unit_when_the_mount_is_missing(fstype, starts):
    yielded, _ = commands(mounted, {MountedAt: fstype}, path="/shared", unit="shared.mount",
                          fstype="fuse.ceph-fuse")  # fmt: skip
    assert any("systemctl start shared.mount" in c for c in yielded) is starts


def test_directories_kept_sets_what_differs():
    wanted = {"path": "/d", "uid": 1000, "gid": 1000, "mode": "2775", "quota_bytes": 2**30}
    have = {"/r/d": {"uid": 1000, "gid": 1000, "mode": "0777", "quota_bytes": None}}
    yielded, _ = commands(directories_kept, {SharedDirectories: have}, root="/r",
                          directories=[wanted])  # fmt: skip
    assert yielded == ["chmod 2775 /r/d", "setfattr -n ceph.quota.max_bytes -v 1073741824 /r/d"]
    same = {"/r/d": {k: v for k, v in wanted.items() if k != "path"}}
    assert commands(directories_kept, {SharedDirectories: same}, root="/r",
                    directories=[wanted])[0] == []  # fmt: skip


# A stand-in for librados' `rados` module (no Ceph on this machine; the lab runs the real one):
# the monitors' answers are JSON in the shapes Ceph's documentation shows for `ceph health`,
# `auth ls`, `osd pool ls detail`, `fs ls` and `osd ls` with `-f json`, written down here.
FAKE_RADOS = """\
import json, os
ANSWERS = json.loads(os.environ["FAKE_CEPH"])
class Rados:
    def __init__(self, conffile):
        pass
    def connect(self, timeout):
        if ANSWERS is None:
            raise OSError("no quorum")
    def mon_command(self, command, inbuf, timeout):
        asked = json.loads(command)
        key = " ".join([asked["prefix"]] + ([asked["detail"]] if "detail" in asked else []))
        if key not in ANSWERS:
            return -110, b"", "timed out"
        return 0, json.dumps(ANSWERS[key]).encode(), ""
"""
MONITORS = {
    "health": {
        "status": "HEALTH_WARN",
        "checks": {"OSD_DOWN": {"severity": "HEALTH_WARN", "muted": False,
                                "summary": {"message": "1 osds down", "count": 1}}},
        "mutes": [{"code": "MGR_MODULE_DEPENDENCY", "sticky": True, "count": 3,
                   "summary": "Module 'restful' has failed dependency"}],
    },
    "auth ls": {"auth_dump": [
        {"entity": "osd.0", "key": "AQBzZ2Zm0000000000000000000000000000000==",
         "caps": {"mgr": "allow profile osd", "mon": "allow profile osd", "osd": "allow *"}},
    ]},
    "osd pool ls detail": [
        {"pool_id": 2, "pool_name": "cephfs_data", "size": 3, "min_size": 2, "pg_num": 32,
         "pg_placement_num": 32, "last_change": "57", "crush_rule": 0},
    ],
    "fs ls": [{"name": "cephfs", "metadata_pool": "cephfs_metadata",
               "data_pools": ["cephfs_data"]}],
    "osd ls": [2, 0, 1],
}  # fmt: skip


def ask_cluster(tmp_path, answers) -> tuple[str, dict]:
    (tmp_path / "rados.py").write_text(FAKE_RADOS)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FAKE_CEPH": json.dumps(answers)}
    result = subprocess.run(["sh", "-c", CephCluster().command()], capture_output=True,
                            text=True, env=env, check=True)  # fmt: skip
    return result.stdout, CephCluster().process(result.stdout.splitlines())


def test_one_process_asks_the_monitors_everything_the_role_reads(tmp_path):
    stdout, found = ask_cluster(tmp_path, MONITORS)
    assert found == {
        "health": {"status": "HEALTH_WARN", "checks": ["OSD_DOWN"],
                   "mutes": ["MGR_MODULE_DEPENDENCY"]},
        "caps": {"osd.0": MONITORS["auth ls"]["auth_dump"][0]["caps"]},
        "pools": {"cephfs_data": {"size": 3, "min_size": 2, "pg_num": 32}},
        "filesystems": ["cephfs"],
        "osds": [0, 1, 2],
    }  # fmt: skip
    # Never a key, nor what moves while nothing changes (the mute's count, the pool's epoch).
    assert "AQB" not in stdout and "last_change" not in stdout and "count" not in stdout
    # A part the monitors do not answer is left out; no cluster at all is {}.
    partial = {k: v for k, v in MONITORS.items() if k != "osd ls"}
    assert "osds" not in ask_cluster(tmp_path, partial)[1]
    # A new cluster: no pool, file system or OSD yet, each an empty one of its kind.
    empty = {"osd pool ls detail": [], "fs ls": [], "osd ls": []}
    assert ask_cluster(tmp_path, empty)[1] == {"pools": {}, "filesystems": [], "osds": []}
    assert ask_cluster(tmp_path, None) == ("", {})


def test_facts_parse_what_blkid_and_stat_print():
    assert OsdDisk().process(["PRESENT", "ceph_bluestore", UUID]) == {
        "type": "ceph_bluestore",
        "osd_uuid": UUID,
    }
    assert OsdDisk().process(["PRESENT", "", ""]) == {}
    assert OsdDisk().process([]) is None
    dirs = SharedDirectories().process(["/r/d 1000 1000 2775 1073741824", "/r/s 0 0 1777 0"])
    assert dirs["/r/d"]["quota_bytes"] == 2**30 and dirs["/r/s"]["quota_bytes"] is None
    assert dirs["/r/s"]["mode"] == "1777"


def test_a_new_monitor_is_made_from_a_monmap_naming_every_monitor():
    """Every monitor named in the monmap it starts from: from mon_host alone each starts with
    `noname-*` ranks removed together later, which Ceph 18.2 asserts on (a monitor crashed
    mid-bootstrap on the lab, ceph/ceph#69497)."""
    monitors = [
        ("stor-1", "[v2:10.0.0.81:3300,v1:10.0.0.81:6789]"),
        ("stor-2", "[v2:10.0.0.82:3300,v1:10.0.0.82:6789]"),
    ]
    done, noops = commands(
        monitor_created,
        {File: None},
        mon_name="stor-1",
        keyring="/etc/ceph/gpuinfra-mon.keyring",
        fsid="1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        monitors=monitors,
    )
    assert done == [
        "install -d -o ceph -g ceph /var/lib/ceph/mon/ceph-stor-1",
        "monmaptool --create --clobber --fsid 1b4e28ba-2fa1-11d2-883f-0016d3cca427 "
        "--addv stor-1 '[v2:10.0.0.81:3300,v1:10.0.0.81:6789]' "
        "--addv stor-2 '[v2:10.0.0.82:3300,v1:10.0.0.82:6789]' "
        "/tmp/gpuinfra-monmap-stor-1 && chmod 0644 /tmp/gpuinfra-monmap-stor-1",
        "runuser -u ceph -- ceph-mon --mkfs -i stor-1 --monmap /tmp/gpuinfra-monmap-stor-1 "
        "--keyring /etc/ceph/gpuinfra-mon.keyring",
        "rm -f /tmp/gpuinfra-monmap-stor-1",
    ]
    # A monitor whose store exists is left alone.
    done, noops = commands(
        monitor_created,
        {File: {"size": 8}},
        mon_name="stor-1",
        keyring="k",
        fsid="f",
        monitors=monitors,
    )
    assert done == [] and noops == ["monitor stor-1 exists"]
