"""Defaults of the etcd role; inventory group_vars/host vars under `etcd:` override them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inventory.grammar import CalendarEvent, Duration, PlainPath, Sha256, Url
from inventory.sizing import cluster_sizing, explicit_or

if TYPE_CHECKING:
    from inventory.model import Cluster

GIB = 2**30


class EventsCluster(BaseModel):
    """The Events cluster: a second etcd on the same hosts that stores only Kubernetes Events."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Off by default: a small cluster gains nothing from five more etcd processes. On, the API
    # servers keep Events there (kube-apiserver --etcd-servers-overrides): OpenAI's 7,500-node
    # design does, so the churn of a large fleet's Events never slows the main store's writes,
    # compactions or defragmentation (https://openai.com/index/scaling-kubernetes-to-7500-nodes/).
    # One value for every member: the kubernetes role reads it from the first.
    enabled: bool = False


class EtcdConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Where etcd comes from: the upstream release (checksum-pinned), a mirror of it, or the
    # distribution's package (Debian 13 ships etcd-server 3.5.16; the lab uses it).
    source: Literal["upstream", "mirror", "distribution"] = "upstream"
    # Base URL holding etcd-v<version>-linux-<arch>.tar.gz, for source: mirror.
    mirror_url: Url | None = None
    # SHA-256 of the release tarball for a version the pinned table does not hold.
    sha256: Sha256 | None = None
    # Data directory: the mount point of etcd.disk, mode 0700 (etcd refuses looser modes).
    data_dir: PlainPath = "/var/lib/etcd"
    # ext4 is what etcd's own benchmarks and most operators run; fsync behaviour is well known.
    filesystem: Literal["ext4", "xfs"] = "ext4"
    # None: derived from the Kubernetes node count (inventory/sizing.py), 2 MiB a node between
    # etcd's 2 GiB default and its advised 8 GiB maximum (OpenAI hit 2 GiB past 1,000 nodes).
    # Set it above the database's size before a smaller derived quota would raise NOSPACE.
    quota_backend_bytes: int | None = Field(None, ge=GIB, le=8 * GIB)
    # Keep 8 h of history (Kubespray's default); the API server compacts too, this is a floor.
    auto_compaction_mode: Literal["periodic", "revision"] = "periodic"
    auto_compaction_retention: Duration = "8h"
    # 250/2500 ms instead of 100/1000: tolerates a slow fsync or GC pause without an election,
    # while a dead leader is still replaced within seconds (etcd tuning guide: election ~10x).
    heartbeat_interval_ms: int = Field(250, ge=10)
    election_timeout_ms: int = Field(2500, ge=100)
    # Raft snapshot every 10,000 applied entries (3.5's 100,000 keeps too much in memory).
    snapshot_count: int = 10000
    # The disk gate: etcd wants WAL fsync p99 under 10 ms (etcd hardware guide, fio test).
    fsync_p99_max_ms: float = Field(10.0, gt=0)
    # Run etcd on a disk that failed the gate anyway; recorded in the run report.
    disk_gate_override: bool = False
    # Leaf certificates for a year (like kubeadm's); the CA for ten.
    cert_days: int = Field(365, ge=1)
    ca_days: int = Field(3650, ge=1)
    # Renew a leaf on apply when fewer days than this are left: a month leaves a missed monthly
    # apply (or a failed one) time to be noticed and rerun before anything expires, and it is
    # the window in which `etcd certs` already warns. Members restart one at a time for it.
    cert_renew_days: int = Field(30, ge=1)
    # Backups: a snapshot every hour kept for a day, on the member's root disk.
    backup_dir: PlainPath = "/var/backups/etcd"
    backup_schedule: CalendarEvent = "hourly"
    backup_keep: int = Field(24, ge=1)
    # Seconds a restarted member and the cluster get to become healthy before the roll stops.
    health_timeout_s: int = Field(120, ge=5)
    # Kubernetes Events in their own cluster on these hosts (ports, names, data: clusters.py).
    # It shares every setting above: its data directory is `events` below data_dir (the same
    # local disk, whose fsync the gate measured) and its snapshots go to backup_dir/events.
    events: EventsCluster = Field(default_factory=EventsCluster)

    @model_validator(mode="after")
    def _mirror_needs_url(self) -> EtcdConfig:
        if self.source == "mirror" and not self.mirror_url:
            raise ValueError("source: mirror needs mirror_url")
        if self.election_timeout_ms < 5 * self.heartbeat_interval_ms:
            raise ValueError("election_timeout_ms must be at least 5x heartbeat_interval_ms")
        if self.cert_days <= self.cert_renew_days:
            # Otherwise every apply would renew every certificate and restart every member.
            raise ValueError("cert_days must be greater than cert_renew_days")
        return self


def quota_backend_bytes(cfg: EtcdConfig, cluster: Cluster) -> int:
    """The inventory's quota, or the one the fleet's object volume needs (inventory/sizing.py)."""
    return explicit_or(cfg.quota_backend_bytes, cluster_sizing(cluster).etcd_quota_backend_bytes)
