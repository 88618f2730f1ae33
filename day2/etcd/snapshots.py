"""`etcd snapshot`: a snapshot taken on a healthy member and copied to the controller."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from day2.etcd import common
from day2.etcd.common import (
    SNAPSHOT_DIR_ON_HOST,
    EtcdOperationError,
    command_token,
    etcdctl_env,
    json_or_none,
    local_endpoint,
    members,
)
from inventory.model import LoadedCluster
from roles.etcd.clusters import MAIN, EtcdCluster


def snapshot_local(etcd: EtcdCluster) -> str:
    """A snapshot streams the whole database (up to the 8 GiB quota) inside one etcdctl
    command: LOCAL's 3 s timed out at 176 MiB in the lab."""
    return f"--endpoints={etcd.local_endpoint} --command-timeout=15m"


@dataclass
class SnapshotResult:
    member: str
    path: str
    size: int
    revision: int | None
    keys: int | None
    seconds: float


def _healthy_member(loaded: LoadedCluster, etcd: EtcdCluster) -> str:
    health = f"{etcdctl_env(etcd)} etcdctl {local_endpoint(etcd)} endpoint health"
    for host in members(loaded, etcd):
        if common.run_remote(loaded, host, health, timeout=20).ok:
            return host
    raise EtcdOperationError("no etcd member answers a health check: nothing to take it from")


def private_file(path: Path) -> int:
    """A new file, 0600 from its creation (never widened, whatever the umask; never an existing
    file or a symlink's target): the descriptor, open for writing."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def snapshot(loaded: LoadedCluster, out: Path, etcd: EtcdCluster = MAIN) -> SnapshotResult:
    """A snapshot from a healthy member (of the Events cluster with `etcd=EVENTS`), copied to
    the controller: written 0600 from its creation into a new file beside `out`, then renamed
    over it."""
    started = time.monotonic()
    host = _healthy_member(loaded, etcd)
    token = command_token()
    on_host = f"{SNAPSHOT_DIR_ON_HOST}/gpuinfra-etcd-snapshot-{token}.db"
    taken = common.run_remote(
        loaded,
        host,
        f"{etcdctl_env(etcd)} umask 077; etcdctl {snapshot_local(etcd)} snapshot save {on_host} "
        ">/dev/null && "
        f"etcdutl snapshot status {on_host} -w json",
        timeout=1200,
    )
    if not taken.ok:
        common.run_remote(loaded, host, f"rm -f {on_host} {on_host}.part", timeout=60)
        raise EtcdOperationError(f"{host}: snapshot failed: {taken.stderr.strip()}")
    info = json_or_none(taken.stdout) or {}
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = out.with_name(f".{out.name}.{token}.partial")
    with os.fdopen(private_file(partial), "wb") as handle:
        copy = f"cat {on_host}; rc=$?; rm -f {on_host}; exit $rc"
        copied = common.run_remote(loaded, host, copy, timeout=600, stdout=handle)
    if not copied.ok:
        partial.unlink(missing_ok=True)
        raise EtcdOperationError(f"{host}: copying the snapshot failed: {copied.stderr}")
    partial.replace(out)
    return SnapshotResult(
        host,
        str(out),
        out.stat().st_size,
        info.get("revision"),
        info.get("totalKey"),
        time.monotonic() - started,
    )
