"""Operations of the shared_fs role: each asks a fact first and does nothing when the cluster,
disk, mount or directory is already as the inventory says (so drift sees only real changes)."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import OperationError, operation
from pyinfra.facts.files import File

from roles.shared_fs.facts import (
    CEPH,
    CephCluster,
    MountedAt,
    OsdDisk,
    SharedDirectories,
)
from toolkit.operations import start_command, wait_for


def osd_refusal(device: str, found: dict[str, str] | None, expected_uuid: str) -> str | None:
    """Why the disk must not become this OSD, in one line; None when it is blank or already
    this OSD's bluestore."""
    if found is None:
        return f"{device} is not a block device on this host"
    if not found:
        return None
    if found.get("type") == "ceph_bluestore" and found.get("osd_uuid") == expected_uuid:
        return None
    if found.get("type") == "ceph_bluestore":
        return f"{device} holds another OSD's bluestore (osd uuid {found.get('osd_uuid')})"
    return f"{device} holds a {found.get('type')} signature"


@operation()
def monitor_created(mon_name: str, keyring: str, fsid: str, monitors: list[tuple[str, str]]):
    """A new monitor's store, made with the cluster's mon. and client.admin keys and a monmap
    naming every monitor (Ceph's manual deployment). Without one, each monitor starts from
    mon_host's addresses as `noname-*` ranks that are removed together once the names are
    known, and Ceph 18.2's ConnectionTracker asserts on more than one rank removed at once
    (`FAILED ceph_assert(rank == new_rank)`, ceph/ceph#69497): a monitor crashed mid-bootstrap
    and the first apply of a new cluster failed, now and then, waiting for quorum."""
    store = f"/var/lib/ceph/mon/ceph-{mon_name}"
    if host.get_fact(File, path=f"{store}/kv_backend"):
        host.noop(f"monitor {mon_name} exists")
        return
    monmap = f"/tmp/gpuinfra-monmap-{mon_name}"
    added = " ".join(f"--addv {shlex.quote(name)} {shlex.quote(addrs)}" for name, addrs in monitors)
    yield f"install -d -o ceph -g ceph {shlex.quote(store)}"
    yield (
        f"monmaptool --create --clobber --fsid {shlex.quote(fsid)} {added} "
        f"{shlex.quote(monmap)} && chmod 0644 {shlex.quote(monmap)}"
    )
    yield (
        f"runuser -u ceph -- ceph-mon --mkfs -i {shlex.quote(mon_name)} "
        f"--monmap {shlex.quote(monmap)} --keyring {shlex.quote(keyring)}"
    )
    yield f"rm -f {shlex.quote(monmap)}"


@operation()
def entities_registered(entities: dict[str, dict[str, str]], keyring: str):
    """The cluster knows each entity with these caps: `ceph auth import` of the keyring (the
    keys come from the controller's state, so a file never travels the other way)."""
    known = host.get_fact(CephCluster).get("caps", {})
    if all(known.get(name) == caps for name, caps in entities.items()):
        host.noop("every entity is registered with its caps")
        return
    yield f"{CEPH} auth import -i {shlex.quote(keyring)}"


@operation()
def osd_created(device: str, osd_id: int, osd_uuid: str):
    """The OSD's bluestore on its raw disk (no LVM in the lab kernel, so not ceph-volume lvm):
    registered with `ceph osd new`, then `ceph-osd --mkfs`. A disk with anything else on it
    is refused, never formatted."""
    found = host.get_fact(OsdDisk, device=device)
    reason = osd_refusal(device, found, osd_uuid)
    if reason:
        raise OperationError(
            f"refusing to make osd.{osd_id}: {reason}; wipe it or set another shared_fs.osd_device"
        )
    osds = host.get_fact(CephCluster).get("osds", [])
    if found and osd_id in osds:
        host.noop(f"osd.{osd_id} exists on {device}")
        return
    data = f"/var/lib/ceph/osd/ceph-{osd_id}"
    yield f"{CEPH} osd new {osd_uuid} {osd_id}"
    if found:
        return  # the disk was made earlier; only its registration was missing
    yield f"install -d -o ceph -g ceph {data} && ln -sfn {shlex.quote(device)} {data}/block"
    yield f"chown ceph:ceph {shlex.quote(device)}"
    yield (
        f"runuser -u ceph -- ceph-osd -i {osd_id} --mkfs --osd-uuid {osd_uuid} "
        "--osd-objectstore bluestore"
    )


@operation()
def filesystem_created(
    fs_name: str, pg_nums: dict[str, int], size: int, min_size: int, bootstrap: bool
):
    """The metadata and data pools (size/min_size), then the file system on them; only the
    first storage host asks, so each command runs once."""
    if not bootstrap:
        host.noop("the first storage host makes the file system")
        return
    state = host.get_fact(CephCluster)
    pools = state.get("pools", {})
    for pool, pg_num in pg_nums.items():
        if pool not in pools:
            yield f"{CEPH} osd pool create {pool} {pg_num} {pg_num} replicated --autoscale-mode=off"
        if pools.get(pool, {}).get("size") != size:
            yield f"{CEPH} osd pool set {pool} size {size}"
        if pools.get(pool, {}).get("min_size") != min_size:
            yield f"{CEPH} osd pool set {pool} min_size {min_size}"
    if fs_name not in state.get("filesystems", []):
        metadata, data = pg_nums
        yield f"{CEPH} fs new {fs_name} {metadata} {data}"


@operation()
def client_authorized(
    fs_name: str, client: str, path: str, caps: dict[str, str], keyring: str, bootstrap: bool
):
    """The workers' key, imported with the caps `ceph fs authorize` gives, then confirmed by
    `ceph fs authorize` itself (it fails when the caps differ from its own)."""
    if not bootstrap:
        host.noop("the first storage host authorizes the client")
        return
    if host.get_fact(CephCluster).get("caps", {}).get(client) == caps:
        host.noop(f"{client} may use {path} of {fs_name}")
        return
    yield f"{CEPH} auth import -i {shlex.quote(keyring)}"
    yield f"{CEPH} fs authorize {fs_name} {client} {shlex.quote(path)} rw > /dev/null"


@operation()
def health_muted(codes: list[str], bootstrap: bool):
    if not bootstrap:
        host.noop("the first storage host mutes")
        return
    mutes = host.get_fact(CephCluster).get("health", {}).get("mutes", [])
    for code in codes:
        if code not in mutes:
            yield f"{CEPH} health mute {shlex.quote(code)} --sticky"


@operation()
def quorum(seconds: int):
    """Readiness: the monitors answer (they have formed quorum); waits for it."""
    if host.get_fact(CephCluster).get("health", {}).get("status"):
        host.noop("the monitors answer")
        return
    yield wait_for(f"{CEPH} quorum_status > /dev/null 2>&1", seconds)


@operation()
def healthy(timeout_s: int):
    """Readiness (and drift): the cluster reports HEALTH_OK (mutes applied); waits for it."""
    health = host.get_fact(CephCluster).get("health", {})
    if health.get("status") == "HEALTH_OK":
        host.noop("HEALTH_OK")
        return
    yield (
        wait_for(f"{CEPH} health | grep -q '^HEALTH_OK'", timeout_s)
        + " ; "
        + (f"rc=$?; [ $rc = 0 ] || {CEPH} health detail >&2; exit $rc")
    )


@operation()
def mounted(path: str, unit: str, fstype: str):
    """The shared file system is mounted at `path` (started through its mount unit)."""
    if host.get_fact(MountedAt, path=path) == fstype:
        host.noop(f"{path} is mounted")
        return
    yield f"mkdir -p {shlex.quote(path)}"
    yield start_command(unit)


@operation()
def directories_kept(root: str, directories: list[dict]):
    """Each shared directory exists with its owner, mode and quota (ceph.quota.max_bytes),
    set through the admin mount of the file system's root."""
    paths = tuple(root + d["path"] for d in directories)
    found = host.get_fact(SharedDirectories, paths=paths) if paths else {}
    for wanted, path in zip(directories, paths, strict=True):
        have = found.get(path)
        quoted = shlex.quote(path)
        if have is None:
            yield f"mkdir -p {quoted}"
        if have is None or (have["uid"], have["gid"]) != (wanted["uid"], wanted["gid"]):
            yield f"chown {wanted['uid']}:{wanted['gid']} {quoted}"
        if have is None or have["mode"] != wanted["mode"]:
            yield f"chmod {wanted['mode']} {quoted}"
        if (have or {}).get("quota_bytes") != wanted["quota_bytes"]:
            value = wanted["quota_bytes"] or 0  # 0 removes a quota
            yield f"setfattr -n ceph.quota.max_bytes -v {value} {quoted}"
    if not directories:
        host.noop("no shared directories on this host")
