"""What every day-2 etcd operation shares: how to reach a member's etcdctl, the members and
their settings, the errors, and the checks run before touching a member's data.

Every module of this package runs commands on a member through `common.run_remote`, never a
name of its own: one place to stand in for the members (the unit tests replace it there).
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from inventory.model import LoadedCluster
from roles.etcd.clusters import MAIN, EtcdCluster
from roles.etcd.config import EtcdConfig
from toolkit.remote import RemoteResult, run_remote
from toolkit.spec import host_config


def etcdctl_env(etcd: EtcdCluster) -> str:
    """The shell prefix that loads a cluster's etcdctl settings (the operator certificate)."""
    return f"set -a; . {etcd.etcdctl_env}; set +a;"


def local_endpoint(etcd: EtcdCluster) -> str:
    """etcdctl's arguments for the member on this host, with short timeouts."""
    return f"--endpoints={etcd.local_endpoint} --command-timeout=3s --dial-timeout=2s"


ENV = etcdctl_env(MAIN)
LOCAL = local_endpoint(MAIN)
# Snapshots on a member live under /var/tmp, one file per command (its stamp and a random
# token in the name): an `etcd snapshot` beside a restore, or two snapshots at once, never
# write or delete each other's file.
SNAPSHOT_DIR_ON_HOST = "/var/tmp"


class EtcdOperationError(RuntimeError):
    """A day-2 operation could not go on; the message says where and why."""


class EtcdRefused(EtcdOperationError):
    """Refused before anything changed (exit 2): the message names the host and what to do."""


def members(loaded: LoadedCluster, etcd: EtcdCluster = MAIN) -> list[str]:
    hosts = loaded.cluster.in_group("etcd")
    if not hosts:
        raise EtcdOperationError(f"{loaded.source}: no host in the etcd group")
    if etcd is not MAIN and not settings(loaded, hosts[0]).events.enabled:
        raise EtcdOperationError(f"{loaded.source}: etcd.events is off: no Events cluster")
    return hosts


def settings(loaded: LoadedCluster, host: str) -> EtcdConfig:
    return host_config(loaded, host, "etcd", EtcdConfig)


def each(hosts: Iterable[str], work: Callable[[str], object]) -> dict[str, object]:
    hosts = list(hosts)
    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        return dict(zip(hosts, pool.map(work, hosts), strict=True))


def json_or_none(text: str):
    start = text.find("[") if text.lstrip().startswith("[") else text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        return None


def command_token() -> str:
    """What makes one command's files its own: the time and a random part."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def stopped(etcd: EtcdCluster = MAIN) -> str:
    """Fail when the cluster's member on this host still runs. `! cmd` does not stop a
    `set -e` script: the check is spelled out."""
    unit = etcd.name
    return f'if systemctl is-active -q {unit}; then echo "{unit} is still running" >&2; exit 1; fi'


STOPPED = stopped(MAIN)


def data_disk(loaded: LoadedCluster, host: str) -> str | None:
    """The member's dedicated etcd data disk (`hosts.<host>.etcd.disk`); None: a directory."""
    entry = loaded.cluster.hosts[host].etcd
    return entry.disk if entry else None


def require_data_disks(loaded: LoadedCluster, hosts: list[str]) -> None:
    """EtcdRefused when a member's data disk is not mounted on its data directory: the data
    would be written to (or moved on) the root file system under the bare mount point."""
    with_disk = [h for h in hosts if data_disk(loaded, h)]

    def mounted(host: str) -> RemoteResult:
        data_dir = shlex.quote(settings(loaded, host).data_dir)
        return run_remote(loaded, host, f"mountpoint -q {data_dir}", timeout=30)

    answers = each(with_disk, mounted)
    for host in with_disk:
        if not answers[host].ok:  # type: ignore[union-attr]
            raise EtcdRefused(
                f"{host}: its etcd data disk {data_disk(loaded, host)} is not mounted on "
                f"{settings(loaded, host).data_dir}: mount it (systemctl start etcd-data) and "
                "run the command again; nothing was changed"
            )
