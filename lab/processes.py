"""Finding and stopping the lab's processes on the machine, including orphans left by a crash."""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from pathlib import Path

from lab.errors import LabError

PROC = Path("/proc")


def pids() -> list[int]:
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for pid in pids():
        try:
            stat = (PROC / str(pid) / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ")".
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children[parent].append(pid)
    return children


def tree(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """pid and all its descendants, parents first."""
    children = children if children is not None else children_map()
    members, pending = [], [pid]
    while pending:
        current = pending.pop(0)
        members.append(current)
        pending.extend(children.get(current, []))
    return members


def with_cmdline_under(folder: Path) -> dict[int, str]:
    """Processes whose command line names a path in folder: supervisors and systemd-nspawn."""
    needle = str(folder).rstrip("/").encode() + b"/"
    found = {}
    for pid in pids():
        try:
            cmdline = (PROC / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found[pid] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def with_root_under(folder: Path) -> list[int]:
    """Processes running inside a lab host whose root is an overlay with its upper in folder.

    These outlive a SIGKILLed systemd-nspawn (the host's init is re-parented, not killed), so
    they are found by their root mount, not by their parent.
    """
    needle = f"upperdir={str(folder).rstrip('/')}/"
    own_ns = os.readlink("/proc/self/ns/mnt")
    found = []
    for pid in pids():
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") == own_ns:
                continue
            with open(f"/proc/{pid}/mountinfo") as mountinfo:
                for line in mountinfo:
                    fields = line.split()
                    if fields[4] == "/":
                        if needle in line:
                            found.append(pid)
                        break
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        # A zombie has exited: it only waits for its parent, and holds no mounts or devices.
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        raise LabError(f"cannot signal process {pid}: {exc.strerror}") from None


def stop(pids: list[int], deadline_s: float) -> list[int]:
    """Wait for processes to exit until the deadline, then SIGKILL them and everything below.

    Returns the processes that needed SIGKILL. Their descendants die first: killing only
    systemd-nspawn would leave the host's init running as an orphan.
    """
    end = time.monotonic() + deadline_s
    remaining = [pid for pid in pids if alive(pid)]
    while remaining and time.monotonic() < end:
        time.sleep(0.25)
        remaining = [pid for pid in remaining if alive(pid)]
    if remaining:
        children = children_map()
        for pid in remaining:
            for member in reversed(tree(pid, children)):
                send(member, signal.SIGKILL)
    end = time.monotonic() + 10
    while any(alive(pid) for pid in remaining) and time.monotonic() < end:
        time.sleep(0.1)
    return remaining


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        send(pid, signal.SIGKILL)
    end = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.1)
