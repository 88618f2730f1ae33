"""What `etcd status` and `etcd check-disk` read on the members: each member's own view, its
metrics, its data disk and its last error; the cluster's health, quorum and alarms."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from day2.etcd import common
from day2.etcd.common import ENV, LOCAL, each, json_or_none, members, settings
from inventory.model import LoadedCluster
from inventory.topology import ETCD_METRICS_PORT
from roles.etcd.config import quota_backend_bytes
from roles.etcd.gate import GateResult, fio_command, judge
from roles.etcd.pki import CertExpiry, expiry_report


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


def _is_log_record(line: str) -> bool:
    """A line of etcdctl's own JSON log on stderr (merged into the answer), e.g. etcdctl 3.6's
    warning for ETCDCTL_API, which it no longer reads, or its client's retries."""
    record = json_or_none(line) if line.startswith("{") else None
    return isinstance(record, dict) and "level" in record


def _etcdctl_json(output: str) -> list | None:
    """The answer of `etcdctl ... -w json` (one line holding a JSON array) among the lines of
    its merged stderr: the whole text is no document once etcdctl logs a line before it."""
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("["):
            answer = json_or_none(line)
            if isinstance(answer, list) and answer:
                return answer
    return None


def _etcdctl_error(output: str) -> str:
    """etcdctl's own error line ("Error: ...", or 3.6's "Failed to get the status of endpoint
    ... (context deadline exceeded)"), else its last line that says anything."""
    lines = [line.strip() for line in output.splitlines()]
    lines = [
        line for line in lines if line not in ("", "[]", "{}", "null") and not _is_log_record(line)
    ]
    errors = [line for line in lines if line.startswith(("Error", "Failed"))]
    return (errors or lines or ["not answering"])[-1]


def _journal_reason(line: str) -> str | None:
    """The message (and error) of etcd's last error line in the journal, short."""
    line = line.strip()
    if not line:
        return None
    record = json_or_none(line)
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


def member_status(loaded: LoadedCluster, host: str) -> MemberStatus:
    cluster = loaded.cluster
    entry = MemberStatus(host, cluster.etcd_member(host), str(cluster.hosts[host].address), "down")
    data_dir = settings(loaded, host).data_dir
    remote = common.run_remote(loaded, host, status_script(data_dir), timeout=30)
    if "== end" not in remote.stdout:
        entry.state = "unreachable"
        entry.error = (remote.stderr.strip().splitlines() or ["ssh failed"])[-1]
        return entry
    sections = _sections(remote.stdout)
    status = _etcdctl_json(sections.get("status", ""))
    if status:
        body = status[0]["Status"]
        entry.member_id = format(body["header"]["member_id"], "x")
        entry.version = body.get("version")
        entry.db_size = body.get("dbSize")
        entry.db_size_in_use = body.get("dbSizeInUse")
        entry.raft_term = body.get("raftTerm")
        entry.raft_index = body.get("raftIndex")
        entry.leader = body.get("leader") == body["header"]["member_id"]
    health = _etcdctl_json(sections.get("health", ""))
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
        answer = common.run_remote(
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
        quota_bytes=quota_backend_bytes(settings(loaded, hosts[0]), loaded.cluster),
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


def check_disk(loaded: LoadedCluster, limit_ms: float | None = None) -> list[GateResult]:
    """The disk gate's fio test on every member's data directory, now."""

    def check(host: str) -> GateResult:
        cfg = settings(loaded, host)
        limit = limit_ms if limit_ms is not None else cfg.fsync_p99_max_ms
        remote = common.run_remote(loaded, host, fio_command(cfg.data_dir), timeout=600)
        output = remote.stdout if remote.ok else (remote.stderr or remote.stdout)
        return judge(host, cfg.data_dir, output, remote.ok, limit, override=False)

    results = each(members(loaded), check)
    return [results[h] for h in members(loaded)]  # type: ignore[misc]
