"""The benchmark's measurement of one command, with real processes on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter, as the benchmark runs: the test process may have imported gevent's
# patched threading (the CLI's apply does), under which the sampling thread cannot run beside
# os.wait4.
MEASURE = """
import json, sys
held = bytearray(200 * 2**20)
held[::4096] = b"\\1" * len(held[::4096])  # touched: resident
from benchmarks.measure import run_measured
script = "import time; b = bytearray(30 * 2**20); b[::4096] = b'1' * len(b[::4096]); "
script += "time.sleep(0.6)"
measurement, _ = run_measured("python", 1, [sys.executable, "-c", script])
print(json.dumps(measurement.to_json()))
"""


def test_the_largest_process_is_the_commands_own_not_the_benchmarks():
    """Linux carries a process's peak resident size across fork and exec: a small command
    started by a large benchmark process reports the benchmark's size in its rusage. The
    figure must be the command's own (the benchmark holds 200 MiB here, the command 30 MiB)."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE], capture_output=True, text=True, cwd=REPO, check=True
    )
    measurement = json.loads(done.stdout)
    assert measurement["returncode"] == 0
    assert 30 < measurement["max_process_mib"] < 150, measurement
    assert measurement["peak_tree_mib"] >= measurement["max_process_mib"]
    assert measurement["machine_cpu_seconds"] >= measurement["cpu_seconds"] > 0
