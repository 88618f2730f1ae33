"""Day-2 operations on a running etcd cluster: status, certificates, disk checks, snapshots,
restore, member replacement and certificate rotation.

They talk to members over SSH (host keys checked, as everywhere) and run etcdctl/etcdutl on
the members themselves with the operator certificate installed there: the firewall keeps the
client port closed to the controller, and no etcd key needs to be handed to the controller's
tools. Only one member is ever restarted at a time, except where the whole cluster is rebuilt
(restore), which starts every member together as a bootstrap does.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from day2.steps import run_flow
from engine.runner import Mode, RunOptions, run
from inventory.model import LoadedCluster
from inventory.topology import ETCD_CLIENT_PORT, ETCD_METRICS_PORT, ETCD_PEER_PORT, build_topology
from roles.etcd.config import EtcdConfig
from roles.etcd.files import INITIAL_STATE_ENV, WAIT_HEALTHY, cluster_settings
from roles.etcd.gate import GateResult, fio_command, judge
from roles.etcd.pki import CertExpiry, ensure_pki, expiry_report
from toolkit.remote import RemoteResult, run_remote
from toolkit.spec import host_config

ENV = "set -a; . /etc/etcd/etcdctl.env; set +a;"
LOCAL = f"--endpoints=https://127.0.0.1:{ETCD_CLIENT_PORT} --command-timeout=3s --dial-timeout=2s"
# Snapshots on a member live under /var/tmp, one file per command (its stamp and a random
# token in the name): an `etcd snapshot` beside a restore, or two snapshots at once, never
# write or delete each other's file.
SNAPSHOT_DIR_ON_HOST = "/var/tmp"
# A snapshot streams the whole database (up to the 8 GiB quota) inside one etcdctl command:
# LOCAL's 3 s timed out at 176 MiB in the lab.
SNAPSHOT_LOCAL = f"--endpoints=https://127.0.0.1:{ETCD_CLIENT_PORT} --command-timeout=15m"
# After a restore the revision jumps ahead so watchers (the API servers' caches) never see an
# older revision again; etcd's restore guide for Kubernetes.
BUMP_REVISION = 1_000_000_000


class EtcdOperationError(RuntimeError):
    """A day-2 operation could not go on; the message says where and why."""


class EtcdRefused(EtcdOperationError):
    """Refused before anything changed (exit 2): the message names the host and what to do."""


def members(loaded: LoadedCluster) -> list[str]:
    hosts = loaded.cluster.in_group("etcd")
    if not hosts:
        raise EtcdOperationError(f"{loaded.source}: no host in the etcd group")
    return hosts


def settings(loaded: LoadedCluster, host: str) -> EtcdConfig:
    return host_config(loaded, host, "etcd", EtcdConfig)


def each(hosts: Iterable[str], work: Callable[[str], object]) -> dict[str, object]:
    hosts = list(hosts)
    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        return dict(zip(hosts, pool.map(work, hosts), strict=True))


# ---------------------------------------------------------------- status


@dataclass
class MemberStatus:
    host: str
    name: str
    address: str
    state: str  # healthy, unhealthy, down (etcd not answering), unreachable (no ssh)
    leader: bool = False
    member_id: str | None = None
    version: str | None = None
    db_size: int | None = None
    db_size_in_use: int | None = None
    raft_term: int | None = None
    raft_index: int | None = None
    wal_fsync_p99_ms: float | None = None
    data_dir_free_bytes: int | None = None
    data_dir_size_bytes: int | None = None
    error: str | None = None


@dataclass
class ClusterStatus:
    cluster: str
    health: str  # healthy, degraded (a member down, quorum kept), lost (no quorum)
    quorum: int
    healthy_members: int
    leader: str | None
    quota_bytes: int
    members: list[MemberStatus] = field(default_factory=list)
    alarms: list[str] = field(default_factory=list)
    certificates: list[CertExpiry] = field(default_factory=list)


def wal_fsync_p99_ms(metrics: str) -> float | None:
    """p99 of etcd_disk_wal_fsync_duration_seconds from its cumulative histogram buckets: the
    upper bound of the bucket the 99th percentile falls in, in ms (Prometheus' histogram
    buckets give no finer answer without interpolation)."""
    buckets: list[tuple[float, float]] = []
    for line in metrics.splitlines():
        if line.startswith("etcd_disk_wal_fsync_duration_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            count = float(line.rsplit(" ", 1)[1])
            buckets.append((float("inf") if bound == "+Inf" else float(bound), count))
    if not buckets:
        return None
    buckets.sort()
    total = buckets[-1][1]
    if total == 0:
        return None
    for bound, count in buckets:
        if count >= 0.99 * total:
            return bound * 1000
    return None


# etcd preallocates each WAL segment at 64 MiB: with less free than that on its data disk a
# member cannot cut its next segment and stops (etcd's wal package, SegmentSizeBytes).
DISK_FULL_BYTES = 64 * 2**20


def status_script(data_dir: str) -> str:
    """What `status` reads on one member: etcd's own view, its metrics, its data disk's free
    space, and etcd's last error in the journal (why a member that stopped answering stopped)."""
    return f"""{ENV}
echo "== status"; etcdctl {LOCAL} endpoint status -w json 2>&1
echo "== health"; etcdctl {LOCAL} endpoint health -w json 2>&1
echo "== metrics"; curl -sf --max-time 3 http://127.0.0.1:{ETCD_METRICS_PORT}/metrics \
    | grep '^etcd_disk_wal_fsync_duration_seconds_bucket'
echo "== disk"; df -B1 --output=size,avail {shlex.quote(data_dir)} 2>/dev/null | tail -n 1
echo "== journal"; journalctl -u etcd -n 200 --no-pager -o cat 2>/dev/null \
    | grep -iE 'no space left|"level":"(error|fatal|panic)"' | tail -n 1
echo "== end"
"""


def _size_text(value: int) -> str:
    return f"{value / 2**20:.0f} MiB"


def _disk_problem(entry: MemberStatus, data_dir: str) -> str | None:
    if entry.data_dir_free_bytes is None or entry.data_dir_size_bytes is None:
        return None
    if entry.data_dir_free_bytes >= DISK_FULL_BYTES:
        return None
    return (
        f"data disk full: {_size_text(entry.data_dir_free_bytes)} free of "
        f"{_size_text(entry.data_dir_size_bytes)} at {data_dir} (etcd needs 64 MiB for its "
        "next WAL segment)"
    )


def _etcdctl_error(output: str) -> str:
    """etcdctl's own "Error: ..." line, else its last line that says anything."""
    lines = [line.strip() for line in output.splitlines() if line.strip() not in ("", "[]", "{}")]
    errors = [line for line in lines if line.startswith("Error")]
    return (errors or lines or ["not answering"])[-1]


def _journal_reason(line: str) -> str | None:
    """The message (and error) of etcd's last error line in the journal, short."""
    line = line.strip()
    if not line:
        return None
    record = _json_or_none(line)
    if isinstance(record, dict):
        text = record.get("msg", "")
        if record.get("error"):
            text += f": {record['error']}"
        return text[:300] or None
    return line[-300:]


def _sections(text: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            sections[current] = []
        elif current:
            sections[current].append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def _json_or_none(text: str):
    start = text.find("[") if text.lstrip().startswith("[") else text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        return None


def member_status(loaded: LoadedCluster, host: str) -> MemberStatus:
    cluster = loaded.cluster
    entry = MemberStatus(host, cluster.etcd_member(host), str(cluster.hosts[host].address), "down")
    data_dir = settings(loaded, host).data_dir
    remote = run_remote(loaded, host, status_script(data_dir), timeout=30)
    if "== end" not in remote.stdout:
        entry.state = "unreachable"
        entry.error = (remote.stderr.strip().splitlines() or ["ssh failed"])[-1]
        return entry
    sections = _sections(remote.stdout)
    status = _json_or_none(sections.get("status", ""))
    if status:
        body = status[0]["Status"]
        entry.member_id = format(body["header"]["member_id"], "x")
        entry.version = body.get("version")
        entry.db_size = body.get("dbSize")
        entry.db_size_in_use = body.get("dbSizeInUse")
        entry.raft_term = body.get("raftTerm")
        entry.raft_index = body.get("raftIndex")
        entry.leader = body.get("leader") == body["header"]["member_id"]
    health = _json_or_none(sections.get("health", ""))
    if health and health[0].get("health"):
        entry.state = "healthy"
    elif status:
        entry.state = "unhealthy"
        entry.error = (health[0].get("error") if health else None) or "no linearizable read"
    else:
        entry.error = _etcdctl_error(sections.get("status", ""))
    entry.wal_fsync_p99_ms = wal_fsync_p99_ms(sections.get("metrics", ""))
    disk = sections.get("disk", "").split()
    if len(disk) == 2 and all(part.isdigit() for part in disk):
        entry.data_dir_size_bytes, entry.data_dir_free_bytes = int(disk[0]), int(disk[1])
    full = _disk_problem(entry, data_dir)
    if entry.state != "healthy":
        # Why a member is not serving: its disk, else etcd's own last error.
        reasons = [full, _journal_reason(sections.get("journal", ""))]
        for reason in filter(None, reasons):
            entry.error = f"{entry.error}; {reason}" if entry.error else reason
    elif full:
        # Serving now, but it stops at its next WAL segment: not counted as healthy.
        entry.state = "unhealthy"
        entry.error = full
    return entry


def status(loaded: LoadedCluster) -> ClusterStatus:
    hosts = members(loaded)
    results = each(hosts, lambda h: member_status(loaded, h))
    entries = [results[h] for h in hosts]
    healthy = [m for m in entries if m.state == "healthy"]
    quorum = len(hosts) // 2 + 1
    if len(healthy) == len(hosts):
        health = "healthy"
    elif len(healthy) >= quorum:
        health = "degraded"
    else:
        health = "lost"
    leader = next((m.name for m in entries if m.leader and m.state == "healthy"), None)
    alarms: list[str] = []
    if healthy:
        answer = run_remote(
            loaded, healthy[0].host, f"{ENV} etcdctl {LOCAL} alarm list", timeout=20
        )
        alarms = [
            _name_alarm(line.strip(), entries)
            for line in answer.stdout.splitlines()
            if line.strip()
        ]
    return ClusterStatus(
        cluster=loaded.cluster.name,
        health=health,
        quorum=quorum,
        healthy_members=len(healthy),
        leader=leader,
        quota_bytes=settings(loaded, hosts[0]).quota_backend_bytes,
        members=entries,
        alarms=alarms,
        certificates=expiry_report(loaded) if (loaded.state_dir / "etcd-pki").exists() else [],
    )


def _name_alarm(line: str, entries: list[MemberStatus]) -> str:
    """`memberID:<decimal> alarm:NOSPACE` with the member's name added."""
    member_id = line.split("memberID:", 1)[1].split()[0] if "memberID:" in line else ""
    if member_id.isdigit():
        hex_id = format(int(member_id), "x")
        name = next((m.name for m in entries if m.member_id == hex_id), None)
        if name:
            return f"{line} ({name})"
    return line


# ---------------------------------------------------------------- disk check


def check_disk(loaded: LoadedCluster, limit_ms: float | None = None) -> list[GateResult]:
    """The disk gate's fio test on every member's data directory, now."""

    def check(host: str) -> GateResult:
        cfg = settings(loaded, host)
        limit = limit_ms if limit_ms is not None else cfg.fsync_p99_max_ms
        remote = run_remote(loaded, host, fio_command(cfg.data_dir), timeout=600)
        output = remote.stdout if remote.ok else (remote.stderr or remote.stdout)
        return judge(host, cfg.data_dir, output, remote.ok, limit, override=False)

    results = each(members(loaded), check)
    return [results[h] for h in members(loaded)]  # type: ignore[misc]


# ---------------------------------------------------------------- snapshot and restore


@dataclass
class SnapshotResult:
    member: str
    path: str
    size: int
    revision: int | None
    keys: int | None
    seconds: float


def _healthy_member(loaded: LoadedCluster) -> str:
    for host in members(loaded):
        if run_remote(loaded, host, f"{ENV} etcdctl {LOCAL} endpoint health", timeout=20).ok:
            return host
    raise EtcdOperationError("no etcd member answers a health check: nothing to take it from")


def command_token() -> str:
    """What makes one command's files its own: the time and a random part."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def private_file(path: Path) -> int:
    """A new file, 0600 from its creation (never widened, whatever the umask; never an existing
    file or a symlink's target): the descriptor, open for writing."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def snapshot(loaded: LoadedCluster, out: Path) -> SnapshotResult:
    """A snapshot from a healthy member, copied to the controller: written 0600 from its
    creation into a new file beside `out`, then renamed over it."""
    started = time.monotonic()
    host = _healthy_member(loaded)
    token = command_token()
    on_host = f"{SNAPSHOT_DIR_ON_HOST}/gpuinfra-etcd-snapshot-{token}.db"
    taken = run_remote(
        loaded,
        host,
        f"{ENV} umask 077; etcdctl {SNAPSHOT_LOCAL} snapshot save {on_host} >/dev/null && "
        f"etcdutl snapshot status {on_host} -w json",
        timeout=1200,
    )
    if not taken.ok:
        run_remote(loaded, host, f"rm -f {on_host} {on_host}.part", timeout=60)
        raise EtcdOperationError(f"{host}: snapshot failed: {taken.stderr.strip()}")
    info = _json_or_none(taken.stdout) or {}
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = out.with_name(f".{out.name}.{token}.partial")
    with os.fdopen(private_file(partial), "wb") as handle:
        copy = f"cat {on_host}; rc=$?; rm -f {on_host}; exit $rc"
        copied = run_remote(loaded, host, copy, timeout=600, stdout=handle)
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


@dataclass
class RestoreResult:
    snapshot: str
    members: list[str]
    seconds: float
    health: str
    stamp: str = ""


# `! cmd` does not stop a `set -e` script: spell the check out.
STOPPED = 'if systemctl is-active -q etcd; then echo "etcd is still running" >&2; exit 1; fi'


@dataclass(frozen=True)
class RestorePaths:
    """Where one member's restore works, all inside its data directory: on the same filesystem
    as `member/` (the data directory is usually the etcd.disk mount point), so each swap is an
    atomic rename and a mount point is never renamed. etcd ignores other names there."""

    data_dir: str
    stamp: str

    @property
    def snapshot(self) -> str:
        """This restore's own copy of the snapshot on the member (outside the data disk)."""
        return f"{SNAPSHOT_DIR_ON_HOST}/gpuinfra-etcd-restore-{self.stamp}.db"

    @property
    def member(self) -> str:
        return f"{self.data_dir}/member"

    @property
    def staging(self) -> str:
        """A complete new data directory: `etcdutl snapshot restore --data-dir` writes it."""
        return f"{self.data_dir}/restore-{self.stamp}"

    @property
    def kept(self) -> str:
        """The member's old data, renamed here by the swap and deleted only once the restored
        cluster is healthy."""
        return f"{self.data_dir}/member.before-restore-{self.stamp}"


def stage_restore_command(
    paths: RestorePaths, *, name: str, initial_cluster: str, token: str, peer_url: str
) -> str:
    """Unpack the snapshot into the staging directory; the running member is not touched."""
    staging = shlex.quote(paths.staging)
    return (
        f"set -e; rm -rf {staging}; "
        f"etcdutl snapshot restore {shlex.quote(paths.snapshot)} --name {shlex.quote(name)} "
        f"--initial-cluster {shlex.quote(initial_cluster)} "
        f"--initial-cluster-token {shlex.quote(token)} "
        f"--initial-advertise-peer-urls {shlex.quote(peer_url)} "
        f"--bump-revision {BUMP_REVISION} --mark-compacted --data-dir {staging} >/dev/null; "
        f"test -d {staging}/member; chown -R etcd:etcd {staging}"
    )


def swap_restore_command(paths: RestorePaths) -> str:
    """With etcd stopped: the old data aside (renamed, kept), the staged data in its place. The
    emptied staging directory stays as the sign that this member was swapped."""
    member, staging, kept = (shlex.quote(p) for p in (paths.member, paths.staging, paths.kept))
    return (
        f"set -e; test -d {staging}/member; {STOPPED}; "
        f"if test -d {member}; then mv {member} {kept}; fi; "
        f"mv {staging}/member {member}; rm -f {INITIAL_STATE_ENV}"
    )


def rollback_restore_command(paths: RestorePaths) -> str:
    """With etcd stopped: where the swap happened (the staging directory is there and empty)
    and old data was kept, drop the restored copy and put the old data back; a member that had
    no data before keeps the restored copy (there is nothing to go back to); a member never
    swapped is left alone. Then the staging directory goes. Safe on every member, and again."""
    member, staging, kept = (shlex.quote(p) for p in (paths.member, paths.staging, paths.kept))
    return (
        f"set -e; if test -d {staging} && ! test -e {staging}/member && test -d {kept}; then "
        f"{STOPPED}; rm -rf {member}; mv {kept} {member}; fi; "
        f"if test -d {kept} && ! test -e {member}; then mv {kept} {member}; fi; "
        f"rm -rf {staging}"
    )


def finish_restore_command(paths: RestorePaths) -> str:
    """Once the restored cluster is healthy: the old data and the leftovers go."""
    kept, staging, snapshot = (shlex.quote(p) for p in (paths.kept, paths.staging, paths.snapshot))
    return f"rm -rf {kept} {staging} {snapshot}"


def _failures(results: dict[str, object]) -> dict[str, RemoteResult]:
    return {h: r for h, r in results.items() if not r.ok}  # type: ignore[union-attr,misc]


def _describe(failed: dict[str, RemoteResult]) -> str:
    return "; ".join(f"{h}: {r.tail()}" for h, r in failed.items())


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
    answers = each(nodes, lambda h: run_remote(loaded, h, API_SERVER_STATE, timeout=30))
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
        lambda h: run_remote(
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
            each(self.hosts, lambda h: run_remote(self.loaded, h, command_of(h), timeout=timeout))
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
    run_flow(ETCD_RESTORE, job, error=EtcdOperationError, skip=skip, progress=progress)
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
        return run_remote(job.loaded, host, f"umask 077; cat > {target}", stdin=data, timeout=600)

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


# ---------------------------------------------------------------- replace


@dataclass
class ReplaceResult:
    member: str
    host: str
    old_id: str | None
    new_id: str | None
    gate: GateResult | None
    seconds: float


def _member_list(loaded: LoadedCluster, via: str) -> list[dict]:
    listed = run_remote(loaded, via, f"{ENV} etcdctl {LOCAL} member list -w json", timeout=30)
    data = _json_or_none(listed.stdout) if listed.ok else None
    if not data:
        raise EtcdOperationError(f"{via}: member list failed: {listed.stderr.strip()}")
    return data.get("members", [])


# While this drop-in exists, etcd on the member cannot start: `systemctl start` fails on the
# assertion (no restart loop, the journal names the file). `replace` puts it there before it
# stops etcd and removes it only in the command that starts the new member, after `member add`:
# in between, the member's data is set aside or gone, and an empty member started under its
# old identity (by a reboot, an apply's restart, an operator) would vote without the log it
# voted with, which can lose committed writes (etcd's runtime reconfiguration guide).
FENCE_DIR = "/etc/systemd/system/etcd.service.d"
FENCE = f"{FENCE_DIR}/gpuinfra-replace-fence.conf"
FENCE_TEXT = f"""# Written by `gpuinfra etcd replace`: this member's data is set aside or deleted
# and the new member is not added yet. It must not start under its old identity: run the
# replace again to finish it. Removed by the replace when it starts the new member.
[Unit]
AssertPathExists=!{FENCE}
"""


def fence_command() -> str:
    return (
        f"mkdir -p {FENCE_DIR} && printf %s {shlex.quote(FENCE_TEXT)} > {FENCE} && "
        "systemctl daemon-reload"
    )


def unfence_command() -> str:
    return f"rm -f {FENCE} && systemctl daemon-reload"


def stop_member_command() -> str:
    """Fence etcd (it cannot be started again), stop it and prove it stopped: the data is
    touched only after this succeeded. Any failure takes the fence away again: then nothing
    changed but, at most, etcd stopped."""
    return (
        f"{{ {fence_command()} && systemctl stop etcd && {{ {STOPPED}; }}; }} || "
        f"{{ rc=$?; {unfence_command()}; exit $rc; }}"
    )


def set_aside_command(data_dir: str, kept: str, *, discard: bool = False) -> str:
    """The member's old data renamed (not deleted), an empty data directory in its place; with
    `discard` (a disk too small to hold both) deleted instead. Either only with etcd stopped."""
    member, kept_q = shlex.quote(f"{data_dir}/member"), shlex.quote(kept)
    data = shlex.quote(data_dir)
    move = f"rm -rf {member}" if discard else f"mv {member} {kept_q}"
    return (
        f"set -e; {STOPPED}; if test -d {member}; then {move}; fi; "
        f"install -d -o etcd -g etcd -m 0700 {data}"
    )


def put_back_command(data_dir: str, kept: str) -> str:
    """Undo set_aside_command while the member is still in the cluster (the gate failed), and
    lift the fence: the member may start again with its own data. Fails, fence kept, where
    there is no old data to put back (discarded)."""
    member, kept_q = shlex.quote(f"{data_dir}/member"), shlex.quote(kept)
    return (
        f"set -e; if test -d {kept_q} && ! test -e {member}; then mv {kept_q} {member}; fi; "
        f"test -d {member}; {unfence_command()}"
    )


def join_command() -> str:
    """Lift the fence and start the new member (added already) as joining an existing cluster."""
    return (
        f"{unfence_command()} && "
        f"echo GPUINFRA_INITIAL_CLUSTER_STATE=existing > {INITIAL_STATE_ENV} && "
        f"systemctl start etcd; rc=$?; rm -f {INITIAL_STATE_ENV}; exit $rc"
    )


@dataclass
class ReplaceRun:
    """One `etcd replace`: what it was asked, and what its steps learn on the way."""

    loaded: LoadedCluster
    host: str
    override_gate: bool
    discard_old_data: bool
    stamp: str
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
    def membership(self) -> str:
        return f"still member {self.old_id} of the cluster" if self.old_id else "not a member"


def replace(
    loaded: LoadedCluster,
    host: str,
    *,
    override_gate: bool = False,
    discard_old_data: bool = False,
    stamp: str | None = None,
    skip: Iterable[str] = (),
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
    """
    from day2.flows import ETCD_REPLACE

    started = time.monotonic()
    stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    job = ReplaceRun(loaded, host, override_gate, discard_old_data, stamp)
    run_flow(ETCD_REPLACE, job, error=EtcdOperationError, skip=skip, progress=progress)
    return ReplaceResult(
        job.name, host, job.old_id, job.new_id, job.gate, time.monotonic() - started
    )


_AGAIN = "run `gpuinfra etcd replace` again to finish"


def replace_preflight(job: ReplaceRun) -> None:
    loaded, host = job.loaded, job.host
    hosts = members(loaded)
    if host not in hosts:
        raise EtcdRefused(f"{host} is not an etcd member (members: {', '.join(hosts)})")
    others = [h for h in hosts if h != host]
    health = f"{ENV} etcdctl {LOCAL} endpoint health"
    healthy = [h for h in others if run_remote(loaded, h, health, timeout=20).ok]
    if len(healthy) < len(hosts) // 2 + 1:
        raise EtcdRefused(
            f"only {len(healthy)} other members are healthy: a replacement needs a quorum "
            f"({len(hosts) // 2 + 1}) without {host}; restore from a snapshot instead"
        )
    require_data_disks(loaded, [host])
    job.via, job.members = healthy[0], len(hosts)
    job.name = loaded.cluster.etcd_member(host)
    job.peer_url = f"https://{loaded.cluster.hosts[host].address}:{ETCD_PEER_PORT}"
    job.data_dir = job.cfg.data_dir
    job.kept = f"{job.data_dir}/member.before-replace-{job.stamp}"
    old = next((m for m in _member_list(loaded, job.via)
                if m.get("name") == job.name or job.peer_url in m.get("peerURLs", [])),
               None)  # fmt: skip
    job.old_id = format(old["ID"], "x") if old else None


def replace_stop(job: ReplaceRun) -> None:
    stopped = run_remote(job.loaded, job.host, stop_member_command(), timeout=120)
    if not stopped.ok:
        raise EtcdOperationError(f"{job.host}: could not stop etcd ({stopped.tail()})")


def replace_left_unchanged(job: ReplaceRun) -> str:
    return "nothing was changed: its data and its membership are as they were (not fenced)"


def replace_set_aside(job: ReplaceRun) -> None:
    command = set_aside_command(job.data_dir, job.kept, discard=job.discard_old_data)
    aside = run_remote(job.loaded, job.host, command, timeout=120)
    if not aside.ok:
        raise EtcdOperationError(f"{job.host}: could not set the old data aside: {aside.tail()}")


def replace_left_set_aside(job: ReplaceRun) -> str:
    return (
        f"etcd there is stopped and fenced, {job.membership}, its data untouched or at "
        f"{job.kept} (a discard may have deleted part of it); {_AGAIN}"
    )


def replace_gate(job: ReplaceRun) -> None:
    cfg = job.cfg
    gate_run = run_remote(job.loaded, job.host, fio_command(job.data_dir), timeout=600)
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
    command = f"{ENV} etcdctl {LOCAL} member remove {job.old_id}"
    removed = run_remote(job.loaded, job.via, command, timeout=30)
    if not removed.ok:
        raise EtcdOperationError(f"{job.via}: member remove failed: {removed.tail()}")


def replace_left_as_is(job: ReplaceRun) -> str:
    """The member's state when the replace stops before the old member is removed: its old
    data put back and the fence lifted where there is data, else fenced, as it is."""
    host = job.host
    if job.discard_old_data:
        return (
            f"etcd on {host} is stopped and fenced (it cannot start), {job.membership}, its old "
            f"data DISCARDED: it must not start under its old identity; run `gpuinfra etcd "
            f"replace {host} --discard-old-data` again to finish"
        )
    back = run_remote(job.loaded, host, put_back_command(job.data_dir, job.kept), timeout=120)
    if back.ok:
        return (
            f"etcd on {host} is stopped, not fenced, {job.membership}, its old data back in "
            "place (`systemctl start etcd` there brings it back as it was)"
        )
    return (
        f"etcd on {host} is stopped and fenced (it cannot start), {job.membership}, its old "
        f"data NOT put back ({back.tail()}), kept at {job.kept}; run `gpuinfra etcd replace` "
        "again"
    )


def replace_add(job: ReplaceRun) -> None:
    command = (
        f"{ENV} etcdctl {LOCAL} member add {job.name} --learner --peer-urls={job.peer_url} -w json"
    )
    added = run_remote(job.loaded, job.via, command, timeout=30)
    learner = (_json_or_none(added.stdout) or {}).get("member") if added.ok else None
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
            f"etcd on {job.host} is stopped and fenced, member {job.old_id} removed (the "
            f"cluster has {job.members - 1} members), {old_data}"
        )
    else:
        state = f"etcd on {job.host} is stopped and fenced, not a member, {old_data}"
    return f"{state}; {_AGAIN}"


def replace_start(job: ReplaceRun) -> None:
    timeout_s = job.cfg.health_timeout_s
    joined = run_remote(job.loaded, job.host, join_command(), timeout=timeout_s + 120)
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
    command = f"{ENV} etcdctl {LOCAL} member promote {job.new_id}"
    while True:
        promoted = run_remote(job.loaded, job.via, command, timeout=30)
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
    healthy = run_remote(
        job.loaded, job.host, f"{WAIT_HEALTHY} {timeout_s}", timeout=timeout_s + 60
    )
    if not healthy.ok:
        raise EtcdOperationError(
            f"{job.host}: member {job.new_id} promoted but the cluster is not healthy: "
            f"{healthy.stderr.strip()[-300:]}"
        )


def replace_clean_up(job: ReplaceRun) -> None:
    run_remote(job.loaded, job.host, f"rm -rf {shlex.quote(job.kept)}", timeout=120)


# ---------------------------------------------------------------- certificate rotation


@dataclass
class RotateResult:
    before: list[CertExpiry]
    after: list[CertExpiry]
    apply_status: dict[str, str]
    apply_errors: dict[str, str]
    health: str
    seconds: float


def rotate_certs(loaded: LoadedCluster) -> RotateResult:
    """New leaf certificates and keys for every member and client (same CA), rolled out with
    the etcd role: members restart one at a time, each waiting until the cluster is healthy."""
    started = time.monotonic()
    before = expiry_report(loaded)
    cfg = cluster_settings(loaded)
    ensure_pki(loaded, cert_days=cfg.cert_days, ca_days=cfg.ca_days, rotate=True)
    report = run(loaded, RunOptions(mode=Mode.apply, roles=("etcd",)))
    return RotateResult(
        before=before,
        after=expiry_report(loaded),
        apply_status={name: str(h.status) for name, h in report.hosts.items()},
        apply_errors={name: h.error for name, h in report.hosts.items() if h.error},
        health=status(loaded).health,
        seconds=time.monotonic() - started,
    )


@dataclass
class CaRotationStep:
    step: str  # trust-new, reissue, drop-old
    apply_status: dict[str, str]
    apply_errors: dict[str, str]
    health: str
    seconds: float


@dataclass
class CaRotationResult:
    old_ca_serial: str | None
    new_ca_serial: str | None
    steps: list[CaRotationStep]
    seconds: float


CA_STEPS = ("trust-new", "reissue", "drop-old")


def rotate_ca(loaded: LoadedCluster) -> CaRotationResult:
    """Replace the etcd CA with no moment where a member or client distrusts another:

    1. trust-new: make the next CA; every member and client trusts old and new (rolled out by
       the role, members restarting one at a time, each waiting for a healthy cluster);
    2. reissue: the new CA signs; every member and client certificate is reissued from it
       (rolled out the same way; the old CA is still trusted for the ones not yet replaced);
    3. drop-old: the old CA is no longer trusted (rolled out the same way).

    Each step must end with every host applied and the cluster healthy before the next one
    starts. A run stopped half way resumes where it stopped (the stage is read from the PKI
    files: `ca-next.crt` or `ca-previous.crt` in `.state/etcd-pki/`).
    """
    from roles.etcd import pki
    from roles.etcd.files import cluster_settings

    started = time.monotonic()
    cfg = cluster_settings(loaded)
    old_ca = _ca_serial(loaded, "ca")
    stage = pki.ca_rotation_stage(loaded)
    todo = {"none": CA_STEPS, "trusting": CA_STEPS[1:], "reissued": CA_STEPS[2:]}[stage]
    if stage == "reissued":
        old_ca = _ca_serial(loaded, pki.PREVIOUS_CA)
    steps: list[CaRotationStep] = []
    try:
        for step in todo:
            if step == "trust-new":
                pki.begin_ca_rotation(loaded, ca_days=cfg.ca_days)
            elif step == "reissue":
                pki.promote_next_ca(loaded)
            else:
                pki.drop_previous_ca(loaded)
            steps.append(_roll_out(loaded, step))
            last = steps[-1]
            if last.apply_errors or last.health != "healthy":
                detail = "; ".join(f"{h}: {e}" for h, e in last.apply_errors.items())
                raise EtcdOperationError(
                    f"CA rotation stopped after step {step}: cluster {last.health}"
                    + (f"; {detail}" if detail else "")
                    + "; run `gpuinfra etcd rotate-ca` again to resume from this step"
                )
    except pki.PkiError as exc:
        raise EtcdOperationError(str(exc)) from None
    return CaRotationResult(old_ca, _ca_serial(loaded, "ca"), steps, time.monotonic() - started)


def _ca_serial(loaded: LoadedCluster, stem: str) -> str | None:
    from cryptography import x509

    from roles.etcd.pki import pki_dir

    path = pki_dir(loaded) / f"{stem}.crt"
    if not path.exists():
        return None
    return format(x509.load_pem_x509_certificate(path.read_bytes()).serial_number, "x")


def _roll_out(loaded: LoadedCluster, step: str) -> CaRotationStep:
    """One apply of the etcd role (members one at a time, then the clients) and a health check."""
    from engine.runner import Mode, RunOptions, run

    started = time.monotonic()
    report = run(loaded, RunOptions(mode=Mode.apply, roles=("etcd",)))
    return CaRotationStep(
        step=step,
        apply_status={name: str(h.status) for name, h in report.hosts.items()},
        apply_errors={name: h.error for name, h in report.hosts.items() if h.error},
        health=status(loaded).health,
        seconds=time.monotonic() - started,
    )
