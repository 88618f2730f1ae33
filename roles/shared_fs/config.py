"""Defaults of the shared_fs role; group_vars/host vars under `shared_fs:` override them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inventory.grammar import DebianVersion, HealthCode, PlainPath, Uuid, Word

GiB = 2**30
MiB = 2**20
# A path inside the shared file system, as clients see it from its root.
_FS_PATH = re.compile(r"^/([A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*)?$")
_MODE = re.compile(r"^[0-7]{3,4}$")
# What a systemd mount unit's Options= accepts: no spaces, no quoting.
_OPTION = re.compile(r"^[A-Za-z0-9_.=:/,+-]+$")
# cephx entity names and file system names as Ceph accepts them.
_CEPH_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_fs_path(value: str) -> str:
    if not _FS_PATH.fullmatch(value) or "/../" in f"{value}/" or "/./" in f"{value}/":
        raise ValueError(f"{value!r} is not an absolute path inside the file system")
    return value


def check_options(value: list[str]) -> list[str]:
    for option in value:
        if not _OPTION.fullmatch(option) or "," in option:
            raise ValueError(f"mount option {option!r}: one option per item, no spaces")
    return value


class Directory(Strict):
    """A directory of the shared file system, made and kept with this owner, mode and quota."""

    path: str  # from the file system's root, e.g. /training/checkpoints
    # Numeric ids: the storage hosts that set them need no account of the training users, and
    # every worker maps them through its own (LDAP, sssd) user database.
    uid: int = Field(0, ge=0)
    gid: int = Field(0, ge=0)
    mode: str = "0755"
    # CephFS quota (the ceph.quota.max_bytes attribute, enforced by clients); none: unlimited.
    quota_bytes: int | None = Field(None, ge=MiB)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return check_fs_path(value)

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        if not _MODE.fullmatch(value):
            raise ValueError(f"mode {value!r} is not octal like 0755 or 1777")
        return value.zfill(4)


class ExistingStorage(Strict):
    """Client-only mode: the workers mount a file system the site already runs."""

    type: Literal["cephfs", "nfs", "lustre", "beegfs"]
    # cephfs: the cluster's monitors (address or address:port); nfs: the server; lustre: the
    # MGS NIDs (10.0.0.1@o2ib); beegfs: the management host.
    servers: list[Word] = Field(min_length=1)
    # cephfs and nfs: the exported path; lustre: the file system name; beegfs: unused.
    export: Word = "/"
    # Options added to the type's defaults (mount_options below applies too).
    options: list[Word] = Field(default_factory=list)
    # cephfs only: the cluster's fsid, the client's name, and a file on the controller that
    # holds its key (read at apply, copied 0600; never in the inventory itself).
    fsid: Uuid | None = None
    client_name: str = "training"
    key_file: str | None = None
    fs_name: str | None = None

    @field_validator("client_name", "fs_name")
    @classmethod
    def _ceph_name(cls, value: str | None) -> str | None:
        if value is not None and not _CEPH_NAME.fullmatch(value):
            raise ValueError(f"{value!r}: letters, digits, _ and - only")
        return value

    @field_validator("options")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        return check_options(value)

    @model_validator(mode="after")
    def _cephfs_needs(self) -> ExistingStorage:
        if self.type == "cephfs":
            missing = [key for key in ("fsid", "key_file") if getattr(self, key) is None]
            if missing:
                raise ValueError(f"type cephfs needs {', '.join(missing)}")
        return self


class SharedFsConfig(Strict):
    # Where every worker sees the shared file system: one path for datasets, checkpoints and
    # outputs on every node, so a job runs the same wherever it is scheduled.
    mount_point: str = "/shared"
    # noatime: training reads datasets over and over; an access-time update per read is a
    # metadata write to the MDS for nothing. _netdev and nofail are always added (see files.py).
    mount_options: list[Word] = Field(default_factory=lambda: ["noatime"])
    # None: a CephFS of this cluster's own storage hosts; set: mount the site's storage.
    existing: ExistingStorage | None = None
    # Debian 13's Ceph (reef), pinned as every package is; ceph-mon, -mgr, -mds, -osd, -fuse.
    ceph_version: DebianVersion = "18.2.7+ds-1+deb13u1"
    fs_name: str = "cephfs"
    # The workers' cephx identity, limited by `ceph fs authorize` to client_path (rw), so a
    # worker's key can neither read another file system nor change quotas or layouts.
    client_name: str = "training"
    client_path: str = "/"
    directories: list[Directory] = Field(default_factory=list)
    # The storage host's data disk for its OSD (host vars); formatted only when blank.
    osd_device: PlainPath | None = None
    # Three copies, writes accepted while two are up: one storage host down keeps the data
    # readable and writable (Ceph's own defaults for replicated pools).
    replicas: int = Field(3, ge=2)
    min_replicas: int = Field(2, ge=1)
    # Placement groups, fixed: the pg_autoscaler mgr module does not load on Debian 13's reef
    # (see muted_health_checks). ~100 PGs per OSD is Ceph's target; the metadata pool is small.
    metadata_pg_num: int = Field(16, ge=1)
    data_pg_num: int = Field(64, ge=1)
    # Ceph's defaults (4 GiB per OSD, 2 GiB per mon, 4 GiB of MDS cache); the lab lowers them.
    osd_memory_target: int = Field(4 * GiB, ge=896 * MiB)
    mon_memory_target: int = Field(2 * GiB, ge=256 * MiB)
    mds_cache_memory_limit: int = Field(4 * GiB, ge=128 * MiB)
    # Ceph warns below 30% free space on a mon's disk (mon_data_avail_warn).
    mon_data_avail_warn: int = Field(30, ge=1, le=99)
    # MGR_MODULE_DEPENDENCY: on Debian 13, reef's mgr modules that import python3-cryptography
    # fail ("PyO3 modules do not yet support subinterpreters", tracker.ceph.com/issues/64213);
    # the cluster serves without them (no volumes/pg_autoscaler module: pools are made here).
    muted_health_checks: list[HealthCode] = Field(default_factory=lambda: ["MGR_MODULE_DEPENDENCY"])
    # How long apply waits for HEALTH_OK after a change (peering, recovery of a small cluster).
    health_timeout_s: int = Field(300, ge=10)

    @field_validator("mount_point", "client_path")
    @classmethod
    def _paths(cls, value: str) -> str:
        return check_fs_path(value)

    @field_validator("mount_point")
    @classmethod
    def _unit_name(cls, value: str) -> str:
        # Its mount unit is named after it (systemd-escape --path); a "-" there becomes "\x2d",
        # and GNU sha1sum escapes such a name in its output, so no change of the unit would show.
        if not re.fullmatch(r"^[A-Za-z0-9_/]+$", value):
            raise ValueError(f"{value!r}: letters, digits, _ and / only (it names a mount unit)")
        return value

    @field_validator("mount_options")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        return check_options(value)

    @field_validator("fs_name", "client_name")
    @classmethod
    def _ceph_name(cls, value: str) -> str:
        if not _CEPH_NAME.fullmatch(value):
            raise ValueError(f"{value!r}: letters, digits, _ and - only")
        return value

    @model_validator(mode="after")
    def _replicas(self) -> SharedFsConfig:
        if self.min_replicas > self.replicas:
            raise ValueError("min_replicas is above replicas")
        if self.mount_point == "/":
            raise ValueError("mount_point cannot be /")
        return self
