"""The benchmark's measurement of one command, with real processes on this machine."""

from __future__ import annotations

import sys

from benchmarks.measure import run_measured


def test_the_largest_process_is_the_commands_own_not_the_benchmarks():
    """Linux carries a process's peak resident size across fork and exec: a small command
    started by a large benchmark process reports the benchmark's size in its rusage. The
    figure must be the command's own (the benchmark holds 200 MiB here, the command 30 MiB)."""
    held = bytearray(200 * 2**20)
    held[::4096] = b"\1" * len(held[::4096])  # touched: resident
    script = (
        "import time; b = bytearray(30 * 2**20); b[::4096] = b'1' * len(b[::4096]); time.sleep(0.6)"
    )
    measurement, _ = run_measured("python", 1, [sys.executable, "-c", script])
    assert measurement.returncode == 0
    assert 30 < measurement.max_process_mib < 150, measurement
    assert measurement.peak_tree_mib >= measurement.max_process_mib
    assert measurement.machine_cpu_seconds is not None and measurement.machine_cpu_seconds >= 0
    del held
