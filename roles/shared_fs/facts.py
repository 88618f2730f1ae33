"""Facts of the shared_fs role: the Ceph cluster as one storage host's admin key sees it, an
OSD's data disk, a mount, and the shared directories' owners, modes and quotas."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

# Every `ceph` call gives up rather than hang a run on a cluster without quorum.
CEPH = "timeout 30 ceph --connect-timeout 20"


class CephHealth(FactBase):
    """{"status": "HEALTH_OK", "checks": ["OSD_DOWN", ...], "mutes": ["MGR_MODULE_DEPENDENCY"]}
    from `ceph health -f json`; {} when the cluster does not answer (none yet, no quorum)."""

    default = dict

    def command(self) -> str:
        return f"{CEPH} health -f json 2>/dev/null || true"

    def process(self, output: list[str]) -> dict:
        try:
            data = json.loads("".join(output))
        except ValueError:
            return {}
        return {
            "status": data.get("status"),
            "checks": sorted(data.get("checks", {})),
            "mutes": sorted(mute["code"] for mute in data.get("mutes", [])),
        }


# The caps of every cephx entity, its key left out on the host (a fact's output is logged).
_CAPS_ONLY = (
    "import json, sys; "
    "print(json.dumps({e['entity']: e.get('caps', {}) for e in json.load(sys.stdin)['auth_dump']}))"
)


class CephAuthCaps(FactBase):
    """{"osd.0": {"mon": "allow profile osd", ...}, ...}: each entity's caps, never its key;
    {} when the cluster does not answer."""

    default = dict

    def command(self) -> str:
        return f"{CEPH} auth ls -f json 2>/dev/null | python3 -c {shlex.quote(_CAPS_ONLY)} || true"

    def process(self, output: list[str]) -> dict[str, dict[str, str]]:
        try:
            return json.loads("".join(output))
        except ValueError:
            return {}


class CephPools(FactBase):
    """{"pools": {"cephfs_data": {"size": 3, "min_size": 2, "pg_num": 64}}, "filesystems":
    ["cephfs"], "osds": [0, 1, 2]}; {} when the cluster does not answer."""

    default = dict

    def command(self) -> str:
        return (
            f"{CEPH} osd pool ls detail -f json 2>/dev/null && echo && "
            f"{CEPH} fs ls -f json 2>/dev/null && echo && {CEPH} osd ls -f json 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> dict:
        lines = [line for line in output if line.strip()]
        try:
            pools, filesystems, osds = (json.loads(line) for line in lines)
        except ValueError:
            return {}
        return {
            "pools": {
                pool["pool_name"]: {
                    "size": pool["size"],
                    "min_size": pool["min_size"],
                    "pg_num": pool["pg_num"],
                }
                for pool in pools
            },
            "filesystems": sorted(fs["name"] for fs in filesystems),
            "osds": sorted(osds),
        }


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
