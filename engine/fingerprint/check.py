"""The fast check of a drift: every recorded host asked at once over OpenSSH (`Asking`), its
answer compared with its record (`Probes`), the hosts left to the exact check named."""

from __future__ import annotations

import secrets
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.fingerprint.keys import common_digest, host_key, host_roles, inputs_stand
from engine.fingerprint.probe import differences, probe_script, read_probe
from engine.fingerprint.records import Record, load_record
from engine.reports import HostReport, HostStatus, OperationResult
from toolkit.ssh import SSHSettings, ssh_settings

if TYPE_CHECKING:
    from inventory.model import LoadedCluster


# -- the fast check --------------------------------------------------------------------------


@dataclass
class FastCheck:
    reports: dict[str, HostReport] = field(default_factory=dict)  # answered in one round trip
    exact: dict[str, str] = field(default_factory=dict)  # host -> why it needs the exact check
    seconds: float = 0.0
    early: int = 0  # hosts whose probe the command line had sent (send_early)
    alone: bool = False  # answered without loading the inventory (settled)
    started: float = 0.0  # time.monotonic() when the first probe left


# OpenSSH clients at once when --parallel does not say: each is a process of its own (about
# 6 MiB and a few descriptors), unlike pyinfra's connections inside one process.
DEFAULT_PARALLEL = 200
KEEPALIVE_S = 5
# A host whose commands have not all answered by then is left to the exact check.
PROBE_TIMEOUT_S = 120
Answer = tuple[int, bytes, bytes, float]  # exit code (-1: none), stdout, stderr, seconds


def probe_argv(ssh: SSHSettings, address: str) -> list[str]:
    """The ssh command line of one host's probe; the script goes on stdin (one argument of a
    remote command is limited to 128 KiB). A silent peer is dropped as the exact check drops
    one (engine/runner.py DEAD_PEER_S)."""
    argv = [*ssh.argv(address), "sh", "-s"]
    argv[1:1] = ["-o", f"ServerAliveInterval={KEEPALIVE_S}", "-o", "ServerAliveCountMax=6"]
    return argv


@dataclass(eq=False)  # each one is itself: found in the queue by identity
class _Sent:
    argv: list[str]
    commands: list[str]
    script: bytes
    began: float = 0.0
    process: subprocess.Popen | None = None
    answer: Answer | None = None
    done: threading.Event = field(default_factory=threading.Event)
    dropped: bool = False


class Asking:
    """Probes on their way, at most `parallel` at once. The caller's thread starts each ssh
    (`send`), so that no host waits for a thread to be scheduled before its connection begins;
    `go` then gives each a thread that writes its script and reads its answer, and that starts
    a waiting host's ssh when its own is done."""

    def __init__(self, marker: str, parallel: int):
        self.marker = marker
        self.started = time.monotonic()
        self.sent: dict[str, _Sent] = {}
        self._free = max(1, parallel)
        self._waiting: deque[_Sent] = deque()
        self._unattended: list[_Sent] = []
        self._lock = threading.Lock()
        self._cancelled = False

    def send(self, name: str, argv: list[str], commands: list[str]) -> None:
        """Ask `name` over `argv` for the outputs of `commands` (probe_script)."""
        script = probe_script(commands, self.marker).encode()
        sent = self.sent[name] = _Sent(argv, commands, script)
        with self._lock:
            if not self._free:
                self._waiting.append(sent)
                return
            self._free -= 1
        self._start(sent)
        self._unattended.append(sent)

    def go(self) -> None:
        for sent in self._unattended:
            threading.Thread(target=self._talk, args=(sent,), daemon=True).start()
        self._unattended.clear()

    def take(self, name: str, argv: list[str], commands: list[str]) -> bool:
        """Whether `name`'s probe was sent with exactly this command line and these commands
        (so with the same script: probe_script is a function of them and the marker); one sent
        otherwise is stopped."""
        sent = self.sent.get(name)
        if sent is not None and (sent.argv, sent.commands) == (argv, commands):
            return True
        self.drop(name)
        return False

    def drop(self, name: str) -> None:
        """Stop asking `name` (its answer is not needed): never started if it still waits."""
        sent = self.sent.pop(name, None)
        if sent is None:
            return
        with self._lock:
            sent.dropped = True
            if sent in self._waiting:
                self._waiting.remove(sent)
                sent.answer = (-1, b"", b"not asked", 0.0)
                sent.done.set()
                return
        if sent.process is not None and sent.process.poll() is None:
            sent.process.kill()

    def answer(self, name: str) -> Answer:
        sent = self.sent[name]
        sent.done.wait()
        assert sent.answer is not None
        return sent.answer

    def cancel(self) -> None:
        """Stop every probe (the caller cannot go on, or the process exits)."""
        with self._lock:
            self._cancelled = True
            waiting, self._waiting = self._waiting, deque()
        for sent in waiting:
            sent.answer = (-1, b"", b"cancelled", 0.0)
            sent.done.set()
        for name in list(self.sent):
            self.drop(name)

    def _start(self, sent: _Sent) -> None:
        sent.began = time.monotonic()
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        try:
            sent.process = subprocess.Popen(sent.argv, **pipes)
        except OSError as error:  # no ssh client: the exact check says why it cannot connect
            sent.answer = (-1, b"", str(error).encode(), 0.0)
            sent.done.set()
            return
        if sent.dropped:  # dropped while a finished talker was starting it
            sent.process.kill()

    def _talk(self, sent: _Sent | None) -> None:
        while sent is not None:
            if sent.process is not None:
                sent.answer = self._exchange(sent)
                sent.done.set()
            with self._lock:
                sent = self._waiting.popleft() if self._waiting and not self._cancelled else None
                if sent is None:
                    self._free += 1
            if sent is not None:
                self._start(sent)

    @staticmethod
    def _exchange(sent: _Sent) -> Answer:
        process = sent.process
        assert process is not None
        with process:
            try:
                output, errors = process.communicate(sent.script, timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                output, errors = b"", b"no answer in %d s" % PROBE_TIMEOUT_S
                return -1, output, errors, time.monotonic() - sent.began
        return process.returncode, output, errors, time.monotonic() - sent.began


def new_marker() -> str:
    return f"gpuinfra-fingerprint-{secrets.token_hex(8)}"


class Probes:
    """Every selected host with a record asked at once, one ssh each (`parallel` at a time),
    started before the caller has finished its own checks; `finish` computes the keys while
    the hosts answer, then compares. With `early` (send_early), a host's probe already on its
    way is kept when it is exactly the one this would send."""

    def __init__(
        self,
        loaded: LoadedCluster,
        hosts: list[str],
        roles: Iterable[str],
        connect_timeout: int,
        parallel: int | None = None,
        early: Asking | None = None,
    ):
        self.result = FastCheck()
        self.records: dict[str, Record] = {}
        ssh = ssh_settings(loaded, connect_timeout)
        wanted = tuple(roles)
        hosts_of = loaded.cluster.hosts
        for name in hosts:
            record = load_record(loaded.state_dir, name)
            if record is None:
                self.result.exact[name] = "no converged record"
            elif host_roles(hosts_of[name].groups, wanted, cluster=loaded.cluster) != record.roles:
                self.result.exact[name] = "other roles than its record"
            else:
                self.records[name] = record
        if early is not None and parallel is None:  # sent DEFAULT_PARALLEL at a time too
            self.asking = early
        else:
            if early is not None:
                early.cancel()
            workers = min(len(self.records), parallel or DEFAULT_PARALLEL)
            self.asking = Asking(new_marker(), workers)
        for name in set(self.asking.sent) - set(self.records):
            self.asking.drop(name)
        for name, record in self.records.items():
            argv = probe_argv(ssh, str(loaded.cluster.hosts[name].address))
            commands = [command for command, _, _ in record.commands]
            if self.asking is early and early.take(name, argv, commands):
                self.result.early += 1
            else:
                self.asking.send(name, argv, commands)
        self.asking.go()

    def cancel(self) -> None:
        """Stop asking (the caller found the command cannot go on)."""
        self.asking.cancel()

    def finish(self, loaded: LoadedCluster) -> FastCheck:
        """The keys (from the inputs while the clock cannot change the files; else the files
        rendered from `loaded`, which must not create state), then each host's answers against
        its record."""
        result = self.result
        common = common_digest(loaded)
        rendered = [n for n, r in self.records.items() if not inputs_stand(r, common, n)]
        if rendered:
            from engine.context import host_contexts

            contexts = {ctx.name: ctx for ctx in host_contexts(loaded)}  # cluster files once
            for name in rendered:
                if host_key(contexts[name], common) != self.records[name].key:
                    # Checked exactly, whatever it answers.
                    result.exact[name] = "code, inventory or state changed since its record"
                    del self.records[name]
                    self.asking.drop(name)
        answers = {name: self.asking.answer(name) for name in self.records}
        for name, record in self.records.items():
            matched = _matched(name, record, answers[name], self.asking.marker)
            if isinstance(matched, str):
                result.exact[name] = matched
            else:
                result.reports[name] = matched
        result.started = self.asking.started
        result.seconds = time.monotonic() - result.started
        return result


def _matched(name: str, record: Record, answer: Answer, marker: str) -> HostReport | str:
    """The host's recorded report when its answer matches its record, else why not."""
    code, output, errors, seconds = answer
    if code in (255, -1):  # ssh failed, or no answer in time: the exact check says why
        return f"ssh: {errors.decode(errors='replace').strip() or 'failed'}"
    commands = [command for command, _, _ in record.commands]
    found = differences(record, read_probe(output, marker, commands))
    if found:
        return f"differs from its record ({found[0]})"
    return HostReport(
        name,
        HostStatus.ok,
        operations=[OperationResult(role, op, False) for role, op in record.operations],
        seconds=seconds,
        reboot_required=record.reboot_required,
        notes=list(record.notes),
    )


def summary(result: FastCheck, total: int) -> str:
    why: dict[str, int] = {}
    for reason in result.exact.values():
        short = reason.split(" (", 1)[0]
        why[short] = why.get(short, 0) + 1
    text = (
        f"{len(result.reports)} of {total} hosts matched their converged record "
        f"(one round trip each, {result.seconds:.1f} s)"
    )
    if result.alone:
        text = text[:-1] + "; the inventory unchanged since the last apply: not loaded again)"
    elif result.early:
        text = text[:-1] + f"; {result.early} sent before the inventory was loaded)"
    if why:
        text += "; checked operation by operation: " + ", ".join(
            f"{count} {reason}" for reason, count in sorted(why.items())
        )
    return text
