"""`etcd restore`: the whole cluster rebuilt from a snapshot, as the steps of
`day2.flows.ETCD_RESTORE` (the shell they run on each member is in `restore_commands`)."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from day2.etcd import common
from day2.etcd.common import (
    EtcdOperationError,
    EtcdRefused,
    command_token,
    each,
    members,
    require_data_disks,
    settings,
)
from day2.etcd.health import status
from day2.etcd.restore_commands import (
    RestorePaths,
    finish_restore_command,
    rollback_restore_command,
    stage_restore_command,
    swap_restore_command,
)
from day2.steps import run_flow
from inventory.model import LoadedCluster
from inventory.topology import ETCD_PEER_PORT, build_topology
from roles.etcd.files import WAIT_HEALTHY
from toolkit.remote import RemoteResult


@dataclass
class RestoreResult:
    snapshot: str
    members: list[str]
    seconds: float
    health: str
    stamp: str = ""


def _failures(results: dict[str, object]) -> dict[str, RemoteResult]:
    return {h: r for h, r in results.items() if not r.ok}  # type: ignore[union-attr,misc]


def _describe(failed: dict[str, RemoteResult]) -> str:
    return "; ".join(f"{h}: {r.tail()}" for h, r in failed.items())


API_SERVER_MANIFEST = "/etc/kubernetes/manifests/kube-apiserver.yaml"
API_SERVER_STATE = (
    f"if test -e {API_SERVER_MANIFEST}; then echo manifest; fi; "
    "if pgrep -x kube-apiserver >/dev/null; then echo running; fi; echo checked"
)


def require_api_servers_stopped(loaded: LoadedCluster) -> None:
    """EtcdRefused while a kube-apiserver runs on a control-plane node, or would be started by
    kubelet (its static pod manifest is in place), or a node cannot be asked. An API server
    writes to the restored cluster as soon as it is healthy: should the restore then roll back
    (a member that does not come up), the old data would come back and those writes would be
    lost without a word. kubeadm's restore procedure stops them first too."""
    nodes = loaded.cluster.in_group("control_plane")
    answers = each(nodes, lambda h: common.run_remote(loaded, h, API_SERVER_STATE, timeout=30))
    for host in nodes:
        answer: RemoteResult = answers[host]  # type: ignore[assignment]
        said = answer.stdout.split()
        if not answer.ok or "checked" not in said:
            reason = (answer.stderr.strip().splitlines() or ["no answer"])[-1]
            raise EtcdRefused(
                f"{host}: cannot tell whether kube-apiserver runs there ({reason}); refusing to "
                "restore while an API server may write to etcd; nothing was changed"
            )
        if "manifest" in said or "running" in said:
            what = "runs" if "running" in said else "is set to run"
            raise EtcdRefused(
                f"{host}: kube-apiserver {what} (static pod {API_SERVER_MANIFEST}): writes it "
                "makes to the restored cluster would be lost if the restore rolled back; move "
                "that manifest out of /etc/kubernetes/manifests on every control-plane node, "
                "wait for kube-apiserver to stop, restore, then put it back; nothing was changed"
            )


def _start_all(loaded: LoadedCluster, hosts: list[str], timeout_s: int) -> dict[str, RemoteResult]:
    """Start every member at once (a bootstrap needs its quorum up together), then wait; the
    members that did not start or become healthy, with what they said."""
    started = each(
        hosts,
        lambda h: common.run_remote(
            loaded,
            h,
            # One retry: a start can fail to spawn once under load (systemd: "Failed to spawn
            # executor"), while a member that really cannot start fails both.
            f"{{ systemctl start etcd || {{ sleep 3; systemctl start etcd; }}; }} && "
            f"{WAIT_HEALTHY} {timeout_s}",
            timeout=timeout_s + 60,
        ),
    )
    return _failures(started)


@dataclass
class RestoreRun:
    """One `etcd restore`: the snapshot, the members and where each works."""

    loaded: LoadedCluster
    snapshot_path: Path
    stamp: str
    hosts: list[str] = field(default_factory=list)
    paths: dict[str, RestorePaths] = field(default_factory=dict)

    def on_all(self, command_of: Callable[[str], str], timeout: float = 600):
        """The same kind of command on every member at once: the members where it failed."""
        return _failures(
            each(
                self.hosts,
                lambda h: common.run_remote(self.loaded, h, command_of(h), timeout=timeout),
            )
        )

    def discard_staging(self) -> None:
        self.on_all(
            lambda h: (
                f"rm -rf {shlex.quote(self.paths[h].staging)} {shlex.quote(self.paths[h].snapshot)}"
            )
        )

    @property
    def timeout_s(self) -> int:
        return settings(self.loaded, self.hosts[0]).health_timeout_s


def restore(
    loaded: LoadedCluster,
    snapshot_path: Path,
    *,
    stamp: str | None = None,
    skip: Iterable[str] = (),
    only: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> RestoreResult:
    """Rebuild the whole cluster from a snapshot, never leaving a member without its data (the
    steps of `day2.flows.ETCD_RESTORE`):

    1. copy the snapshot to every member and stage its restore into a new data directory on
       EVERY member while etcd still runs; any failure: staging removed, nothing else changed;
    2. only when all are staged: stop every member, swap on each (old data renamed, kept);
    3. start all together and wait for a healthy cluster; then delete the old data.
    A failed stop, swap or start rolls back: old data back in place, every member started.

    Refused (EtcdRefused) before anything is copied while a member's data disk is not mounted
    or a kube-apiserver runs or is set to run (asked again just before the members stop): a
    rollback must never drop writes the restored cluster took.
    """
    from day2.flows import ETCD_RESTORE

    started = time.monotonic()
    job = RestoreRun(loaded, snapshot_path, stamp or command_token())
    run_flow(ETCD_RESTORE, job, error=EtcdOperationError, skip=skip, only=only, progress=progress)
    return RestoreResult(
        str(snapshot_path), job.hosts, time.monotonic() - started, status(loaded).health, job.stamp
    )


def restore_preflight(job: RestoreRun) -> None:
    if not job.snapshot_path.is_file():
        raise EtcdRefused(f"{job.snapshot_path}: no such snapshot file")
    job.hosts = members(job.loaded)
    require_data_disks(job.loaded, job.hosts)
    require_api_servers_stopped(job.loaded)
    job.paths = {h: RestorePaths(settings(job.loaded, h).data_dir, job.stamp) for h in job.hosts}


def restore_copy(job: RestoreRun) -> None:
    data = job.snapshot_path.read_bytes()

    def copy(host: str) -> RemoteResult:
        target = shlex.quote(job.paths[host].snapshot)
        return common.run_remote(
            job.loaded, host, f"umask 077; cat > {target}", stdin=data, timeout=600
        )

    copied = _failures(each(job.hosts, copy))
    if copied:
        raise EtcdOperationError(f"could not copy the snapshot to {_describe(copied)}")


def restore_left_unchanged(job: RestoreRun) -> str:
    job.discard_staging()
    return "nothing was changed"


def restore_stage(job: RestoreRun) -> None:
    loaded = job.loaded
    topology = build_topology(loaded.cluster)

    def stage(host: str) -> str:
        address = str(loaded.cluster.hosts[host].address)
        return stage_restore_command(
            job.paths[host],
            name=loaded.cluster.etcd_member(host),
            initial_cluster=topology.etcd_initial_cluster,
            token=f"{loaded.cluster.name}-etcd",
            peer_url=f"https://{address}:{ETCD_PEER_PORT}",
        )

    staged = job.on_all(stage)
    if staged:
        raise EtcdOperationError(f"staging the restore failed on {_describe(staged)}")


def restore_left_unstaged(job: RestoreRun) -> str:
    job.discard_staging()
    return "nothing was stopped or changed on any member (staged copies removed)"


def restore_recheck(job: RestoreRun) -> None:
    require_api_servers_stopped(job.loaded)  # again, now that the staging took its time


def restore_left_unstaged_quietly(job: RestoreRun) -> str:
    job.discard_staging()
    return ""  # the refusal says already that nothing was changed


def restore_stop(job: RestoreRun) -> None:
    stopped = job.on_all(lambda h: "systemctl stop etcd", timeout=120)
    if stopped:
        raise EtcdOperationError(f"restore failed, could not stop etcd on {_describe(stopped)}")


def restore_swap(job: RestoreRun) -> None:
    swapped = job.on_all(lambda h: swap_restore_command(job.paths[h]))
    if swapped:
        raise EtcdOperationError(f"restore failed, the swap failed on {_describe(swapped)}")


def restore_start(job: RestoreRun) -> None:
    unhealthy = _start_all(job.loaded, job.hosts, job.timeout_s)
    if unhealthy:
        raise EtcdOperationError(
            "restore failed, the restored cluster did not become healthy: " + _describe(unhealthy)
        )


def restore_roll_back(job: RestoreRun) -> str:
    """Every member stopped, its old data back where the swap happened, every member started
    again; what came of it."""
    stopped = job.on_all(lambda h: "systemctl stop etcd", timeout=120)
    reverted = job.on_all(lambda h: rollback_restore_command(job.paths[h]))
    not_back = _start_all(job.loaded, job.hosts, job.timeout_s)
    job.on_all(lambda h: f"rm -f {shlex.quote(job.paths[h].snapshot)}")
    if reverted:
        kept = job.paths[next(iter(reverted))].kept
        return f"the rollback failed on {_describe(reverted)} (old data left at {kept} there)"
    if stopped or not_back:
        return (
            "rolled back: every member's old data is back in place, but the cluster is NOT "
            f"healthy: {_describe({**stopped, **not_back})}"
        )
    return "rolled back: every member's old data is back in place, cluster healthy"


def restore_clean_up(job: RestoreRun) -> None:
    job.on_all(lambda h: finish_restore_command(job.paths[h]))
