"""The command line's own cost (issue 18's target 2, no lab): CPU seconds (user + system, the
process's rusage) of `gpuinfra --help` and `gpuinfra inventory validate inventory/sample`,
each run RUNS times, the two commands alternating so that the machine's load, which moves
during the runs, weighs on both alike.

The commands run as an installed one does, with its bytecode caches (`__pycache__`) written:
one unmeasured run of each writes them first, and PYTHONDONTWRITEBYTECODE is cleared for the
runs (an editable install compiles nothing at install time, and a variable left set in the
shell would make every run compile gpuinfra's modules again).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.measure import run_measured

GPUINFRA = str(Path(sys.executable).parent / "gpuinfra")
REPO = Path(__file__).resolve().parents[1]
RUNS = 10
COMMANDS: dict[str, list[str]] = {
    "help": ["--help"],
    "validate": ["inventory", "validate", "inventory/sample"],
}
# An empty value counts as unset for Python's PYTHON* variables.
WRITE_BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}


def command_line(log: Callable[[str], None], runs: int = RUNS) -> dict[str, dict]:
    for argv in COMMANDS.values():
        warm, _ = run_measured("warm-up", 0, [GPUINFRA, *argv], env=WRITE_BYTECODE, cwd=REPO)
        if warm.returncode != 0:
            raise RuntimeError(f"gpuinfra {' '.join(argv)}: {warm.output_tail}")
    measured: dict[str, list] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, argv in COMMANDS.items():
            measurement, _ = run_measured(name, 0, [GPUINFRA, *argv], env=WRITE_BYTECODE, cwd=REPO)
            if measurement.returncode != 0:
                raise RuntimeError(f"gpuinfra {' '.join(argv)}: {measurement.output_tail}")
            measured[name].append(measurement)
    results = {}
    for name, measurements in measured.items():
        cpu = [m.cpu_seconds for m in measurements]
        results[name] = {
            "command": " ".join(["gpuinfra", *COMMANDS[name]]),
            "runs": len(measurements),
            "cpu_seconds": cpu,
            "median_cpu_seconds": statistics.median(cpu),
            "min_cpu_seconds": min(cpu),
            "max_cpu_seconds": max(cpu),
            "median_seconds": statistics.median(m.seconds for m in measurements),
            "load_before": [m.load_before for m in measurements],
        }
        log(
            f"  {results[name]['command']}: CPU median {results[name]['median_cpu_seconds']:.3f}"
            f" s ({min(cpu):.3f} to {max(cpu):.3f}) over {len(cpu)} runs, load "
            f"{statistics.median(m.load_before for m in measurements):.1f}"
        )
    return results
