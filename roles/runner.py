"""The one module that talks to pyinfra's API: connect, add each role's deploy, plan or apply."""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import gevent
from paramiko import SSHException
from pyinfra.api import BaseStateCallback, Config, Inventory, State, StringCommand
from pyinfra.api import arguments as _arguments
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import OperationMeta
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import FileContents

from inventory.model import LoadedCluster
from roles.factcache import prepare_cache
from roles.facts import RebootRequired
from roles.operations import clear_pending, prefetch_requests
from roles.phases import PHASES, Phase
from roles.render import HostContext, ManagedFile, host_contexts

REDACTED = "(secret: content differs, not shown)"
# A host that goes silent mid-run (partitioned, or powered off without closing its connections)
# must fail, not hold the run: pyinfra finishes each operation on every host before the next,
# and an SSH connection waiting for a command's output never notices a silent peer by itself.
# Keepalives every KEEPALIVE_S put data in flight; unacknowledged for DEAD_PEER_S, the kernel
# drops the connection and the host's operation fails (found by tests/integration/test_faults.py).
KEEPALIVE_S = 5
DEAD_PEER_S = 30


class Mode(StrEnum):
    plan = "plan"
    apply = "apply"
    drift = "drift"


class HostStatus(StrEnum):
    ok = "ok"  # matches the inventory (plan/drift) or converged without change (apply)
    changed = "changed"  # apply changed it
    drift = "drift"  # plan/drift: would change
    failed = "failed"  # an operation failed
    unreachable = "unreachable"  # no SSH connection (refused key, changed host key, down)


@dataclass
class OperationResult:
    phase: str
    name: str
    changed: bool
    diff: str | None = None  # unified diff of a managed file; secrets are redacted
    error: str | None = None


@dataclass
class HostReport:
    name: str
    status: HostStatus = HostStatus.ok
    error: str | None = None
    operations: list[OperationResult] = field(default_factory=list)
    seconds: float = 0.0
    reboot_required: bool = False  # /run/reboot-required, read at the end of the run
    notes: list[str] = field(default_factory=list)  # why operations did nothing on this host
    # Results of checks a role ran while executing (the etcd disk gate: p99, pass/fail/override)
    checks: list[dict] = field(default_factory=list)

    @property
    def changes(self) -> list[OperationResult]:
        return [op for op in self.operations if op.changed]


@dataclass
class RunReport:
    cluster: str
    mode: Mode
    hosts: dict[str, HostReport] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    stopped: str | None = None  # why a batched run stopped early
    notes: list[str] = field(default_factory=list)

    def with_status(self, *statuses: HostStatus) -> list[HostReport]:
        return [h for h in self.hosts.values() if h.status in statuses]


@dataclass(frozen=True)
class RunOptions:
    mode: Mode
    limit: tuple[str, ...] = ()  # host or group names; empty: every host
    roles: tuple[str, ...] = ()  # role names; empty: every role
    parallel: int | None = None  # concurrent hosts; None: every host (within the nofile cap)
    batch: str | None = None  # apply in rolling batches: "N" hosts or "P%"
    fail_percent: float | None = None  # stop a batched run past this share of failed hosts
    connect_timeout: int = 10
    shard: tuple[int, int] | None = None  # (index, count): check only this share of the hosts


Progress = Callable[[str, int, int], None]  # (what, done, total)


def select_hosts(loaded: LoadedCluster, limit: Iterable[str]) -> list[str]:
    """Hosts named by --limit (host names or group names), in inventory order."""
    wanted = set(limit)
    if not wanted:
        return list(loaded.cluster.hosts)
    return [
        name
        for name, host in loaded.cluster.hosts.items()
        if name in wanted or wanted.intersection(host.groups)
    ]


def shard_hosts(hosts: list[str], index: int, count: int) -> list[str]:
    """Shard `index` of `count` (0-based, as a Kubernetes Indexed Job numbers its pods): the
    hosts whose position in name order is `index` modulo `count`. Every host falls in exactly
    one shard, shards differ in size by one host at most, and the split depends only on the
    host names, so runners that each take one index check the whole fleet once."""
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is not in 0..{count - 1}")
    mine = set(sorted(hosts)[index::count])
    return [name for name in hosts if name in mine]


def select_phases(roles: Iterable[str]) -> list[Phase]:
    wanted = set(roles)
    return [phase for phase in PHASES if not wanted or phase.role in wanted]


def batches(hosts: list[str], batch: str | None) -> list[list[str]]:
    if not batch:
        return [hosts]
    if batch.endswith("%"):
        size = max(1, round(len(hosts) * float(batch[:-1]) / 100))
    else:
        size = max(1, int(batch))
    return [hosts[i : i + size] for i in range(0, len(hosts), size)]


def run(loaded: LoadedCluster, options: RunOptions, progress: Progress | None = None) -> RunReport:
    started = time.monotonic()
    report = RunReport(cluster=loaded.cluster.name, mode=options.mode)
    hosts = select_hosts(loaded, options.limit)
    if options.shard:
        selected = len(hosts)
        hosts = shard_hosts(hosts, *options.shard)
        index, count = options.shard
        report.notes.append(f"shard {index}/{count}: {len(hosts)} of {selected} hosts")
    phases = select_phases(options.roles)
    contexts = {ctx.name: ctx for ctx in host_contexts(loaded)}
    host_batches = batches(hosts, options.batch if options.mode is Mode.apply else None)
    if not hosts:  # a shard of more runners than hosts: nothing to check
        host_batches = []
    for number, batch in enumerate(host_batches, 1):
        _run_batch(loaded, options, [contexts[h] for h in batch], phases, report, progress)
        failed = len(report.with_status(HostStatus.failed, HostStatus.unreachable))
        if (
            options.fail_percent is not None
            and number < len(host_batches)
            and failed * 100 / len(report.hosts) > options.fail_percent
        ):
            report.stopped = (
                f"stopped after batch {number} of {len(host_batches)}: {failed} of "
                f"{len(report.hosts)} hosts failed, over --fail-percent {options.fail_percent:g}"
            )
            break
    report.seconds = time.monotonic() - started
    return report


class _Recorder(BaseStateCallback):
    """Collects per-host connection errors and operation failures as pyinfra reports them."""

    def __init__(self, progress: Progress | None, total: int):
        self.connect_errors: dict[str, str] = {}
        self.op_errors: dict[tuple[str, str], str] = {}
        self.progress = progress
        self.total = total
        self.done = 0
        # Execution time per role: pyinfra runs one operation on every host before the next.
        self.op_phase: dict[str, str] = {}
        self.role_seconds: dict[str, float] = {}
        self._op_started: dict[str, float] = {}

    def host_connect_error(self, state, host, error) -> None:
        self.connect_errors[host.name] = _explain_connect_error(error)

    def operation_start(self, state, op_hash) -> None:
        self._op_started[op_hash] = time.monotonic()

    def operation_end(self, state, op_hash) -> None:
        started = self._op_started.pop(op_hash, None)
        role = self.op_phase.get(op_hash)
        if started is not None and role is not None:
            seconds = time.monotonic() - started
            self.role_seconds[role] = self.role_seconds.get(role, 0.0) + seconds

    def operation_host_success(self, state, host, op_hash, retry_count: int = 0) -> None:
        self._step()

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0) -> None:
        results = state.get_results_for_host(host)
        reason = getattr(results, "error", None) or "failed"
        if not _connection_alive(host):
            # pyinfra only logs why a command could not run; the dead connection is the why.
            reason = CONNECTION_LOST
        # A reason recorded earlier (a lost connection, see _skip_unchanged_while_clean) stays.
        self.op_errors.setdefault((host.name, op_hash), reason)
        self._step()

    def _step(self) -> None:
        self.done += 1
        if self.progress:
            self.progress("apply", self.done, self.total)


CONNECTION_LOST = "connection lost (the host stopped answering: rebooted, powered off or cut off)"


def _connection_alive(host) -> bool:
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    return transport is not None and transport.is_active()


def _explain_connect_error(error: Exception) -> str:
    text = str(error.args[0] if getattr(error, "args", None) else error)
    lowered = text.lower()
    if "host key" in lowered or "known_hosts" in lowered or "not found in known_hosts" in lowered:
        return f"host key refused: {text} (check the cluster's known_hosts file)"
    if "authentication" in lowered:
        return f"key refused: {text}"
    return text


def _pyinfra_inventory(loaded: LoadedCluster, names: list[str], timeout: int) -> Inventory:
    cluster = loaded.cluster
    ssh = cluster.ssh
    data: dict[str, object] = {
        "ssh_user": ssh.user,
        "ssh_port": ssh.port,
        "ssh_known_hosts_file": str(loaded.resolve(ssh.known_hosts)),
        # Never trust an unknown host key: a changed key means a different machine.
        "ssh_strict_host_key_checking": "yes",
        "ssh_connect_retries": 0,
        "ssh_paramiko_connect_kwargs": {"timeout": timeout, "banner_timeout": timeout},
    }
    if ssh.key is not None:
        data.update(
            ssh_key=str(loaded.resolve(ssh.key)), ssh_allow_agent=False, ssh_look_for_keys=False
        )
    if ssh.bastion:
        data["ssh_config_file"] = str(_bastion_config(loaded))
    hosts = [(name, {"ssh_hostname": str(cluster.hosts[name].address)}) for name in names]
    return Inventory((hosts, data))


def _bastion_config(loaded: LoadedCluster) -> Path:
    path = loaded.state_dir / "ssh_config"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"Host *\n    ProxyJump {loaded.cluster.ssh.bastion}\n")
    return path


def _run_batch(
    loaded: LoadedCluster,
    options: RunOptions,
    contexts: list[HostContext],
    phases: list[Phase],
    report: RunReport,
    progress: Progress | None,
) -> None:
    names = [ctx.name for ctx in contexts]
    for name in names:
        report.hosts[name] = HostReport(name)
    config = Config(
        PARALLEL=options.parallel or len(names),
        CONNECT_TIMEOUT=options.connect_timeout,
        FAIL_PERCENT=None,
    )
    inventory = _pyinfra_inventory(loaded, names, options.connect_timeout)
    state = State(inventory, config, check_for_changes=True)
    recorder = _Recorder(progress, 0)
    state.add_callback_handler(recorder)
    by_name = {ctx.name: ctx for ctx in contexts}

    clock = time.monotonic()
    state.set_stage(StateStage.Connect)
    with contextlib.suppress(PyinfraError):  # every host failed to connect: reported below
        connect_all(state)
    _add_time(report, "connect", clock)
    _detect_silent_hosts(state)
    for host in state.failed_hosts:
        entry = report.hosts[host.name]
        entry.status = HostStatus.unreachable
        entry.error = recorder.connect_errors.get(host.name, "could not connect")
    active = [h for h in inventory if h in state.active_hosts]
    if not active:
        return

    # pyinfra keeps the state in a process-wide context and the host in a greenlet-local one.
    with ctx_state.use(state):
        _prepare_and_execute(state, options, active, phases, by_name, report, recorder)


def _detect_silent_hosts(state) -> None:
    """Keepalives and a TCP user timeout on each host's SSH connection (see DEAD_PEER_S)."""
    for host in state.active_hosts:
        client = getattr(host.connector, "client", None)
        transport = client.get_transport() if client is not None else None
        if transport is None:
            continue
        transport.set_keepalive(KEEPALIVE_S)
        sock = transport.sock
        # Through a bastion the transport runs over a channel, not a socket: the bastion's own
        # connection carries the timeout then.
        if getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PEER_S * 1000)


def _prepare_and_execute(state, options, active, phases, by_name, report, recorder) -> None:
    state.set_stage(StateStage.Prepare)
    op_phase: dict[str, str] = {}
    with prepare_cache(state, active) as caches:
        clock = time.monotonic()
        _prefetch(state, caches, phases, by_name)
        _add_time(report, "prefetch", clock)
        for index, phase in enumerate(phases):
            clock = time.monotonic()
            targets = [h for h in active if phase.applies_to(by_name[h.name].host.groups)]
            _prepare_phase(state, phase, index, targets, by_name, op_phase)
            _add_time(report, f"prepare:{phase.role}", clock)

    _collect_plan(state, active, op_phase, report)
    if options.mode is not Mode.apply:
        _read_reboot_required(state, active, report)
        _disconnect(state)
        return

    recorder.total = sum(len(state.ops[h]) for h in active)
    recorder.op_phase = op_phase
    _skip_unchanged_while_clean(state, active, recorder)
    clock = time.monotonic()
    state.set_stage(StateStage.Execute)
    try:
        run_ops(state)
    except PyinfraError as exc:
        report.notes.append(str(exc))
    _add_time(report, "execute", clock)
    for role, seconds in recorder.role_seconds.items():
        report.phase_seconds[f"execute:{role}"] = (
            report.phase_seconds.get(f"execute:{role}", 0.0) + seconds
        )
    _collect_results(state, active, op_phase, recorder, report)
    _read_reboot_required(state, active, report)
    _disconnect(state)


def _skip_unchanged_while_clean(state, hosts, recorder: _Recorder | None = None) -> None:
    """Execute what prepare found to change, and not the rest again while nothing has run.

    pyinfra 3.10 runs every operation's body a second time while executing, asking each fact
    again over SSH: about 110 round trips per host for a no-op apply of every role, which the
    prepare stage has already answered. As long as no command has run on a host, the host is
    exactly as prepare saw it, so an operation prepare found nothing to do for is skipped.
    From a host's first command on, its remaining operations are evaluated again as pyinfra
    always does (an earlier change may have changed what they see). The roles' operations
    decide from facts of their own host; one that decided from another host's state while
    preparing would keep that decision until its host's first command.

    An operation asks for facts while executing: a host whose connection broke (rebooted,
    partitioned) makes that raise, and pyinfra 3.10 would let the exception end the whole run
    for every host ("Aborted.", no report). It fails that host's operation instead, with the
    reason, and the other hosts go on (found by tests/integration/test_faults.py)."""
    touched: set[str] = set()

    def guarded(name: str, op_hash: str, generate, skip_while_clean: bool):
        def commands():
            if skip_while_clean and name not in touched:
                return
            try:
                for command in generate():
                    touched.add(name)
                    yield command
            except (EOFError, OSError, SSHException) as exc:
                reason = f"connection lost ({type(exc).__name__}: {exc})".replace(": )", ")")
                if recorder is not None:
                    recorder.op_errors[(name, op_hash)] = reason
                yield StringCommand("false")  # fails the operation on this host only

        return commands

    for host in hosts:
        for op_hash, op_data in state.ops[host].items():
            unchanged = op_data.operation_meta._maybe_is_change is False
            op_data.command_generator = guarded(
                host.name, op_hash, op_data.command_generator, unchanged
            )


def _prefetch(state, caches, phases, by_name) -> None:
    """One command per host fetching the facts every role's managed files need (see
    roles/factcache.py): the deploys then find them instead of asking one by one."""

    def prefetch(host, cache) -> None:
        ctx = by_name[host.name]
        managed = [
            f
            for phase in phases
            if phase.files is not None and phase.applies_to(ctx.host.groups)
            for f in phase.files(ctx)
        ]
        # Only an optimisation: a host that fails here fails again, and is reported, when its
        # deploy asks for the same facts one by one.
        with ctx_host.use(host), contextlib.suppress(Exception):
            cache.prefetch(prefetch_requests(managed))

    gevent.joinall([state.pool.spawn(prefetch, host, cache) for host, cache in caches.items()])


def _prepare_phase(state, phase, index, targets, by_name, op_phase) -> None:
    """Run one role's deploy on its hosts, concurrently, recording which ops belong to it."""

    def prepare(host) -> Exception | None:
        before = set(state.ops[host])
        started = time.monotonic()
        # pyinfra 3.10 hashes API-mode operations by their position on the host; adding the
        # phase index keeps two roles' operations at the same position from being merged.
        host.loop_position = [index]
        try:
            with ctx_host.use(host):
                phase.deploy(by_name[host.name])
                written = getattr(host, "_gpuinfra_files", {})
                paths = [
                    written[op].path for op in state.ops[host] if op not in before and op in written
                ]
                # Last: clears what the phase's writes marked once its restarts have run.
                clear_pending(name=f"{phase.role}: clear pending restarts", paths=paths)
        except Exception as exc:  # noqa: BLE001 (reported per host; the others go on)
            return exc
        finally:
            host.loop_position = []
            host._gpuinfra_prepare_seconds = (  # type: ignore[attr-defined]
                getattr(host, "_gpuinfra_prepare_seconds", 0.0) + time.monotonic() - started
            )
        for op_hash in set(state.ops[host]) - before:
            op_phase[op_hash] = phase.role
        return None

    greenlets = {state.pool.spawn(prepare, host): host for host in targets}
    gevent.joinall(list(greenlets))
    for greenlet, host in greenlets.items():
        error = greenlet.value if greenlet.successful() else greenlet.exception
        if error is not None:
            # The host's own operations are dropped; the other hosts go on.
            state.failed_hosts.add(host)
            state.active_hosts.discard(host)
            host._gpuinfra_error = f"{phase.role}: {error}"  # type: ignore[attr-defined]


def _collect_plan(state, active, op_phase, report: RunReport) -> None:
    for host in active:
        entry = report.hosts[host.name]
        entry.seconds = getattr(host, "_gpuinfra_prepare_seconds", 0.0)
        if getattr(host, "_gpuinfra_error", None):
            entry.status = HostStatus.failed
            entry.error = host._gpuinfra_error
            continue
        entry.notes = list(getattr(host, "_gpuinfra_notes", {}))
        files_by_op = getattr(host, "_gpuinfra_files", {})
        for op_hash in state.get_op_order():
            op_data = state.ops[host].get(op_hash)
            if op_data is None:
                continue
            name = _op_name(state, op_hash)
            changed = bool(op_data.operation_meta._maybe_is_change) and _conditions_hold(
                op_data.global_arguments.get("_if")
            )
            result = OperationResult(op_phase.get(op_hash, "?"), name, changed)
            if changed and op_hash in files_by_op:
                result.diff = _diff(host, files_by_op[op_hash])
            entry.operations.append(result)
        if entry.changes:
            entry.status = HostStatus.drift


def _conditions_hold(conditions) -> bool:
    """Evaluate an operation's `_if` conditions before execution: pyinfra only checks them while
    executing, so a plan would count every handler ("restart if the file changed") as a change.
    Each `did_change()` a condition asks about is answered with what that operation will do."""
    if not conditions:
        return True
    conditions = conditions if isinstance(conditions, list) else [conditions]
    original = OperationMeta.did_change

    def will_change(meta: OperationMeta) -> bool:
        return original(meta) if meta.is_complete() else bool(meta._maybe_is_change)

    def holds(condition) -> bool:
        # `_if=meta.did_change` is a method bound before this patch: answer it directly.
        if getattr(condition, "__func__", None) is original:
            return will_change(condition.__self__)
        return bool(condition())

    OperationMeta.did_change = will_change  # type: ignore[method-assign]
    try:
        return all(holds(condition) for condition in conditions)
    finally:
        OperationMeta.did_change = original  # type: ignore[method-assign]


def _collect_results(state, active, op_phase, recorder: _Recorder, report: RunReport) -> None:
    for host in active:
        entry = report.hosts[host.name]
        if entry.status is HostStatus.failed:
            continue
        planned = {op.name: op for op in entry.operations}
        entry.operations = []
        for op_hash in state.get_op_order():
            op_data = state.ops[host].get(op_hash)
            if op_data is None:
                continue
            name = _op_name(state, op_hash)
            meta = op_data.operation_meta
            error = recorder.op_errors.get((host.name, op_hash))
            if error is not None:
                error = _error_detail(
                    name, error, meta, getattr(host, "_gpuinfra_files", {}), op_hash
                )
            changed = meta.is_complete() and meta.did_change()
            previous = planned.get(name)
            entry.operations.append(
                OperationResult(
                    op_phase.get(op_hash, "?"),
                    name,
                    changed,
                    diff=previous.diff if previous and changed else None,
                    error=error,
                )
            )
        entry.checks = list(getattr(host, "_gpuinfra_checks", []))
        if any(op.error for op in entry.operations) or host in state.failed_hosts:
            entry.status = HostStatus.failed
            failed_checks = [
                c["detail"] for c in entry.checks if c.get("status") in ("fail", "error")
            ]
            entry.error = next(
                iter(failed_checks),
                next((op.error for op in entry.operations if op.error), "failed"),
            )
        elif entry.changes:
            entry.status = HostStatus.changed
        else:
            entry.status = HostStatus.ok


def _read_reboot_required(state, active, report: RunReport) -> None:
    """Whether each host waits for a reboot, read after its operations ran (a kernel or boot
    command line change marks it; `apply --reboot` acts on it)."""

    def read(host) -> bool:
        with ctx_host.use(host):
            return bool(host.get_fact(RebootRequired))

    hosts = [h for h in active if h not in state.failed_hosts]
    greenlets = {state.pool.spawn(read, host): host for host in hosts}
    gevent.joinall(list(greenlets))
    for greenlet, host in greenlets.items():
        report.hosts[host.name].reboot_required = bool(greenlet.successful() and greenlet.value)


# errno texts that say the host itself is broken, whatever the command was.
HOST_CAUSES = ("No space left on device", "Read-only file system", "Input/output error")


def _error_detail(name: str, error: str, meta: OperationMeta, files_by_op, op_hash: str) -> str:
    """The operation's name and the last lines its failing command wrote to stderr (what an
    operator needs: "sshd: Bad yes/without-password argument"), never for secret files."""
    managed = files_by_op.get(op_hash)
    output = getattr(meta, "_combined_output", None)
    if output is None or (managed is not None and managed.secret):
        return f"{name}: {error}"
    if error.startswith("connection lost"):
        # What the command wrote before the connection died is not why it failed.
        return f"{name}: {error}"
    lines = [line.strip() for line in output.stderr_lines if line.strip()]
    detail = lines[-3:]
    # A host-level cause (a full disk) is often far above the last lines (apt ends with
    # "dpkg returned an error code"): name it first.
    # apt relays dpkg's messages on stdout: look for the cause in both streams.
    every_line = [line.strip() for line in output.output_lines]
    cause = next((line for line in every_line if any(c in line for c in HOST_CAUSES)), None)
    if cause is not None and cause not in detail:
        detail.insert(0, cause)
    return f"{name}: {' | '.join(detail) or error}"


def _op_name(state, op_hash: str) -> str:
    names = sorted(state.get_op_meta(op_hash).names)
    return names[0] if names else op_hash


def _diff(host, managed: ManagedFile) -> str:
    if managed.secret:
        return REDACTED
    with ctx_host.use(host):
        current = host.get_fact(FileContents, path=managed.path)
    before = [line + "\n" for line in current] if current else []
    after = managed.content.splitlines(keepends=True)
    return "".join(
        difflib.unified_diff(
            before, after, fromfile=f"{host.name}:{managed.path}", tofile="inventory"
        )
    )


def _disconnect(state) -> None:
    state.set_stage(StateStage.Disconnect)
    disconnect_all(state)


def _add_time(report: RunReport, key: str, since: float) -> None:
    report.phase_seconds[key] = report.phase_seconds.get(key, 0.0) + time.monotonic() - since


# pyinfra logs each host's errors itself; our report says the same once, so keep it quiet.
logging.getLogger("pyinfra").setLevel(logging.CRITICAL)

# pyinfra 3.10 calls typing.get_type_hints on its fixed global-arguments TypedDict for every
# operation and fact request: a third of a no-op drift's CPU time. The answer never changes.
_arguments.all_global_arguments = functools.cache(_arguments.all_global_arguments)
