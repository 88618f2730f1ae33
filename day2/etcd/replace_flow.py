"""`etcd replace`: a member replaced by a new one on the same host, as the steps of
`day2.flows.ETCD_REPLACE` (the shell they run on the member is in `replace_commands`)."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from day2.etcd import common
from day2.etcd.common import (
    EtcdOperationError,
    EtcdRefused,
    etcdctl_env,
    json_or_none,
    local_endpoint,
    members,
    require_data_disks,
    settings,
)
from day2.etcd.replace_commands import (
    join_command,
    put_back_command,
    set_aside_command,
    stop_member_command,
)
from day2.steps import run_flow
from inventory.model import LoadedCluster
from roles.etcd.clusters import MAIN, EtcdCluster
from roles.etcd.config import EtcdConfig
from roles.etcd.gate import GateResult, fio_command, judge


@dataclass
class ReplaceResult:
    member: str
    host: str
    old_id: str | None
    new_id: str | None
    gate: GateResult | None
    seconds: float


def _member_list(loaded: LoadedCluster, via: str, etcd: EtcdCluster = MAIN) -> list[dict]:
    listed = common.run_remote(loaded, via, f"{_etcdctl(etcd)} member list -w json", timeout=30)
    data = json_or_none(listed.stdout) if listed.ok else None
    if not data:
        raise EtcdOperationError(f"{via}: member list failed: {listed.stderr.strip()}")
    return data.get("members", [])


def _etcdctl(etcd: EtcdCluster) -> str:
    """etcdctl on a member's host, for its own member of `etcd`."""
    return f"{etcdctl_env(etcd)} etcdctl {local_endpoint(etcd)}"


@dataclass
class ReplaceRun:
    """One `etcd replace`: what it was asked, and what its steps learn on the way."""

    loaded: LoadedCluster
    host: str
    override_gate: bool
    discard_old_data: bool
    stamp: str
    etcd: EtcdCluster = MAIN  # the main cluster or the Events one (etcd.events)
    via: str = ""  # a healthy member that answers for the cluster
    name: str = ""
    peer_url: str = ""
    data_dir: str = ""
    kept: str = ""  # where the old data is set aside
    old_id: str | None = None  # the old member's id; None: not a member any more
    members: int = 0
    new_id: str | None = None
    gate: GateResult | None = None

    @property
    def cfg(self) -> EtcdConfig:
        return settings(self.loaded, self.host)

    @property
    def etcdctl(self) -> str:
        return _etcdctl(self.etcd)

    @property
    def unit(self) -> str:
        return self.etcd.name

    @property
    def membership(self) -> str:
        return f"still member {self.old_id} of the cluster" if self.old_id else "not a member"


def replace(
    loaded: LoadedCluster,
    host: str,
    *,
    override_gate: bool = False,
    discard_old_data: bool = False,
    stamp: str | None = None,
    etcd: EtcdCluster = MAIN,
    skip: Iterable[str] = (),
    only: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> ReplaceResult:
    """Replace a member with a new one on the same host (name, address and certificates kept)
    and an empty data directory, in the order etcd supports safely (the steps of
    `day2.flows.ETCD_REPLACE`):

    fence etcd there (it cannot be started until the new member is added) and stop it (its
    data is touched only once the stop succeeded), set its data aside (renamed, deleted only
    once the new member is a healthy voter), gate the disk, remove the old member (etcd
    refuses a second member with the same peer URL, so this must come first; the cluster
    shrinks and its quorum with it), add the new one as a learner (no vote: a new member that
    never catches up cannot cost the cluster its quorum), lift the fence and start it, promote
    it once it is in sync, and wait for a healthy cluster.

    `discard_old_data`: the old data is deleted (still only after the stop succeeded) instead of
    kept, for a data disk too full to hold it beside the new member's (a member that crashed on
    a full disk). A failure after that leaves the member fenced: it has no data to start with.

    Refused (EtcdRefused) before anything changes when its data disk is not mounted. Each
    failure names its step and says what state the member is in: running or stopped, fenced or
    not, still a member of the cluster or removed, its old data in place, kept aside or
    discarded; running `etcd replace` again finishes the job from any of them.

    A rebuilt host: run `gpuinfra apply --roles etcd --limit HOST` first; that installs etcd
    without starting it as a new cluster once this has run.

    `etcd=EVENTS` replaces the host's member of the Events cluster (etcd.events) the same
    way: its own unit, ports, member name and data directory; the main member is untouched. A
    failed host holds a member of each: replace the main one, then the Events one.
    """
    from day2.flows import ETCD_REPLACE

    started = time.monotonic()
    stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    job = ReplaceRun(loaded, host, override_gate, discard_old_data, stamp, etcd)
    run_flow(ETCD_REPLACE, job, error=EtcdOperationError, skip=skip, only=only, progress=progress)
    return ReplaceResult(
        job.name, host, job.old_id, job.new_id, job.gate, time.monotonic() - started
    )


_AGAIN = "run `gpuinfra etcd replace` again to finish"


def replace_preflight(job: ReplaceRun) -> None:
    loaded, host = job.loaded, job.host
    hosts = members(loaded, job.etcd)
    if host not in hosts:
        raise EtcdRefused(f"{host} is not an etcd member (members: {', '.join(hosts)})")
    others = [h for h in hosts if h != host]
    health = f"{job.etcdctl} endpoint health"
    healthy = [h for h in others if common.run_remote(loaded, h, health, timeout=20).ok]
    if len(healthy) < len(hosts) // 2 + 1:
        raise EtcdRefused(
            f"only {len(healthy)} other members are healthy: a replacement needs a quorum "
            f"({len(hosts) // 2 + 1}) without {host}; restore from a snapshot instead"
        )
    require_data_disks(loaded, [host])
    job.via, job.members = healthy[0], len(hosts)
    job.name = job.etcd.member_name(loaded, host)
    job.peer_url = job.etcd.peer_url(loaded, host)
    job.data_dir = job.etcd.data_dir(job.cfg)
    job.kept = f"{job.data_dir}/member.before-replace-{job.stamp}"
    old = next((m for m in _member_list(loaded, job.via, job.etcd)
                if m.get("name") == job.name or job.peer_url in m.get("peerURLs", [])),
               None)  # fmt: skip
    job.old_id = format(old["ID"], "x") if old else None


def replace_stop(job: ReplaceRun) -> None:
    stopped = common.run_remote(job.loaded, job.host, stop_member_command(job.etcd), timeout=120)
    if not stopped.ok:
        raise EtcdOperationError(f"{job.host}: could not stop {job.unit} ({stopped.tail()})")


def replace_left_unchanged(job: ReplaceRun) -> str:
    return "nothing was changed: its data and its membership are as they were (not fenced)"


def replace_set_aside(job: ReplaceRun) -> None:
    command = set_aside_command(job.data_dir, job.kept, discard=job.discard_old_data, etcd=job.etcd)
    aside = common.run_remote(job.loaded, job.host, command, timeout=120)
    if not aside.ok:
        raise EtcdOperationError(f"{job.host}: could not set the old data aside: {aside.tail()}")


def replace_left_set_aside(job: ReplaceRun) -> str:
    return (
        f"{job.unit} there is stopped and fenced, {job.membership}, its data untouched or at "
        f"{job.kept} (a discard may have deleted part of it); {_AGAIN}"
    )


def replace_gate(job: ReplaceRun) -> None:
    cfg = job.cfg
    gate_run = common.run_remote(job.loaded, job.host, fio_command(job.data_dir), timeout=600)
    job.gate = judge(
        job.host,
        job.data_dir,
        gate_run.stdout if gate_run.ok else gate_run.stderr,
        gate_run.ok,
        cfg.fsync_p99_max_ms,
        job.override_gate or cfg.disk_gate_override,
    )
    if job.gate.status in ("fail", "error"):
        raise EtcdOperationError(f"{job.host}: disk gate: {job.gate.detail}")


def replace_left_gate(job: ReplaceRun) -> str:
    return replace_left_as_is(job) + ": fix the disk or pass --override-gate"


def replace_remove(job: ReplaceRun) -> None:
    if job.old_id is None:
        return  # removed by an earlier run that stopped after it
    command = f"{job.etcdctl} member remove {job.old_id}"
    removed = common.run_remote(job.loaded, job.via, command, timeout=30)
    if not removed.ok:
        raise EtcdOperationError(f"{job.via}: member remove failed: {removed.tail()}")


def replace_left_as_is(job: ReplaceRun) -> str:
    """The member's state when the replace stops before the old member is removed: its old
    data put back and the fence lifted where there is data, else fenced, as it is."""
    host, unit = job.host, job.unit
    if job.discard_old_data:
        return (
            f"{unit} on {host} is stopped and fenced (it cannot start), {job.membership}, its "
            f"old data DISCARDED: it must not start under its old identity; run `gpuinfra etcd "
            f"replace {host} --discard-old-data` again to finish"
        )
    back = common.run_remote(
        job.loaded, host, put_back_command(job.data_dir, job.kept, job.etcd), timeout=120
    )
    if back.ok:
        return (
            f"{unit} on {host} is stopped, not fenced, {job.membership}, its old data back in "
            f"place (`systemctl start {unit}` there brings it back as it was)"
        )
    return (
        f"{unit} on {host} is stopped and fenced (it cannot start), {job.membership}, its old "
        f"data NOT put back ({back.tail()}), kept at {job.kept}; run `gpuinfra etcd replace` "
        "again"
    )


def replace_add(job: ReplaceRun) -> None:
    command = f"{job.etcdctl} member add {job.name} --learner --peer-urls={job.peer_url} -w json"
    added = common.run_remote(job.loaded, job.via, command, timeout=30)
    learner = (json_or_none(added.stdout) or {}).get("member") if added.ok else None
    if not learner:
        raise EtcdOperationError(f"{job.via}: member add failed: {added.tail()}")
    job.new_id = format(learner["ID"], "x")


def replace_left_removed(job: ReplaceRun) -> str:
    old_data = (
        "its old data DISCARDED"
        if job.discard_old_data
        else f"its old data kept at {job.host}:{job.kept}"
    )
    if job.old_id:
        state = (
            f"{job.unit} on {job.host} is stopped and fenced, member {job.old_id} removed (the "
            f"cluster has {job.members - 1} members), {old_data}"
        )
    else:
        state = f"{job.unit} on {job.host} is stopped and fenced, not a member, {old_data}"
    return f"{state}; {_AGAIN}"


def replace_start(job: ReplaceRun) -> None:
    timeout_s = job.cfg.health_timeout_s
    joined = common.run_remote(
        job.loaded, job.host, join_command(job.etcd), timeout=timeout_s + 120
    )
    if not joined.ok:
        raise EtcdOperationError(
            f"{job.host}: the new member (learner {job.new_id}) did not start: {joined.tail()}"
        )


def replace_left_behind(job: ReplaceRun) -> str:
    if job.discard_old_data:
        return "the old member's data was discarded"
    return f"the old member's data is kept at {job.host}:{job.kept}"


def replace_left_learner(job: ReplaceRun) -> str:
    return "it has no vote, the cluster's quorum is unchanged; " + replace_left_behind(job)


def replace_promote(job: ReplaceRun) -> None:
    """Promote the learner to a voter; etcd refuses until the learner has caught up with the
    leader's log, so this asks again until it agrees or the time is up."""
    timeout_s = job.cfg.health_timeout_s
    deadline = time.monotonic() + timeout_s
    command = f"{job.etcdctl} member promote {job.new_id}"
    while True:
        promoted = common.run_remote(job.loaded, job.via, command, timeout=30)
        if promoted.ok:
            return
        if time.monotonic() > deadline:
            raise EtcdOperationError(
                f"{job.via}: learner {job.new_id} not promoted after {timeout_s}s: "
                f"{promoted.stderr.strip()[-300:]}"
            )
        time.sleep(2)


def replace_wait(job: ReplaceRun) -> None:
    timeout_s = job.cfg.health_timeout_s
    healthy = common.run_remote(
        job.loaded, job.host, f"{job.etcd.wait_healthy} {timeout_s}", timeout=timeout_s + 60
    )
    if not healthy.ok:
        raise EtcdOperationError(
            f"{job.host}: member {job.new_id} promoted but the cluster is not healthy: "
            f"{healthy.stderr.strip()[-300:]}"
        )


def replace_clean_up(job: ReplaceRun) -> None:
    common.run_remote(job.loaded, job.host, f"rm -rf {shlex.quote(job.kept)}", timeout=120)
