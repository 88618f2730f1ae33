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
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from inventory.model import LoadedCluster
from inventory.topology import ETCD_CLIENT_PORT, ETCD_METRICS_PORT, ETCD_PEER_PORT, build_topology
from roles.etcd.config import EtcdConfig
from roles.etcd.files import INITIAL_STATE_ENV, WAIT_HEALTHY, cluster_settings
from roles.etcd.gate import GateResult, fio_command, judge
from roles.etcd.pki import CertExpiry, ensure_pki, expiry_report
from roles.runner import Mode, RunOptions, run
from roles.spec import host_config
from roles.ssh import ssh_argv

ENV = "set -a; . /etc/etcd/etcdctl.env; set +a;"
LOCAL = f"--endpoints=https://127.0.0.1:{ETCD_CLIENT_PORT} --command-timeout=3s --dial-timeout=2s"
SNAPSHOT_ON_HOST = "/var/tmp/gpuinfra-etcd-snapshot.db"
# After a restore the revision jumps ahead so watchers (the API servers' caches) never see an
# older revision again; etcd's restore guide for Kubernetes.
BUMP_REVISION = 1_000_000_000


class EtcdOperationError(RuntimeError):
    """A day-2 operation could not go on; the message says where and why."""


@dataclass
class Remote:
    ok: bool
    stdout: str
    stderr: str


def run_on(
    loaded: LoadedCluster,
    host: str,
    command: str,
    *,
    timeout: float = 60,
    stdin: bytes | None = None,
) -> Remote:
    """One shell command on a cluster host over ssh."""
    argv = ssh_argv(loaded, host) + [command]
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Remote(False, "", f"timed out after {timeout:g}s")
    return Remote(
        done.returncode == 0,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )


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


STATUS_SCRIPT = f"""{ENV}
echo "== status"; etcdctl {LOCAL} endpoint status -w json 2>&1
echo "== health"; etcdctl {LOCAL} endpoint health -w json 2>&1
echo "== metrics"; curl -sf --max-time 3 http://127.0.0.1:{ETCD_METRICS_PORT}/metrics \
    | grep '^etcd_disk_wal_fsync_duration_seconds_bucket'
echo "== end"
"""


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
    remote = run_on(loaded, host, STATUS_SCRIPT, timeout=30)
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
        entry.error = (sections.get("status", "").strip().splitlines() or ["not answering"])[-1]
    entry.wal_fsync_p99_ms = wal_fsync_p99_ms(sections.get("metrics", ""))
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
        answer = run_on(loaded, healthy[0].host, f"{ENV} etcdctl {LOCAL} alarm list", timeout=20)
        alarms = [line.strip() for line in answer.stdout.splitlines() if line.strip()]
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


# ---------------------------------------------------------------- disk check


def check_disk(loaded: LoadedCluster, limit_ms: float | None = None) -> list[GateResult]:
    """The disk gate's fio test on every member's data directory, now."""

    def check(host: str) -> GateResult:
        cfg = settings(loaded, host)
        limit = limit_ms if limit_ms is not None else cfg.fsync_p99_max_ms
        remote = run_on(loaded, host, fio_command(cfg.data_dir), timeout=600)
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
        if run_on(loaded, host, f"{ENV} etcdctl {LOCAL} endpoint health", timeout=20).ok:
            return host
    raise EtcdOperationError("no etcd member answers a health check: nothing to take it from")


def snapshot(loaded: LoadedCluster, out: Path) -> SnapshotResult:
    """A snapshot from a healthy member, copied to the controller (0600)."""
    started = time.monotonic()
    host = _healthy_member(loaded)
    taken = run_on(
        loaded,
        host,
        f"{ENV} umask 077; etcdctl {LOCAL} snapshot save {SNAPSHOT_ON_HOST} >/dev/null && "
        f"etcdutl snapshot status {SNAPSHOT_ON_HOST} -w json",
        timeout=300,
    )
    if not taken.ok:
        raise EtcdOperationError(f"{host}: snapshot failed: {taken.stderr.strip()}")
    info = _json_or_none(taken.stdout) or {}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with partial.open("wb") as handle:
        partial.chmod(0o600)
        argv = ssh_argv(loaded, host) + [f"cat {SNAPSHOT_ON_HOST} && rm -f {SNAPSHOT_ON_HOST}"]
        copied = subprocess.run(argv, stdout=handle, stderr=subprocess.PIPE, timeout=600)
    if copied.returncode != 0:
        partial.unlink(missing_ok=True)
        raise EtcdOperationError(f"{host}: copying the snapshot failed: {copied.stderr.decode()}")
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


def _stop_all(loaded: LoadedCluster, hosts: list[str]) -> None:
    stopped = each(hosts, lambda h: run_on(loaded, h, "systemctl stop etcd", timeout=120))
    failed = [h for h, r in stopped.items() if not r.ok]  # type: ignore[union-attr]
    if failed:
        raise EtcdOperationError(f"could not stop etcd on {', '.join(failed)}")


def _start_all(loaded: LoadedCluster, hosts: list[str], timeout_s: int) -> None:
    """Start every member at once (a bootstrap needs its quorum up together), then wait."""
    started = each(
        hosts,
        lambda h: run_on(
            loaded,
            h,
            # One retry: a start can fail to spawn once under load (systemd: "Failed to spawn
            # executor"), while a member that really cannot start fails both.
            f"{{ systemctl start etcd || {{ sleep 3; systemctl start etcd; }}; }} && "
            f"{WAIT_HEALTHY} {timeout_s}",
            timeout=timeout_s + 60,
        ),
    )
    failed = {h: r for h, r in started.items() if not r.ok}  # type: ignore[union-attr]
    if failed:
        detail = "; ".join(f"{h}: {r.stderr.strip()[-300:]}" for h, r in failed.items())  # type: ignore[union-attr]
        raise EtcdOperationError(f"members not healthy after the start: {detail}")


def restore(loaded: LoadedCluster, snapshot_path: Path) -> RestoreResult:
    """Rebuild the whole cluster from a snapshot: every member's data is replaced by the
    snapshot's (with a new cluster ID), then all start together."""
    if not snapshot_path.is_file():
        raise EtcdOperationError(f"{snapshot_path}: no such snapshot file")
    started = time.monotonic()
    hosts = members(loaded)
    topology = build_topology(loaded.cluster)
    data = snapshot_path.read_bytes()
    copied = each(
        hosts,
        lambda h: run_on(
            loaded, h, f"umask 077; cat > {SNAPSHOT_ON_HOST}", stdin=data, timeout=600
        ),
    )
    failed = [h for h, r in copied.items() if not r.ok]  # type: ignore[union-attr]
    if failed:
        raise EtcdOperationError(f"could not copy the snapshot to {', '.join(failed)}")

    def unpack(host: str) -> Remote:
        cfg = settings(loaded, host)
        address = str(loaded.cluster.hosts[host].address)
        data_dir = shlex.quote(cfg.data_dir)
        staging = f"{cfg.data_dir}/.restore"
        return run_on(
            loaded,
            host,
            f"set -e; rm -rf {staging}; "
            f"etcdutl snapshot restore {SNAPSHOT_ON_HOST} "
            f"--name {loaded.cluster.etcd_member(host)} "
            f"--initial-cluster {topology.etcd_initial_cluster} "
            f"--initial-cluster-token {loaded.cluster.name}-etcd "
            f"--initial-advertise-peer-urls https://{address}:{ETCD_PEER_PORT} "
            f"--bump-revision {BUMP_REVISION} --mark-compacted "
            f"--data-dir {staging} >/dev/null; "
            f"rm -rf {data_dir}/member; mv {staging}/member {data_dir}/member; rmdir {staging}; "
            f"chown -R etcd:etcd {data_dir}/member; rm -f {SNAPSHOT_ON_HOST} {INITIAL_STATE_ENV}",
            timeout=600,
        )

    _stop_all(loaded, hosts)
    unpacked = each(hosts, unpack)
    failed = [h for h, r in unpacked.items() if not r.ok]  # type: ignore[union-attr]
    if failed:
        detail = "; ".join(f"{h}: {unpacked[h].stderr.strip()[-300:]}" for h in failed)  # type: ignore[union-attr]
        raise EtcdOperationError(f"restore failed (etcd is stopped everywhere): {detail}")
    _start_all(loaded, hosts, settings(loaded, hosts[0]).health_timeout_s)
    return RestoreResult(
        str(snapshot_path), hosts, time.monotonic() - started, status(loaded).health
    )


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
    listed = run_on(loaded, via, f"{ENV} etcdctl {LOCAL} member list -w json", timeout=30)
    data = _json_or_none(listed.stdout) if listed.ok else None
    if not data:
        raise EtcdOperationError(f"{via}: member list failed: {listed.stderr.strip()}")
    return data.get("members", [])


def replace(loaded: LoadedCluster, host: str, *, override_gate: bool = False) -> ReplaceResult:
    """Remove a failed member and add it back with an empty data directory: its host keeps its
    name, address and certificates (run `gpuinfra apply --roles etcd --limit HOST` first on a
    rebuilt host; that installs etcd without starting it as a new cluster once this has run)."""
    started = time.monotonic()
    hosts = members(loaded)
    if host not in hosts:
        raise EtcdOperationError(f"{host} is not an etcd member (members: {', '.join(hosts)})")
    others = [h for h in hosts if h != host]
    healthy = [h for h in others if run_on(loaded, h, f"{ENV} etcdctl {LOCAL} endpoint health",
                                            timeout=20).ok]  # fmt: skip
    if len(healthy) < len(hosts) // 2 + 1:
        raise EtcdOperationError(
            f"only {len(healthy)} other members are healthy: a replacement needs a quorum "
            f"({len(hosts) // 2 + 1}) without {host}; restore from a snapshot instead"
        )
    via = healthy[0]
    name = loaded.cluster.etcd_member(host)
    address = str(loaded.cluster.hosts[host].address)
    cfg = settings(loaded, host)
    old = next((m for m in _member_list(loaded, via) if m.get("name") == name or
                f"https://{address}:{ETCD_PEER_PORT}" in m.get("peerURLs", [])), None)  # fmt: skip

    # The member's own data is gone or untrusted: stop it and clear the data directory.
    cleared = run_on(
        loaded,
        host,
        f"systemctl stop etcd; rm -rf {shlex.quote(cfg.data_dir)}/member && "
        f"install -d -o etcd -g etcd -m 0700 {shlex.quote(cfg.data_dir)}",
        timeout=120,
    )
    if not cleared.ok:
        raise EtcdOperationError(f"{host}: could not clear the data directory: {cleared.stderr}")
    gate_run = run_on(loaded, host, fio_command(cfg.data_dir), timeout=600)
    gate = judge(
        host,
        cfg.data_dir,
        gate_run.stdout if gate_run.ok else gate_run.stderr,
        gate_run.ok,
        cfg.fsync_p99_max_ms,
        override_gate or cfg.disk_gate_override,
    )
    if gate.status in ("fail", "error"):
        raise EtcdOperationError(
            f"{host}: disk gate: {gate.detail}; etcd there is stopped with an empty data "
            "directory and still a member: fix the disk or pass --override-gate"
        )

    if old is not None:
        removed = run_on(
            loaded, via, f"{ENV} etcdctl {LOCAL} member remove {format(old['ID'], 'x')}", timeout=30
        )
        if not removed.ok:
            raise EtcdOperationError(f"{via}: member remove failed: {removed.stderr.strip()}")
    added = run_on(
        loaded,
        via,
        f"{ENV} etcdctl {LOCAL} member add {name} --peer-urls=https://{address}:{ETCD_PEER_PORT}",
        timeout=30,
    )
    if not added.ok:
        raise EtcdOperationError(f"{via}: member add failed: {added.stderr.strip()}")
    joined = run_on(
        loaded,
        host,
        f"echo GPUINFRA_INITIAL_CLUSTER_STATE=existing > {INITIAL_STATE_ENV} && "
        f"systemctl start etcd && {WAIT_HEALTHY} {cfg.health_timeout_s}; rc=$?; "
        f"rm -f {INITIAL_STATE_ENV}; exit $rc",
        timeout=cfg.health_timeout_s + 120,
    )
    if not joined.ok:
        raise EtcdOperationError(f"{host}: the new member did not become healthy: {joined.stderr}")
    new = next((m for m in _member_list(loaded, via) if m.get("name") == name), None)
    return ReplaceResult(
        name,
        host,
        format(old["ID"], "x") if old else None,
        format(new["ID"], "x") if new else None,
        gate,
        time.monotonic() - started,
    )


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
