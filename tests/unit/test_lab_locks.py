"""The lab's locks hold against real contenders: separate processes taking the same flock, as
two `gpuinfra lab` commands do. A waiter is seen blocked in /proc/locks, never by a sleep.

Stand-ins: `lab down` and `lab attach-disk` run for real, with the calls that would touch the
machine (root check, processes, mounts, loop devices, links, nft) answering "nothing there":
what is under test is the order of lock, read, write and unlink, not the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from lab import host, lifecycle, naming, network, processes
from lab.state import MACHINE_LOCK, LabState, locked, machine_locked, read_state, write_state
from lab.topology import HostSpec, Topology
from tests.unit.lab_lock_contenders import NAME, lock_path, wait_for, waiters_on

REPO = Path(__file__).resolve().parents[2]
# Contenders are separate processes, as two `gpuinfra lab` commands are (the CLI patches
# threads into greenlets, which a blocking flock would stall together).


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


def start(function: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.unit.lab_lock_contenders", function, *args], cwd=REPO
    )


def finish(process: subprocess.Popen) -> None:
    wait_for(lambda: process.poll() is not None, f"contender {process.args[3]} to end")
    assert process.returncode == 0, f"contender {process.args[3]} failed: {process.returncode}"


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
        waiter.append(start("contend", str(labs_dir), str(marks), "waiter", "third"))
        wait_for(lambda: waiters_on(lock) >= 1, "the waiter blocked on down's lock")
        return None

    monkeypatch.setattr(lifecycle, "read_state", read_state_while_a_waiter_queues)
    lifecycle.down(NAME)
    third = start("contend", str(labs_dir), str(marks), "third", "waiter")
    finish(waiter[0])
    finish(third)
    assert (marks / "waiter.out").exists() and (marks / "third.out").exists()
    assert [path.read_text() for path in marks.glob("overlap-*")] == []


def test_locked_starts_again_on_a_removed_file(labs_dir: Path, tmp_path: Path) -> None:
    """The waiter of a removed lock file ends up holding the file the path names now."""
    lock = lock_path(NAME)
    with locked(NAME, remove=True):
        waiter = start("hold_and_note_inode", str(labs_dir), str(tmp_path))
        wait_for(lambda: waiters_on(lock) >= 1, "the waiter blocked")
    finish(waiter)
    assert lock.exists() and os.stat(lock).st_ino == int((tmp_path / "inode").read_text())


def test_attach_disk_keeps_a_change_made_while_it_waited(labs_dir: Path) -> None:
    """Another command changes the lab's state while attach-disk waits for the lock: attach-disk
    must write its disk on top of that change, not over it with what it read before waiting."""
    topology = Topology((HostSpec("etcd-1", ("etcd",)), HostSpec("cpu-1", ("cpu_worker",))))
    write_state(LabState(NAME, 3, topology))
    with locked(NAME):
        attaching = start("attach", str(labs_dir))
        wait_for(lambda: waiters_on(lock_path(NAME)) >= 1, "attach-disk blocked on the lock")
        state = read_state(NAME)
        write_state(replace(state, layer=Path("/var/tmp/layer-from-other-command")))
    finish(attaching)
    state = read_state(NAME)
    assert state.layer == Path("/var/tmp/layer-from-other-command")
    assert dict((h.name, h.disk_bytes) for h in state.topology.hosts)["etcd-1"] == 1 << 30


def test_the_machine_services_start_under_the_machine_lock(labs_dir: Path, tmp_path: Path) -> None:
    """Two labs coming up at once (make test's two processes) must not both start the package
    cache: the second start fails on the taken port. `lab up` starts it only while holding the
    machine's lock: held elsewhere, up waits without starting anything, then starts it."""
    marks = tmp_path / "marks"
    marks.mkdir()
    machine_lock = labs_dir / MACHINE_LOCK
    with machine_locked():  # another lab's `up`, between its own checks and starts
        coming_up = start("up_to_the_cache", str(labs_dir), str(marks))
        wait_for(
            lambda: waiters_on(machine_lock) >= 1 or coming_up.poll() is not None,
            "up blocked on the machine's lock, or ended",
        )
        assert not (marks / "cache").exists(), "up started the cache while the lock was held"
    finish(coming_up)
    assert (marks / "cache").exists()
