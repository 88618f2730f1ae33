"""The cluster-wide apply lock: one `gpuinfra apply` at a time per cluster state directory.

`.state/apply.lock` is held with fcntl.flock for the life of the process (the kernel releases it
when the process ends, crash included) and holds a JSON record of its holder: who, on which
controller, which pid, since when, with which command line. The record is cleared on release;
one left behind names a holder that ended without releasing (killed): from this controller,
its pid is gone and the next apply takes over; from another controller (a shared state folder),
nobody here can tell whether it still runs, so `--break-lock` is needed to take over.
Plan and drift never take the lock; they read the record and say when an apply holds it.

"This controller" is a machine identity, not a host name: /etc/machine-id and the host name
(two containers or cloned VMs may share either one alone), and the boot id, so a record from
before a reboot of this machine is known to be dead. A pid is only judged on the machine and
boot that wrote it.

A leaf module: standard library only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import getpass
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

LOCK_FILE = "apply.lock"
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
# How long a refused apply waits for the holder's record to appear: 2 s, far above the
# microseconds between the holder's flock and its write.
RECORD_WAIT_TRIES = 20
RECORD_WAIT_S = 0.1


@dataclass(frozen=True)
class LockHolder:
    user: str
    controller: str  # the controller's host name
    pid: int
    started: str  # ISO 8601, UTC
    command: str
    machine_id: str = ""  # /etc/machine-id; "" where there is none (a record from before it)
    boot_id: str = ""  # the kernel's boot id when the record was written

    def describe(self) -> str:
        machine = f" (machine {self.machine_id[:12]})" if self.machine_id else ""
        return (
            f"{self.user}@{self.controller}{machine} pid {self.pid} since {self.started} "
            f"({self.command})"
        )

    @property
    def on_this_controller(self) -> bool:
        """Written on this machine: the same host name and, where both have one, the same
        machine id (a host name alone is shared by containers and cloned VMs)."""
        if self.controller != socket.gethostname():
            return False
        here = machine_id()
        return not (self.machine_id and here) or self.machine_id == here

    @property
    def from_an_earlier_boot(self) -> bool:
        """On this machine, before its last boot: its process has ended whatever its pid."""
        here = boot_id()
        return bool(self.boot_id and here) and self.boot_id != here


class LockHeld(Exception):
    """Another apply holds the lock (or left a record this controller cannot judge)."""

    def __init__(self, path: Path, holder: LockHolder | None, *, stale: bool = False):
        who = holder.describe() if holder else "a process that wrote no record yet"
        if stale:
            message = (
                f"{path}: an apply by {who} on another controller left this lock record; "
                "if it no longer runs, pass --break-lock"
            )
        else:
            message = f"{path}: another apply holds the cluster lock: {who}"
        super().__init__(message)
        self.holder = holder


@dataclass
class HeldLock:
    path: Path
    holder: LockHolder
    taken_over: LockHolder | None = None  # the record a crashed apply left, now replaced
    notes: list[str] = field(default_factory=list)  # what taking it did (a rollout stopped)


def this_process(command: str | None = None) -> LockHolder:
    return LockHolder(
        user=getpass.getuser(),
        controller=socket.gethostname(),
        pid=os.getpid(),
        started=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        command=command or " ".join(sys.argv),
        machine_id=machine_id(),
        boot_id=boot_id(),
    )


def machine_id() -> str:
    """This machine's id (systemd's /etc/machine-id, else D-Bus's copy); "" without one."""
    for path in MACHINE_ID_FILES:
        with contextlib.suppress(OSError):
            if text := Path(path).read_text().strip():
                return text
    return ""


def boot_id() -> str:
    try:
        return Path(BOOT_ID_FILE).read_text().strip()
    except OSError:
        return ""


@contextlib.contextmanager
def apply_lock(
    state_dir: Path, command: str | None = None, *, break_lock: bool = False
) -> Iterator[HeldLock]:
    """Hold the cluster's apply lock for the block; LockHeld when another apply has it.

    `break_lock` replaces a record left by an apply on another controller; it never takes the
    lock from a live holder (the flock decides that, not the record)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise LockHeld(path, _await_record(fd)) from None
        previous = _parse(_read(fd))
        if previous and not previous.on_this_controller and not break_lock:
            raise LockHeld(path, previous, stale=True)
        holder = this_process(command)
        _write(fd, json.dumps(asdict(holder)) + "\n")
        try:
            yield HeldLock(path, holder, previous)
        finally:
            _write(fd, "")  # released cleanly: no record left to judge
    finally:
        os.close(fd)  # releases the flock


def current_holder(state_dir: Path) -> LockHolder | None:
    """Who holds the apply lock now, read without taking it (for plan and drift): the record,
    when its process still runs (from this controller) or cannot be checked (another one)."""
    try:
        holder = _parse((state_dir / LOCK_FILE).read_text())
    except OSError:
        return None
    if holder is None:
        return None
    if holder.on_this_controller and (holder.from_an_earlier_boot or not _alive(holder.pid)):
        return None  # a crashed apply's record: nobody holds the lock
    return holder


def _await_record(fd: int) -> LockHolder | None:
    # The holder writes its record right after taking the flock: an apply started at the same
    # moment may look before it is there.
    for _ in range(RECORD_WAIT_TRIES):
        holder = _parse(_read(fd))
        if holder is not None:
            return holder
        time.sleep(RECORD_WAIT_S)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    return True


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _write(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, text.encode())
    os.fsync(fd)


def _parse(text: str) -> LockHolder | None:
    try:
        data = json.loads(text)
        return LockHolder(**data)
    except (ValueError, TypeError):
        return None
