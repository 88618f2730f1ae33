"""Facts of the shared_fs role: the Ceph cluster as one storage host's admin key sees it, an
OSD's data disk, a mount, and the shared directories' owners, modes and quotas."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

# Every `ceph` call gives up rather than hang a run on a cluster without quorum.
CEPH = "timeout 30 ceph --connect-timeout 20"


# The cluster as the monitors describe it, asked in one Python process through librados (the
# `rados` module the ceph command itself runs on): one interpreter start on the host instead of
# five `ceph` commands (about 300 ms of CPU each on a lab host), in every apply and every drift
# probe of a storage host. Only what the role reads is printed: never a key (a fact's output is
# logged), nor the counters and epochs that move while nothing changes (the drift fast path
# compares the output whole). A part the monitors do not answer is null.
_CLUSTER_SCRIPT = """\
import json
try:
    import rados
    cluster = rados.Rados(conffile="/etc/ceph/ceph.conf")
    cluster.connect(timeout=20)
except Exception:
    raise SystemExit(0)


def ask(prefix, **args):
    command = json.dumps(dict(prefix=prefix, format="json", **args))
    try:
        code, out, _ = cluster.mon_command(command, b"", timeout=20)
        return json.loads(out) if code == 0 else None
    except Exception:
        return None


health, auth = ask("health"), ask("auth ls")
pools, filesystems, osds = ask("osd pool ls", detail="detail"), ask("fs ls"), ask("osd ls")
print(json.dumps({
    "health": None if health is None else {
        "status": health.get("status"),
        "checks": sorted(health.get("checks", {})),
        "mutes": sorted(mute["code"] for mute in health.get("mutes", [])),
    },
    "caps": None if auth is None else {e["entity"]: e.get("caps", {}) for e in auth["auth_dump"]},
    "pools": None if pools is None else {
        pool["pool_name"]: {k: pool[k] for k in ("size", "min_size", "pg_num")} for pool in pools
    },
    "filesystems": None if filesystems is None else sorted(fs["name"] for fs in filesystems),
    "osds": None if osds is None else sorted(osds),
}, sort_keys=True))
"""


class CephCluster(FactBase):
    """What one storage host's admin key sees: `{"health": {"status": "HEALTH_OK", "checks":
    ["OSD_DOWN"], "mutes": [...]}, "caps": {"osd.0": {"mon": "allow profile osd"}},
    "pools": {"cephfs_data": {"size": 3, "min_size": 2, "pg_num": 64}}, "filesystems":
    ["cephfs"], "osds": [0, 1, 2]}`; a part the cluster does not answer is left out ({} when
    there is no cluster yet, or no quorum)."""

    default = dict

    def command(self) -> str:
        return f"timeout 30 python3 -c {shlex.quote(_CLUSTER_SCRIPT)} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict:
        try:
            data = json.loads("".join(output))
        except ValueError:
            return {}
        return {part: value for part, value in data.items() if value is not None}


class OsdDisk(FactBase):
    """What is on an OSD's disk: {"type": "ceph_bluestore", "osd_uuid": "..."} for a bluestore
    OSD (the uuid from its label), {"type": "ext4"} for another signature, {} when blank, None
    when the device is missing."""

    def command(self, device: str) -> str:
        quoted = shlex.quote(device)
        return (
            f"if test -b {quoted}; then echo PRESENT; "
            f"blkid -p -o value -s TYPE {quoted} || true; "
            f"dd if={quoted} bs=4096 count=1 2>/dev/null | head -c 60 | sed -n 2p "
            "| tr -cd '0-9a-f-'; "
            "echo; fi"
        )

    def process(self, output: list[str]) -> dict[str, str] | None:
        if not output or output[0].strip() != "PRESENT":
            return None
        rest = [line.strip() for line in output[1:]]
        if not rest or not rest[0]:
            return {}
        found = {"type": rest[0]}
        if rest[0] == "ceph_bluestore" and len(rest) > 1 and rest[1]:
            found["osd_uuid"] = rest[1]
        return found


class MountedAt(FactBase):
    """The file system type mounted at a path (fuse.ceph-fuse, nfs4, ...), or None."""

    def command(self, path: str) -> str:
        return f"findmnt -n -o FSTYPE --mountpoint {shlex.quote(path)} || true"

    def process(self, output: list[str]) -> str | None:
        lines = [line.strip() for line in output if line.strip()]
        return lines[0] if lines else None


class SharedDirectories(FactBase):
    """{path: {"uid": 0, "gid": 0, "mode": "1777", "quota_bytes": 1073741824}} for the paths
    that exist; quota_bytes is None where none is set."""

    default = dict

    def command(self, paths: tuple[str, ...]) -> str:
        probes = [
            f'p={shlex.quote(path)}; if test -d "$p"; then '
            f'echo "$p $(stat -c \'%u %g %a\' "$p") '
            f'$(getfattr --only-values -n ceph.quota.max_bytes "$p" 2>/dev/null || echo 0)"; fi'
            for path in paths
        ]
        return "; ".join(probes) or "true"

    def process(self, output: list[str]) -> dict[str, dict]:
        found = {}
        for line in output:
            fields = line.split()
            if len(fields) == 5:
                path, uid, gid, mode, quota = fields
                found[path] = {
                    "uid": int(uid),
                    "gid": int(gid),
                    "mode": mode.zfill(4),
                    "quota_bytes": int(quota) or None if quota.isdigit() else None,
                }
        return found
