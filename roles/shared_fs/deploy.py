"""The shared_fs role's deploy: the CephFS storage hosts (monitors, manager, MDS and one OSD
each), then every worker's mount of the shared file system."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, server

from roles.shared_fs.config import SharedFsConfig
from roles.shared_fs.facts import CEPH
from roles.shared_fs.files import (
    ADMIN_MOUNT,
    CEPH_CONF,
    CLIENT_PACKAGES,
    DAEMONS_KEYRING,
    MON_KEYRING,
    OSD_DROP_IN,
    client_entity,
    client_files,
    host_entities,
    is_first_storage_host,
    mon_addresses,
    mount_spec,
    mount_unit_name,
    osd_id,
    storage_files,
    storage_hosts,
    storage_osd_uuid,
    unit_path,
)
from roles.shared_fs.operations import (
    client_authorized,
    directories_kept,
    entities_registered,
    filesystem_created,
    health_muted,
    healthy,
    monitor_created,
    mounted,
    osd_created,
    quorum,
)
from roles.shared_fs.secrets import fsid
from toolkit.operations import (
    clear_pending,
    enable_at_boot,
    put_file,
    restart_command,
    service_running,
    service_stopped,
    wait_for,
)
from toolkit.spec import HostContext

SERVER_PACKAGES = ["ceph-mon", "ceph-mgr", "ceph-mds", "ceph-osd", "ceph-common", "ceph-fuse"]
# getfattr/setfattr: the directories' quotas are extended attributes.
TOOLS = ["attr"]
FUSE_TYPE = "fuse.ceph-fuse"
# ceph-base's crash poster, kept off: it posts a host's crash reports to the mgr's crash module,
# which does not load on Debian 13's reef (no mgr module does: MGR_MODULE_DEPENDENCY, see
# SharedFsConfig.muted_health_checks). Each mgr start writes a report per module that failed
# (27 here), and the poster retried every one of them every 10 minutes with up to three `ceph`
# runs, without a key to post with: 0.02 to 0.04 cores per storage host for nothing (measured on
# the lab, docs/roles/shared_fs.md). The reports stay in /var/lib/ceph/crash.
CRASH_POSTER = "ceph-crash"


def pinned(packages: list[str], version: str) -> list[str]:
    return [f"{name}={version}" for name in packages]


@deploy("Shared FS storage")
def apply_storage(ctx: HostContext) -> None:
    cfg = ctx.config(SharedFsConfig)
    if cfg.existing is not None or not storage_hosts(ctx):
        return  # the site's own storage: nothing runs on storage hosts
    if cfg.osd_device is None:
        raise ValueError(f"{ctx.name}: shared_fs.osd_device is not set for this storage host")
    first = is_first_storage_host(ctx)
    osd = osd_id(ctx)
    apt.packages(
        name="Install Ceph",
        packages=pinned(SERVER_PACKAGES, cfg.ceph_version) + TOOLS,
        no_recommends=True,
    )
    service_stopped(name="Keep the crash poster stopped", unit=CRASH_POSTER)
    files = storage_files(ctx)
    written = {managed.path: put_file(managed) for managed in files}
    conf_changed = written[CEPH_CONF].did_change
    server.shell(
        name="Read the OSD unit's drop-in",
        commands=["systemctl daemon-reload"],
        _if=written[OSD_DROP_IN].did_change,
    )
    # Together (the phase's rolling): the monitors of a new cluster start at once and form quorum.
    monitor_created(
        name="Create the monitor",
        mon_name=ctx.name,
        keyring=MON_KEYRING,
        fsid=fsid(ctx.loaded.state_dir, ctx.loaded.state_access),
        monitors=list(zip(storage_hosts(ctx), mon_addresses(ctx), strict=True)),
    )
    service_running(name="Run the monitor", unit=f"ceph-mon@{ctx.name}")
    quorum(name="Wait for the monitors' quorum", seconds=180)
    entities = {
        entity.name: dict(entity.caps) for entity in [*host_entities(ctx), client_entity(ctx)]
    }
    entities_registered(
        name="Register this host's daemons", entities=entities, keyring=DAEMONS_KEYRING
    )
    service_running(name="Run the manager", unit=f"ceph-mgr@{ctx.name}")
    osd_created(
        name="Create the OSD", device=cfg.osd_device, osd_id=osd, osd_uuid=storage_osd_uuid(ctx)
    )
    service_running(name="Run the OSD", unit=f"ceph-osd@{osd}")
    filesystem_created(
        name="Create the file system",
        fs_name=cfg.fs_name,
        pg_nums={
            f"{cfg.fs_name}_metadata": cfg.metadata_pg_num,
            f"{cfg.fs_name}_data": cfg.data_pg_num,
        },
        size=cfg.replicas,
        min_size=cfg.min_replicas,
        bootstrap=first,
    )
    service_running(name="Run the MDS", unit=f"ceph-mds@{ctx.name}")
    client = client_entity(ctx)
    client_authorized(
        name="Authorize the workers' client",
        fs_name=cfg.fs_name,
        client=client.name,
        path=cfg.client_path,
        caps=dict(client.caps),
        keyring=DAEMONS_KEYRING,
        bootstrap=first,
    )
    health_muted(
        name="Mute the known health checks", codes=cfg.muted_health_checks, bootstrap=first
    )
    # A changed ceph.conf restarts the daemons one host at a time, each waiting for HEALTH_OK,
    # so the cluster keeps its quorum and two of three copies of every object throughout.
    units = (
        f"ceph-mon@{ctx.name}",
        f"ceph-mgr@{ctx.name}",
        f"ceph-osd@{osd}",
        f"ceph-mds@{ctx.name}",
    )
    server.shell(
        name="Restart the Ceph daemons for their configuration, one host at a time",
        commands=[
            # Debian's ceph units allow 3 starts in 30 min (StartLimitBurst): a bootstrap, a
            # host's reboot and this restart would hit it ("start-limit-hit", seen on the lab).
            *(f"systemctl reset-failed {unit}" for unit in units),
            *(restart_command(unit) for unit in units),
            wait_for(f"{CEPH} health | grep -q '^HEALTH_OK'", cfg.health_timeout_s),
        ],
        _serial=True,  # the next host restarts only once this one's are back and healthy
        _if=conf_changed,
    )
    healthy(name="Wait for HEALTH_OK", timeout_s=cfg.health_timeout_s)
    server.shell(
        name="Read the admin mount unit",
        commands=["systemctl daemon-reload"],
        _if=written[unit_path(ADMIN_MOUNT)].did_change,
    )
    # Enabled too: a storage host back from a reboot mounts it again (or drift says so).
    enable_at_boot(
        next(m for m in files if m.path == unit_path(ADMIN_MOUNT)), name="Mount the root at boot"
    )
    mounted(
        name="Mount the file system's root (admin)",
        path=ADMIN_MOUNT,
        unit=mount_unit_name(ADMIN_MOUNT),
        fstype=FUSE_TYPE,
    )
    directories_kept(
        name="Keep the shared directories",
        root=ADMIN_MOUNT,
        directories=[d.model_dump() for d in cfg.directories] if first else [],
    )
    clear_pending(name="Finish the storage phase", paths=[managed.path for managed in files])


@deploy("Shared FS client")
def apply_client(ctx: HostContext) -> None:
    files = client_files(ctx)
    if not files:
        return  # no storage in the cluster and none of the site's: nothing to mount
    cfg = ctx.config(SharedFsConfig)
    spec = mount_spec(ctx)
    packages = CLIENT_PACKAGES[spec.kind]
    if packages:
        versioned = pinned(packages, cfg.ceph_version) if "ceph" in spec.kind else packages
        apt.packages(name="Install the file system client", packages=versioned, no_recommends=True)
    written = [put_file(managed) for managed in files]
    server.shell(
        name="Read the mount unit",
        commands=["systemctl daemon-reload"],
        _if=written[0].did_change,
    )
    unit = mount_unit_name(cfg.mount_point)
    enable_at_boot(files[0], name="Mount at boot")
    fstype = (
        FUSE_TYPE if spec.kind == "cephfs-fuse" else ("nfs4" if spec.kind == "nfs" else spec.type)
    )
    mounted(name="Mount the shared file system", path=cfg.mount_point, unit=unit, fstype=fstype)
    clear_pending(name="Finish the client phase", paths=[managed.path for managed in files])
