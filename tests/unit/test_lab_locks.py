"""The lab's locks hold against real contenders: threads taking the same flock, as two
`gpuinfra lab` commands would (flock locks belong to an open file, so threads of one process
contend exactly as processes do). A waiter is seen blocked in /proc/locks, never by a sleep.

Stand-ins: `lab down` and `lab attach-disk` run for real, with the calls that would touch the
machine (root check, processes, mounts, loop devices, links, nft) answering "nothing there":
what is under test is the order of lock, read, write and unlink, not the machine."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from lab import host, lifecycle, naming, network, processes
from lab.state import LabState, locked, read_state, write_state
from lab.topology import HostSpec, Topology

NAME = "locktest"
GUARD_S = 60.0  # only against a hang: every wait below ends on an event, not on a clock


@pytest.fixture
def labs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "labs"
    monkeypatch.setattr(naming, "LABS_DIR", folder)
    monkeypatch.setattr(lifecycle, "require_root_and_tools", lambda *args: None)
    monkeypatch.setattr(processes, "with_cmdline_under", lambda folder: {})
    monkeypatch.setattr(processes, "with_root_under", lambda folder: [])
    monkeypatch.setattr(host, "mounted_paths", lambda: set())
    monkeypatch.setattr(host, "loop_devices_under", lambda folder: [])
    monkeypatch.setattr(network, "lab_netns", lambda lab: [])
    monkeypatch.setattr(network, "lab_links", lambda lab: [])
    monkeypatch.setattr(network, "nft_table_exists", lambda lab: False)
    monkeypatch.setattr(network, "remove_network", lambda lab: None)
    return folder


def lock_path(name: str) -> Path:
    return naming.LABS_DIR / f".{name}.lock"


def waiters_on(path: Path) -> int:
    """How many flock requests wait on the file `path` names now (the `->` lines of
    /proc/locks for its inode)."""
    try:
        inode = os.stat(path).st_ino
    except FileNotFoundError:
        return 0
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if "->" in line and f":{inode} " in line)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw: {what}")
        time.sleep(0.01)


def start(target, *args) -> threading.Thread:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test's thread)
            errors.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def finish(thread: threading.Thread) -> None:
    thread.join(GUARD_S)
    assert not thread.is_alive(), "a contender never finished"
    assert not thread.errors, thread.errors  # type: ignore[attr-defined]


def test_down_never_lets_two_holders_in(labs_dir: Path, monkeypatch) -> None:
    """`lab down` holds the lab's lock while a second command waits on it; a third command
    starts once down is over. The waiter and the third command must never hold the lock
    together (down unlinking the file after releasing it let both in: one on the unlinked
    file, one on a new one)."""
    lock = lock_path(NAME)
    waiter_queued = threading.Event()
    inside: set[str] = set()
    overlaps: list[str] = []
    guard = threading.Lock()

    def read_state_while_waiter_queues(name: str):
        # Runs inside down's lock: hold it until the waiter is blocked on it.
        waiter_queued.wait(GUARD_S)
        wait_for(lambda: waiters_on(lock) >= 1, "the waiter blocked on down's lock")
        return None

    monkeypatch.setattr(lifecycle, "read_state", read_state_while_waiter_queues)

    def contender(label: str, other: str) -> None:
        with locked(NAME):
            with guard:
                inside.add(label)
                if other in inside:
                    overlaps.append(f"{label} got the lock while {other} held it")
            # Hold until the other is blocked behind us, done, or (the defect) inside too.
            wait_for(
                lambda: other in inside or other in done or waiters_on(lock) >= 1,
                f"{other} blocked, done or inside",
            )
            with guard:
                inside.discard(label)
        done.add(label)

    done: set[str] = set()
    lab_down = start(lifecycle.down, NAME)
    wait_for(lock.exists, "down holding the lock")
    waiter = start(contender, "waiter", "third")
    waiter_queued.set()
    finish(lab_down)
    third = start(contender, "third", "waiter")
    finish(waiter)
    finish(third)
    assert done == {"waiter", "third"}
    assert overlaps == []


def test_locked_starts_again_on_a_removed_file(labs_dir: Path) -> None:
    """The waiter of a removed lock file ends up holding the file the path names now."""
    lock = lock_path(NAME)
    holder_in, release = threading.Event(), threading.Event()
    held_inode: list[int] = []

    def remover() -> None:
        with locked(NAME, remove=True):
            holder_in.set()
            release.wait(GUARD_S)

    def waiter() -> None:
        with locked(NAME):
            held_inode.append(os.stat(lock).st_ino)

    first = start(remover)
    holder_in.wait(GUARD_S)
    second = start(waiter)
    wait_for(lambda: waiters_on(lock) >= 1, "the waiter blocked")
    release.set()
    finish(first)
    finish(second)
    assert held_inode and lock.exists() and os.stat(lock).st_ino == held_inode[0]


def test_attach_disk_keeps_a_change_made_while_it_waited(labs_dir: Path, monkeypatch) -> None:
    """Another command changes the lab's state while attach-disk waits for the lock: attach-disk
    must write its disk on top of that change, not over it with what it read before waiting."""
    topology = Topology((HostSpec("etcd-1", ("etcd",)), HostSpec("cpu-1", ("cpu_worker",))))
    write_state(LabState(NAME, 3, topology))
    monkeypatch.setattr(host, "ensure_disk", lambda paths, size: "/dev/loop-test")
    monkeypatch.setattr(host, "is_running", lambda paths: False)
    lock = lock_path(NAME)
    holding, release = threading.Event(), threading.Event()

    def other_command() -> None:
        with locked(NAME):
            holding.set()
            release.wait(GUARD_S)
            state = read_state(NAME)
            write_state(replace(state, layer=Path("/var/tmp/layer-from-other-command")))

    other = start(other_command)
    holding.wait(GUARD_S)
    attach = start(lifecycle.attach_disk, NAME, "etcd-1", 1 << 30)
    wait_for(lambda: waiters_on(lock) >= 1, "attach-disk blocked on the lock")
    release.set()
    finish(other)
    finish(attach)
    state = read_state(NAME)
    assert state.layer == Path("/var/tmp/layer-from-other-command")
    assert dict((h.name, h.disk_bytes) for h in state.topology.hosts)["etcd-1"] == 1 << 30
