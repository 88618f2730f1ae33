"""The one module that drives pyinfra's State: connect, add each role's deploy, plan or apply
one step's hosts (engine/rolling.py takes the steps), and report what pyinfra did."""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

import gevent
from pyinfra.api import BaseStateCallback, Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import FileContents

from engine.context import host_contexts
from engine.factcache import prepare_cache
from engine.fleetgate import Gate
from engine.registry import select_phases
from engine.reports import HostReport, HostStatus, Mode, OperationResult, RunOptions, RunReport
from engine.rolling import run_steps
from engine.selection import selected_hosts
from inventory.model import LoadedCluster
from toolkit import pyinfra_api, record
from toolkit.facts import RebootRequired
from toolkit.operations import clear_pending, prefetch_requests
from toolkit.pacing import reset_shared
from toolkit.pyinfra_api import (
    commands_routed,
    conditions_hold,
    found_unchanged,
    guard_commands,
    memoise_global_arguments,
    output_lines,
    phase_position,
    phases_in_order,
    ssh_transport,
    stderr_tail,
    will_change,
)
from toolkit.record import RunRecord
from toolkit.spec import HostContext, ManagedFile, Phase
from toolkit.ssh import SSHSettings, ssh_settings

REDACTED = "(secret: content differs, not shown)"
# A host that goes silent mid-run (partitioned, or powered off without closing its connections)
# must fail, not hold the run: pyinfra finishes each operation on every host before the next,
# and an SSH connection waiting for a command's output never notices a silent peer by itself.
# Keepalives every KEEPALIVE_S put data in flight; unacknowledged for DEAD_PEER_S, the kernel
# drops the connection and the host's operation fails (found by tests/integration/test_faults.py).
KEEPALIVE_S = 5
DEAD_PEER_S = 30
CONNECTION_LOST = "connection lost (the host stopped answering: rebooted, powered off or cut off)"
# errno texts that say the host itself is broken, whatever the command was.
HOST_CAUSES = ("No space left on device", "Read-only file system", "Input/output error")


Progress = Callable[[str, int, int], None]  # (what, done, total)


def run(
    loaded: LoadedCluster,
    options: RunOptions,
    progress: Progress | None = None,
    record: bool = False,
    gate: Gate | None = None,
) -> RunReport:
    """Plan, apply or check the hosts, in the steps engine/rolling.py takes them. With `record`
    (apply only: it writes `.state/`), every host found converged gets its record for the drift
    fast path (engine/fingerprint/recording.py); hosts the apply changed are checked again,
    exactly, to find them converged. `gate` decides which of a step's hosts start when (a
    rollout shard's LedgerGate); None: the whole step."""
    started = time.monotonic()
    if record:  # the code this run has loaded, unless the command line took it before
        from engine import fingerprint

        fingerprint.code_digest()
    asked: dict[str, tuple[str, ...]] = {}
    memoise_global_arguments()
    pyinfra_api.keep_operation_names(_keep_operation_name)
    reset_shared()
    report = RunReport(cluster=loaded.cluster.name, mode=options.mode)
    hosts, report.notes = selected_hosts(loaded, options)
    phases = select_phases(options.roles, loaded.cluster)
    contexts = {ctx.name: ctx for ctx in host_contexts(loaded)}
    batch_asked = asked if record else None

    def run_hosts(names: list[str]) -> None:
        batch = [contexts[h] for h in names]
        _run_batch(loaded, options, batch, phases, report, progress, batch_asked)

    run_steps(loaded, options, hosts, report, run_hosts, gate)
    if record:
        from engine.fingerprint.recording import record_converged

        check = functools.partial(run, loaded, record=True)
        record_converged(loaded, options, report, asked, contexts, check)
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


def _connection_alive(host) -> bool:
    transport = ssh_transport(host)
    return transport is not None and transport.is_active()


def _detect_silent_hosts(state) -> None:
    """Keepalives and a TCP user timeout on each host's SSH connection (see DEAD_PEER_S)."""
    for host in state.active_hosts:
        transport = ssh_transport(host)
        if transport is None:
            continue
        transport.set_keepalive(KEEPALIVE_S)
        sock = transport.sock
        # Through a bastion the transport runs over a channel, not a socket: the bastion's own
        # connection carries the timeout then.
        if getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PEER_S * 1000)


def _explain_connect_error(error: Exception) -> str:
    text = str(error.args[0] if getattr(error, "args", None) else error)
    lowered = text.lower()
    if "host key" in lowered or "known_hosts" in lowered or "not found in known_hosts" in lowered:
        return f"host key refused: {text} (check the cluster's known_hosts file)"
    if "authentication" in lowered:
        return f"key refused: {text}"
    return text


def _pyinfra_inventory(
    loaded: LoadedCluster, names: list[str], timeout: int, persist: bool = False
) -> Inventory:
    settings = ssh_settings(loaded, timeout)
    addresses = {name: str(loaded.cluster.hosts[name].address) for name in names}
    config_file = _bastion_config(loaded, settings, list(addresses.values()), persist)
    hosts = [(name, {"ssh_hostname": address}) for name, address in addresses.items()]
    return Inventory((hosts, settings.pyinfra_data(config_file)))


def _bastion_config(loaded, settings: SSHSettings, addresses, persist: bool) -> Path | None:
    """The bastion's ssh_config: under .state/ for apply, in a temporary folder otherwise
    (plan and drift write no state)."""
    return settings.write_ssh_config(addresses, loaded.state_dir if persist else None)


def _run_batch(
    loaded: LoadedCluster,
    options: RunOptions,
    contexts: list[HostContext],
    phases: list[Phase],
    report: RunReport,
    progress: Progress | None,
    asked: dict[str, tuple] | None = None,
) -> None:
    names = [ctx.name for ctx in contexts]
    for name in names:
        report.hosts[name] = HostReport(name)
    bastion_problem = ssh_settings(loaded, options.connect_timeout).bastion_problem()
    if bastion_problem is not None:  # every host is behind it: none is tried
        for entry in report.hosts.values():
            entry.status, entry.error = HostStatus.unreachable, bastion_problem
        return
    config = Config(
        PARALLEL=options.parallel or len(names),
        CONNECT_TIMEOUT=options.connect_timeout,
        FAIL_PERCENT=None,
    )
    inventory = _pyinfra_inventory(
        loaded, names, options.connect_timeout, persist=options.mode is Mode.apply
    )
    state = State(inventory, config, check_for_changes=True)
    recorder = _Recorder(progress, 0)
    state.add_callback_handler(recorder)
    by_name = {ctx.name: ctx for ctx in contexts}

    clock = time.monotonic()
    state.set_stage(StateStage.Connect)
    with contextlib.suppress(PyinfraError):  # every host failed to connect: reported below
        connect_all(state)
    report.add_time("connect", clock)
    _detect_silent_hosts(state)
    for host in state.failed_hosts:
        entry = report.hosts[host.name]
        entry.status = HostStatus.unreachable
        entry.error = recorder.connect_errors.get(host.name, "could not connect")
    active = [h for h in inventory if h in state.active_hosts]
    if not active:
        return

    # pyinfra keeps the state in a process-wide context and the host in a greenlet-local one.
    with ctx_state.use(state), record.recording() as run_record:
        caches = _prepare_and_execute(
            state, options, active, phases, by_name, report, recorder, run_record, asked is not None
        )
    if asked is not None:
        asked.update(_asked_commands(caches, report))


def _asked_commands(caches, report: RunReport) -> dict[str, tuple]:
    """Per host whose run went through and whose commands can all be replayed: each command
    its deploys asked, with its success codes and the digest of what it printed."""
    from engine.fingerprint import output_digest

    return {
        host.name: tuple(
            (asked.text, asked.success_codes, output_digest(asked.stdout))
            for asked in cache.asked.values()
        )
        for host, cache in caches.items()
        if cache.replayable
        and report.hosts[host.name].status in (HostStatus.ok, HostStatus.changed)
    }


def _prepare_and_execute(
    state, options, active, phases, by_name, report, recorder, run_record: RunRecord, recording
):
    state.set_stage(StateStage.Prepare)
    op_phase: dict[str, str] = {}
    with prepare_cache(state, active, recording) as caches:
        clock = time.monotonic()
        _prefetch(state, caches, phases, by_name)
        report.add_time("prefetch", clock)
        for index, phase in enumerate(phases):
            clock = time.monotonic()
            targets = [
                h
                for h in active
                if phase.applies_to(by_name[h.name].host.groups, by_name[h.name].cluster)
            ]
            _prepare_phase(state, phase, index, targets, by_name, op_phase, run_record)
            report.add_time(f"prepare:{phase.role}", clock)

    _collect_plan(state, active, op_phase, report, run_record)
    if options.mode is not Mode.apply:
        _read_reboot_required(state, active, report, caches)
        _disconnect(state)
        return caches

    recorder.total = sum(len(state.ops[h]) for h in active)
    recorder.op_phase = op_phase
    _skip_unchanged_while_clean(state, active, recorder)
    clock = time.monotonic()
    state.set_stage(StateStage.Execute)
    phases_in_order(state)
    try:
        run_ops(state)
    except PyinfraError as exc:
        report.notes.append(str(exc))
    report.add_time("execute", clock)
    for role, seconds in recorder.role_seconds.items():
        report.phase_seconds[f"execute:{role}"] = (
            report.phase_seconds.get(f"execute:{role}", 0.0) + seconds
        )
    _collect_results(state, active, op_phase, recorder, report, run_record)
    _read_reboot_required(state, active, report, caches)
    _disconnect(state)
    return caches


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

    def skip(host, meta, arguments) -> bool:
        if host.name in touched:
            return False
        # A handler whose trigger did not fire ("refresh package lists if the sources
        # changed") has commands but none to run: it leaves the host untouched too (it used to
        # mark every host of a no-op apply touched at the base role's first handler, and every
        # later operation then asked its facts again: 14 of the default lab's 21 s).
        if found_unchanged(meta) or not conditions_hold(arguments.get("_if")):
            return True
        touched.add(host.name)  # its commands run now: later operations see a changed host
        return False

    def lost(host, meta, exc: BaseException) -> None:
        reason = f"connection lost ({type(exc).__name__}: {exc})".replace(": )", ")")
        if recorder is not None:
            recorder.op_errors[(host.name, pyinfra_api.op_hash(meta))] = reason

    guard_commands(state, hosts, skip, lost)


def _prefetch(state, caches, phases, by_name) -> None:
    """One command per host fetching the facts every role's managed files need (see
    engine/factcache.py): the deploys then find them instead of asking one by one."""

    def prefetch(host, cache) -> None:
        ctx = by_name[host.name]
        managed = [
            f
            for phase in phases
            if phase.files is not None and phase.applies_to(ctx.host.groups, ctx.cluster)
            for f in phase.files(ctx)
        ]
        # Only an optimisation: a host that fails here fails again, and is reported, when its
        # deploy asks for the same facts one by one.
        with ctx_host.use(host), contextlib.suppress(Exception):
            cache.prefetch(prefetch_requests(managed))

    gevent.joinall([state.pool.spawn(prefetch, host, cache) for host, cache in caches.items()])


def _prepare_phase(state, phase, index, targets, by_name, op_phase, run_record) -> None:
    """Run one role's deploy on its hosts, concurrently, recording which ops belong to it."""

    def prepare(host) -> Exception | None:
        before = set(state.ops[host])
        started = time.monotonic()
        try:
            with ctx_host.use(host), phase_position(host, index):
                phase.deploy(by_name[host.name])
                written = run_record.host(host.name).files
                paths = [
                    written[op].path for op in state.ops[host] if op not in before and op in written
                ]
                # Last: clears what the phase's writes marked once its restarts have run.
                clear_pending(name=f"{phase.role}: clear pending restarts", paths=paths)
        except Exception as exc:  # noqa: BLE001 (reported per host; the others go on)
            return exc
        finally:
            run_record.host(host.name).prepare_seconds += time.monotonic() - started
        for new_hash in set(state.ops[host]) - before:
            op_phase[new_hash] = phase.role
        return None

    greenlets = {state.pool.spawn(prepare, host): host for host in targets}
    gevent.joinall(list(greenlets))
    for greenlet, host in greenlets.items():
        error = greenlet.value if greenlet.successful() else greenlet.exception
        if error is not None:
            # The host's own operations are dropped; the other hosts go on.
            state.failed_hosts.add(host)
            state.active_hosts.discard(host)
            run_record.host(host.name).error = f"{phase.role}: {error}"


def _collect_plan(state, active, op_phase, report: RunReport, run_record: RunRecord) -> None:
    for host in active:
        entry = report.hosts[host.name]
        host_record = run_record.host(host.name)
        entry.seconds = host_record.prepare_seconds
        if host_record.error:
            entry.status = HostStatus.failed
            entry.error = host_record.error
            continue
        entry.notes = list(host_record.notes)
        files_by_op = host_record.files
        for op_hash, op_data in _host_operations(state, host):
            name = host_record.op_names.get(op_hash) or _op_name(state, op_hash)
            changed = will_change(op_data.operation_meta) and conditions_hold(
                op_data.global_arguments.get("_if")
            )
            result = OperationResult(op_phase.get(op_hash, "?"), name, changed)
            if changed and op_hash in files_by_op:
                result.diff = _diff(host, files_by_op[op_hash])
            elif changed and op_hash in host_record.details:
                result.diff = host_record.details[op_hash]
            entry.operations.append(result)
        if entry.changes:
            entry.status = HostStatus.drift


def _collect_results(
    state, active, op_phase, recorder: _Recorder, report: RunReport, run_record: RunRecord
) -> None:
    for host in active:
        entry = report.hosts[host.name]
        if entry.status is HostStatus.failed:
            continue
        host_record = run_record.host(host.name)
        planned = {op.name: op for op in entry.operations}
        entry.operations = []
        for op_hash, op_data in _host_operations(state, host):
            name = host_record.op_names.get(op_hash) or _op_name(state, op_hash)
            meta = op_data.operation_meta
            error = recorder.op_errors.get((host.name, op_hash))
            if error is not None:
                error = _error_detail(name, error, meta, host_record.files.get(op_hash))
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
        entry.checks = list(host_record.checks)
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


def _read_reboot_required(state, active, report: RunReport, caches=None) -> None:
    """Whether each host waits for a reboot, read after its operations ran (a kernel or boot
    command line change marks it; `apply --reboot` acts on it). A recording cache keeps it."""

    def read(host) -> bool:
        cache = (caches or {}).get(host)
        routed = (
            commands_routed(host, cache.recorded_run)
            if cache and cache.asked is not None
            else contextlib.nullcontext()
        )
        with ctx_host.use(host), routed:
            return bool(host.get_fact(RebootRequired))

    hosts = [h for h in active if h not in state.failed_hosts]
    greenlets = {state.pool.spawn(read, host): host for host in hosts}
    gevent.joinall(list(greenlets))
    for greenlet, host in greenlets.items():
        report.hosts[host.name].reboot_required = bool(greenlet.successful() and greenlet.value)


def _error_detail(name: str, error: str, meta, managed: ManagedFile | None) -> str:
    """The operation's name and the last lines its failing command wrote to stderr (what an
    operator needs: "sshd: Bad yes/without-password argument"), never for secret files."""
    tail = stderr_tail(meta)
    if tail is None or (managed is not None and managed.secret):
        return f"{name}: {error}"
    if error.startswith("connection lost"):
        # What the command wrote before the connection died is not why it failed.
        return f"{name}: {error}"
    # A host-level cause (a full disk) is often far above the last lines (apt ends with "dpkg
    # returned an error code"), and apt relays dpkg's messages on stdout: name it first.
    cause = next((ln for ln in output_lines(meta) if any(c in ln for c in HOST_CAUSES)), None)
    if cause is not None and cause not in tail:
        tail.insert(0, cause)
    return f"{name}: {' | '.join(tail) or error}"


def _keep_operation_name(host: str, op_hash: str, name: str) -> None:
    record.host(host).op_names[op_hash] = name


def _host_operations(state, host):
    """The host's operations in the order its deploys added them: pyinfra's global order
    interleaves every host's, so it changes with the set of hosts in the run, and a host's
    report must not (the drift fast path reports a host as a run of the whole fleet did)."""
    return list(state.ops[host].items())


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


# pyinfra logs each host's errors itself; our report says the same once, so keep it quiet.
logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
