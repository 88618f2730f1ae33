"""Files of the shared_fs role: ceph.conf and keyrings on the storage hosts, and on every worker
the client settings and the systemd mount unit of the shared file system."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

from roles.shared_fs.config import SharedFsConfig
from roles.shared_fs.role import DAEMON_PORTS, MON_PORT, MSGR2_PORT
from roles.shared_fs.secrets import cephx_key, fsid, osd_uuid
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

ROLE = "shared_fs"
STORAGE_GROUP = "storage"
CLIENT_GROUPS = ("gpu_worker", "cpu_worker")
CEPH_DIR = "/etc/ceph"
CEPH_CONF = f"{CEPH_DIR}/ceph.conf"
ADMIN_KEYRING = f"{CEPH_DIR}/ceph.client.admin.keyring"
# mon. and client.admin with their caps: what `ceph-mon --mkfs` seeds a new monitor with.
MON_KEYRING = f"{CEPH_DIR}/gpuinfra-mon.keyring"
# This host's mgr, MDS and OSD entities with their caps, for `ceph auth import`.
DAEMONS_KEYRING = f"{CEPH_DIR}/gpuinfra-daemons.keyring"
OSD_DROP_IN = "/etc/systemd/system/ceph-osd@.service.d/gpuinfra-device.conf"
# The file system's root, mounted with client.admin on the storage hosts: where the
# directories' owners, modes and quotas are set (the workers' key may not set quotas).
ADMIN_MOUNT = "/var/lib/gpuinfra/shared_fs_root"
BEEGFS_CONF = "/etc/beegfs/beegfs-client.conf"

MON_CAPS = (("mon", "allow *"),)
ADMIN_CAPS = (("mds", "allow *"), ("mgr", "allow *"), ("mon", "allow *"), ("osd", "allow *"))
MGR_CAPS = (("mds", "allow *"), ("mon", "allow profile mgr"), ("osd", "allow *"))
MDS_CAPS = (
    ("mds", "allow"),
    ("mgr", "allow profile mds"),
    ("mon", "allow profile mds"),
    ("osd", "allow rwx"),
)
OSD_CAPS = (("mgr", "allow profile osd"), ("mon", "allow profile osd"), ("osd", "allow *"))


@dataclass(frozen=True)
class Entity:
    name: str
    key: str
    caps: tuple[tuple[str, str], ...] = ()


def storage_hosts(ctx: HostContext) -> list[str]:
    """The storage hosts in inventory order: the first bootstraps the file system."""
    return [name for name, host in ctx.cluster.hosts.items() if STORAGE_GROUP in host.groups]


def is_first_storage_host(ctx: HostContext) -> bool:
    hosts = storage_hosts(ctx)
    return bool(hosts) and hosts[0] == ctx.name


def osd_id(ctx: HostContext, name: str | None = None) -> int:
    """A storage host's OSD id: its place among the storage hosts (new hosts go at the end)."""
    return storage_hosts(ctx).index(name or ctx.name)


def client_caps(cfg: SharedFsConfig) -> tuple[tuple[str, str], ...]:
    """The caps `ceph fs authorize FS client.NAME PATH rw` gives (reef), sorted as Ceph lists
    them: apply imports the key with these and then asks `fs authorize`, which fails unless
    the caps are exactly its own."""
    path = "" if cfg.client_path == "/" else f" path={cfg.client_path}"
    return (
        ("mds", f"allow rw fsname={cfg.fs_name}{path}"),
        ("mon", f"allow r fsname={cfg.fs_name}"),
        ("osd", f"allow rw tag cephfs data={cfg.fs_name}"),
    )


def key(ctx: HostContext, entity: str) -> str:
    return cephx_key(ctx.loaded.state_dir, entity, ctx.loaded.state_access)


def keyring(entities: list[Entity]) -> str:
    return render_template("shared_fs/keyring.j2", entities=entities)


def mon_addresses(ctx: HostContext) -> list[str]:
    """Each monitor with both protocols (msgr2 on 3300, the legacy one on 6789)."""
    return [
        f"[v2:{ctx.cluster.hosts[name].address}:{MSGR2_PORT},"
        f"v1:{ctx.cluster.hosts[name].address}:{MON_PORT}]"
        for name in storage_hosts(ctx)
    ]


def ceph_conf(ctx: HostContext, server: bool) -> ManagedFile:
    cfg = ctx.config(SharedFsConfig)
    content = render_template(
        "shared_fs/ceph.conf.j2",
        cfg=cfg,
        server=server,
        fsid=fsid(ctx.loaded.state_dir, ctx.loaded.state_access),
        mon_hosts=mon_addresses(ctx),
        mon_names=storage_hosts(ctx),
        public_network=str(ctx.cluster.networks.node),
        port_min=DAEMON_PORTS.start,
        port_max=DAEMON_PORTS.stop - 1,
    )
    return ManagedFile(ROLE, CEPH_CONF, content)


def osd_dir(osd: int) -> str:
    return f"/var/lib/ceph/osd/ceph-{osd}"


def daemon_keyring_path(kind: str, ident: str) -> str:
    return f"/var/lib/ceph/{kind}/ceph-{ident}/keyring"


def host_entities(ctx: HostContext) -> list[Entity]:
    """This storage host's daemons: its mgr, MDS and OSD."""
    osd = osd_id(ctx)
    return [
        Entity(f"mgr.{ctx.name}", key(ctx, f"mgr.{ctx.name}"), MGR_CAPS),
        Entity(f"mds.{ctx.name}", key(ctx, f"mds.{ctx.name}"), MDS_CAPS),
        Entity(f"osd.{osd}", key(ctx, f"osd.{osd}"), OSD_CAPS),
    ]


def client_entity(ctx: HostContext) -> Entity:
    cfg = ctx.config(SharedFsConfig)
    name = f"client.{cfg.client_name}"
    return Entity(name, key(ctx, name), client_caps(cfg))


def storage_files(ctx: HostContext) -> list[ManagedFile]:
    """ceph.conf, the admin and monitor keyrings, each daemon's keyring and the OSD drop-in."""
    if ctx.config(SharedFsConfig).existing is not None:
        return []
    admin = Entity("client.admin", key(ctx, "client.admin"), ADMIN_CAPS)
    mon = Entity("mon.", key(ctx, "mon."), MON_CAPS)
    mgr, mds, osd = host_entities(ctx)
    client = client_entity(ctx)
    secret = {"mode": "0600", "secret": True}
    ceph = {"user": "ceph", "group": "ceph"}
    files = [
        ceph_conf(ctx, server=True),
        ManagedFile(ROLE, ADMIN_KEYRING, keyring([admin]), **secret),
        ManagedFile(ROLE, MON_KEYRING, keyring([mon, admin]), **secret, **ceph),
        # The client's entity is imported from the first host; on the others it is unused.
        ManagedFile(ROLE, DAEMONS_KEYRING, keyring([mgr, mds, osd, client]), **secret),
        ManagedFile(ROLE, daemon_keyring_path("mgr", ctx.name), keyring([mgr]), **secret, **ceph),
        ManagedFile(ROLE, daemon_keyring_path("mds", ctx.name), keyring([mds]), **secret, **ceph),
        ManagedFile(
            ROLE, daemon_keyring_path("osd", str(osd_id(ctx))), keyring([osd]), **secret, **ceph
        ),
        ManagedFile(ROLE, OSD_DROP_IN, render_template("shared_fs/osd-device.conf.j2")),
        admin_mount_unit(),
    ]
    return files


def storage_osd_uuid(ctx: HostContext) -> str:
    return osd_uuid(ctx.loaded.state_dir, osd_id(ctx), ctx.loaded.state_access)


# systemd-escape --path: what a mount unit's name must be for its Where=.
_UNESCAPED = set(string.ascii_letters + string.digits + ":_.")


def mount_unit_name(path: str) -> str:
    parts = [part for part in path.split("/") if part]
    escaped = []
    for part in parts:
        chars = [c if c in _UNESCAPED else f"\\x{ord(c):02x}" for c in part]
        if chars and chars[0] == ".":
            chars[0] = "\\x2e"
        escaped.append("".join(chars))
    return ("-".join(escaped) or "-") + ".mount"


def unit_path(path: str) -> str:
    return f"/etc/systemd/system/{mount_unit_name(path)}"


# Added to every shared mount: a network file system (ordered after the network, never before
# it), and a boot that goes on without it, so an unreachable storage cluster never stops a
# node from booting (the mount is then missing, which drift and verify report).
ALWAYS_OPTIONS = ("_netdev", "nofail")


@dataclass(frozen=True)
class MountSpec:
    kind: str  # cephfs-fuse, cephfs, nfs, lustre, beegfs
    what: str
    type: str
    options: tuple[str, ...]
    after: tuple[str, ...] = ()


def fuse_mount(where: str, client: str, path: str, options: list[str], conf: str) -> MountSpec:
    """ceph-fuse through mount.fuse.ceph: the lab kernel has no CephFS client, so FUSE."""
    ceph = [f"ceph.id={client}", f"ceph.client_mountpoint={path}", f"ceph.conf={conf}"]
    return MountSpec("cephfs-fuse", "none", "fuse.ceph", tuple([*ceph, *options]))


def client_secret_path(client: str) -> str:
    return f"{CEPH_DIR}/{client}.secret"


def existing_mount(cfg: SharedFsConfig) -> MountSpec:
    """The site's own storage, mounted with its kernel client (or BeeGFS's)."""
    existing = cfg.existing
    assert existing is not None
    options = [*cfg.mount_options, *existing.options]
    if existing.type == "cephfs":
        ceph = [
            f"name={existing.client_name}",
            f"secretfile={client_secret_path(existing.client_name)}",
        ]
        if existing.fs_name:
            ceph.append(f"fs={existing.fs_name}")
        return MountSpec(
            "cephfs", f"{','.join(existing.servers)}:{existing.export}", "ceph", (*ceph, *options)
        )
    if existing.type == "nfs":
        # NFS 4.2 over TCP, hard (a training job waits out a server failover rather than seeing
        # I/O errors), several connections per mount for throughput (nconnect, Linux 5.3+).
        nfs = ["vers=4.2", "proto=tcp", "hard", "timeo=600", "nconnect=8"]
        return MountSpec("nfs", f"{existing.servers[0]}:{existing.export}", "nfs", (*nfs, *options))
    if existing.type == "lustre":
        # flock: coherent locks across clients (checkpoint writers rely on them).
        nids = ":".join(existing.servers)
        fs_name = existing.export.strip("/")
        return MountSpec("lustre", f"{nids}:/{fs_name}", "lustre", ("flock", *options))
    return MountSpec(
        "beegfs",
        "beegfs_nodev",
        "beegfs",
        (f"cfgFile={BEEGFS_CONF}", *options),
        after=("beegfs-helperd.service",),
    )


def mount_spec(ctx: HostContext) -> MountSpec:
    cfg = ctx.config(SharedFsConfig)
    if cfg.existing is not None:
        return existing_mount(cfg)
    return fuse_mount(
        cfg.mount_point, cfg.client_name, cfg.client_path, cfg.mount_options, CEPH_CONF
    )


def mount_unit(where: str, spec: MountSpec) -> ManagedFile:
    options = list(dict.fromkeys([*spec.options, *ALWAYS_OPTIONS]))
    content = render_template(
        "shared_fs/shared.mount.j2",
        kind=spec.kind,
        what=spec.what,
        where=where,
        type=spec.type,
        options=options,
        after=list(spec.after),
    )
    return ManagedFile(ROLE, unit_path(where), content)


def admin_mount_unit() -> ManagedFile:
    return mount_unit(ADMIN_MOUNT, fuse_mount(ADMIN_MOUNT, "admin", "/", ["noatime"], CEPH_CONF))


def has_storage(ctx: HostContext) -> bool:
    """Whether there is a file system for the workers: the cluster's own, or the site's."""
    return ctx.config(SharedFsConfig).existing is not None or bool(storage_hosts(ctx))


def client_files(ctx: HostContext) -> list[ManagedFile]:
    """The worker's client settings and mount unit; nothing where there is no storage."""
    if not has_storage(ctx):
        return []
    cfg = ctx.config(SharedFsConfig)
    files = [mount_unit(cfg.mount_point, mount_spec(ctx))]
    existing = cfg.existing
    if existing is None:
        client = client_entity(ctx)
        files += [
            ceph_conf(ctx, server=False),
            ManagedFile(
                ROLE,
                f"{CEPH_DIR}/ceph.{client.name}.keyring",
                keyring([Entity(client.name, client.key)]),
                mode="0600",
                secret=True,
            ),
        ]
    elif existing.type == "cephfs":
        assert existing.key_file is not None and existing.fsid is not None
        secret = ctx.loaded.resolve(Path(existing.key_file)).read_text().strip()
        conf = f"[global]\nfsid = {existing.fsid}\nmon_host = {', '.join(existing.servers)}\n"
        files += [
            ManagedFile(ROLE, CEPH_CONF, conf),
            ManagedFile(
                ROLE, client_secret_path(existing.client_name), secret + "\n", "0600", secret=True
            ),
        ]
    elif existing.type == "beegfs":
        files.append(ManagedFile(ROLE, BEEGFS_CONF, beegfs_client_conf(existing.servers[0])))
    return files


def beegfs_client_conf(management_host: str) -> str:
    """BeeGFS's client settings: the management host, and its default ports (BeeGFS 7)."""
    return (
        "# Managed by gpuinfra (shared_fs role): BeeGFS client settings from the inventory.\n"
        f"sysMgmtdHost = {management_host}\n"
        "connClientPortUDP = 8004\n"
        "connMgmtdPortTCP = 8008\n"
        "connMgmtdPortUDP = 8008\n"
    )


CLIENT_PACKAGES = {
    "cephfs-fuse": ["ceph-fuse", "ceph-common"],
    "cephfs": ["ceph-common"],
    "nfs": ["nfs-common"],
    # Lustre's and BeeGFS's clients are not in Debian: the site's own repository installs them.
    "lustre": [],
    "beegfs": [],
}
