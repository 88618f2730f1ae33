"""Run one engine command and measure it: wall time, CPU time and the controller's peak memory.

Peak memory is the largest sum of the resident set sizes of the command's whole process tree
(the engine, Ansible's forked workers, their ssh clients), sampled every 0.1 s with psutil.
RSS counts pages shared between forked workers once per process, so for Ansible the figure
is an upper bound; `max_process_mib` (the largest single process, from the same samples) is the
lower bound. (Not the kernel's rusage: Linux carries a process's peak across fork and exec, so
every command started by a large benchmark process would report that process's size.) The
lab's hosts are not part of either figure.

The machine's CPU seconds over the run (from /proc/stat: every process, the lab's hosts'
included, and this benchmark's own sampling) say what the check cost the machine the hosts
share with the controller; on a quiet machine that is the engine's work on both sides.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

SAMPLE_SECONDS = 0.1


@dataclass
class Measurement:
    engine: str
    hosts: int
    seconds: float
    cpu_seconds: float  # user + system of the whole tree
    peak_tree_mib: float
    max_process_mib: float
    returncode: int
    load_before: float  # 1-minute load average of the machine when the run started
    load_after: float
    changes: int | None = None  # operations the engine says would change (0: a no-op)
    machine_cpu_seconds: float | None = None  # every CPU's busy time over the run
    # gpuinfra only: the hosts' preparation seconds summed, over the run's wall time: how many
    # hosts were being worked on at once, on average.
    parallelism: float | None = None
    output_tail: str = ""  # only for a run that failed

    def to_json(self) -> dict:
        return asdict(self)


def machine_busy_seconds() -> float:
    """Busy time of all the machine's CPUs since boot: user, nice, system, irq, softirq and
    steal from /proc/stat (idle and iowait left out)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _tree_rss(root: psutil.Process) -> list[int]:
    """The resident set size of each process of the tree."""
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    sizes = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            sizes.append(process.memory_info().rss)
    return sizes


def run_measured(
    engine: str,
    hosts: int,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 1800,
) -> tuple[Measurement, str]:
    """Run argv to completion (stdin closed) and measure it; also return its stdout."""
    load_before = os.getloadavg()[0]
    busy_before = machine_busy_seconds()
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    root = psutil.Process(process.pid)
    peak = largest = 0
    stdout: list[bytes] = []
    stderr: list[bytes] = []
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, largest
        while not done.is_set():
            sizes = _tree_rss(root)
            peak, largest = max(peak, sum(sizes)), max(largest, *sizes, 0)
            done.wait(SAMPLE_SECONDS)

    threads = [
        threading.Thread(target=sample, daemon=True),
        threading.Thread(target=lambda: stdout.extend(iter(process.stdout.read1, b""))),
        threading.Thread(target=lambda: stderr.extend(iter(process.stderr.read1, b""))),
    ]
    for thread in threads:
        thread.start()
    killer = threading.Timer(timeout, process.kill)
    killer.start()
    # wait4, not Popen.wait: its rusage is this command's tree alone (its CPU time).
    _, status, usage = os.wait4(process.pid, 0)
    killer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    busy = machine_busy_seconds() - busy_before
    done.set()
    for thread in threads:
        thread.join()
    output = b"".join(stdout).decode(errors="replace")
    errors = b"".join(stderr).decode(errors="replace")
    cpu = usage.ru_utime + usage.ru_stime
    return Measurement(
        engine=engine,
        hosts=hosts,
        seconds=round(seconds, 3),
        cpu_seconds=round(cpu, 3),
        peak_tree_mib=round(peak / 2**20, 1),
        max_process_mib=round(largest / 2**20, 1),
        returncode=process.returncode,
        load_before=round(load_before, 2),
        load_after=round(os.getloadavg()[0], 2),
        machine_cpu_seconds=round(busy, 2),
        output_tail=(output[-1500:] + "\n[stderr]\n" + errors[-1500:])
        if process.returncode
        else "",
    ), output
