"""The lab's locks hold against real contenders: separate processes taking the same flock, as
two `gpuinfra lab` commands do. A waiter is seen blocked in /proc/locks, never by a sleep.

Stand-ins: `lab down` and `lab attach-disk` run for real, with the calls that would touch the
machine (root check, processes, mounts, loop devices, links, nft) answering "nothing there":
what is under test is the order of lock, read, write and unlink, not the machine."""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from lab import host, lifecycle, naming, network, processes
from lab.state import LabState, locked, read_state, write_state
from lab.topology import HostSpec, Topology

NAME = "locktest"
GUARD_S = 300.0  # only against a hang: every wait below ends on an event, not on a clock
# Contenders are separate processes, as two `gpuinfra lab` commands are (the CLI patches
# threads into greenlets, which a blocking flock would stall together).
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def labs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "labs"
    folder.mkdir()
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
    /proc/locks for its device and inode)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return 0
    device = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino} "
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if "->" in line and device in line)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw: {what}")
        time.sleep(0.01)


def start(target, *args):
    process = SPAWN.Process(target=target, args=args)
    process.start()
    return process


def finish(process) -> None:
    # Polled, not process.join(): under the CLI's gevent patch (other unit tests import cli)
    # join can return before the process has ended.
    wait_for(lambda: process.exitcode is not None, f"{process.name} to end")
    assert process.exitcode == 0, f"a contender failed or hung (exit code {process.exitcode})"


def inside(signals: Path, label: str) -> bool:
    return (signals / f"{label}.in").exists() and not (signals / f"{label}.out").exists()


def contend(labs: str, signals: str, label: str, other: str) -> None:
    """One command taking the lab's lock (in its own process): it notes when it holds it, and
    holds it until the other is blocked behind it, done, or (the defect) inside at once."""
    naming.LABS_DIR = Path(labs)
    marks = Path(signals)
    lock = lock_path(NAME)
    with locked(NAME):
        (marks / f"{label}.in").touch()
        wait_for(
            lambda: (
                inside(marks, other) or (marks / f"{other}.out").exists() or waiters_on(lock) >= 1
            ),
            f"{other} blocked, done or inside",
        )
        if inside(marks, other):
            (marks / f"overlap-{label}").write_text(f"{label} got the lock while {other} held it")
        (marks / f"{label}.out").touch()


def hold_and_note_inode(labs: str, signals: str) -> None:
    naming.LABS_DIR = Path(labs)
    with locked(NAME):
        (Path(signals) / "inode").write_text(str(os.stat(lock_path(NAME)).st_ino))


def attach(labs: str) -> None:
    """`lab attach-disk` in its own process, the machine's side answering "nothing there"."""
    naming.LABS_DIR = Path(labs)
    lifecycle.require_root_and_tools = lambda *args: None
    host.ensure_disk = lambda paths, size: "/dev/loop-test"
    host.is_running = lambda paths: False
    lifecycle.attach_disk(NAME, "etcd-1", 1 << 30)


def test_down_never_lets_two_holders_in(labs_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """`lab down` holds the lab's lock while a second command waits on it; a third command
    starts once down is over. The waiter and the third command must never hold the lock
    together (down unlinking the file after releasing it let both in: one on the unlinked
    file, one on a new one)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    lock = lock_path(NAME)
    waiter = []

    def read_state_while_a_waiter_queues(name: str):
        # Runs inside down's lock: hold it until the waiter is blocked on it.
        waiter.append(start(contend, str(labs_dir), str(marks), "waiter", "third"))
        wait_for(lambda: waiters_on(lock) >= 1, "the waiter blocked on down's lock")
        return None

    monkeypatch.setattr(lifecycle, "read_state", read_state_while_a_waiter_queues)
    lifecycle.down(NAME)
    third = start(contend, str(labs_dir), str(marks), "third", "waiter")
    finish(waiter[0])
    finish(third)
    assert (marks / "waiter.out").exists() and (marks / "third.out").exists()
    assert [path.read_text() for path in marks.glob("overlap-*")] == []


def test_locked_starts_again_on_a_removed_file(labs_dir: Path, tmp_path: Path) -> None:
    """The waiter of a removed lock file ends up holding the file the path names now."""
    lock = lock_path(NAME)
    with locked(NAME, remove=True):
        waiter = start(hold_and_note_inode, str(labs_dir), str(tmp_path))
        wait_for(lambda: waiters_on(lock) >= 1, "the waiter blocked")
    finish(waiter)
    assert lock.exists() and os.stat(lock).st_ino == int((tmp_path / "inode").read_text())


def test_attach_disk_keeps_a_change_made_while_it_waited(labs_dir: Path) -> None:
    """Another command changes the lab's state while attach-disk waits for the lock: attach-disk
    must write its disk on top of that change, not over it with what it read before waiting."""
    topology = Topology((HostSpec("etcd-1", ("etcd",)), HostSpec("cpu-1", ("cpu_worker",))))
    write_state(LabState(NAME, 3, topology))
    with locked(NAME):
        attaching = start(attach, str(labs_dir))
        wait_for(lambda: waiters_on(lock_path(NAME)) >= 1, "attach-disk blocked on the lock")
        state = read_state(NAME)
        write_state(replace(state, layer=Path("/var/tmp/layer-from-other-command")))
    finish(attaching)
    state = read_state(NAME)
    assert state.layer == Path("/var/tmp/layer-from-other-command")
    assert dict((h.name, h.disk_bytes) for h in state.topology.hosts)["etcd-1"] == 1 << 30
