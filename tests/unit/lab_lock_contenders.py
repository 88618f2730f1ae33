"""The contenders of tests/unit/test_lab_locks.py: each runs in a process of its own
(`python -m tests.unit.lab_lock_contenders NAME ARGS...`), as a `gpuinfra lab` command does,
importing little so that it starts fast on a busy machine."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from lab import naming
from lab.state import locked

NAME = "locktest"
GUARD_S = 300.0  # only against a hang: every wait below ends on an event, not on a clock


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
    from lab import host, lifecycle

    naming.LABS_DIR = Path(labs)
    lifecycle.require_root_and_tools = lambda *args: None
    host.ensure_disk = lambda paths, size: "/dev/loop-test"
    host.is_running = lambda paths: False
    lifecycle.attach_disk(NAME, "etcd-1", 1 << 30)


def up_to_the_cache(labs: str, signals: str) -> None:
    """`lab up` in its own process until it starts the package cache (noted in `signals`), the
    machine's side answering "nothing there" and the hosts never booted."""
    from lab import aptcache, lifecycle, network, rootfs
    from lab.topology import HostSpec, Topology

    def cache_started(mirror) -> None:
        (Path(signals) / "cache").touch()
        raise SystemExit(0)

    naming.LABS_DIR = Path(labs)
    lifecycle.require_root_and_tools = lambda *args: None
    lifecycle._ensure_lab_key = lambda state: None
    rootfs.machine_mirror = lambda: None
    rootfs.ensure_root = lambda mirror: (Path(labs), None)
    network.tune_machine = lambda: None
    aptcache.available = lambda: True
    aptcache.ensure_running = cache_started
    topology = Topology((HostSpec("cpu-1", ("cpu_worker",)),))
    lifecycle.up(NAME, topology, inventory_path=Path(labs) / "cluster.yml", kubernetes=False)


if __name__ == "__main__":
    {
        "contend": contend,
        "hold_and_note_inode": hold_and_note_inode,
        "attach": attach,
        "up_to_the_cache": up_to_the_cache,
    }[sys.argv[1]](*sys.argv[2:])
