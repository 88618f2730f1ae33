"""The scale suite: inventories of 1,000 and 7,500 hosts (benchmarks/fleet.py), no lab needed.

Per size: `gpuinfra inventory validate` (median of the repeats), `gpuinfra render` of every
host, and the cost of rendering one host's files (every phase's managed files, what the runner
prepares for each host before it connects) measured in one process on hosts spread through
the inventory: that cost must not grow with the fleet.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.fleet import write_fleet
from benchmarks.measure import run_measured

BIN = Path(sys.executable).parent
GPUINFRA = str(BIN / "gpuinfra")
SIZES = (1000, 7500)
# Hosts sampled for the per-host cost: enough for a stable median, few enough to be quick.
SAMPLED_HOSTS = 200

PER_HOST_PROBE = """
import json, statistics, sys, time
import cli.main  # the same process setup as the command line
from inventory.loader import load
from engine.render import host_contexts, host_files

loaded = load(sys.argv[1])
started = time.process_time()
contexts = host_contexts(loaded)
contexts_seconds = time.process_time() - started
step = max(1, len(contexts) // int(sys.argv[2]))
costs, lines = [], []
for ctx in contexts[::step]:
    started = time.process_time()
    files = host_files(ctx)
    costs.append(time.process_time() - started)
    lines.append(sum(f.content.count("\\n") for f in files))
print(json.dumps({
    "contexts_seconds": contexts_seconds,
    "sampled_hosts": len(costs),
    "median_ms_per_host": statistics.median(costs[1:] or costs) * 1000,
    "median_lines_per_host": statistics.median(lines),
    "hosts_file_lines": next(
        f.content.count("\\n") for f in host_files(contexts[-1]) if f.path == "/etc/hosts"
    ),
}))
"""


def scale(sizes: tuple[int, ...], repeats: int, work: Path, log) -> dict:
    import json

    results: dict[str, dict] = {}
    for size in sizes:
        folder = work / f"fleet-{size}"
        inventory = write_fleet(size, folder)
        validate = []
        for _ in range(repeats):
            measurement, _ = run_measured(
                "validate", size, [GPUINFRA, "inventory", "validate", str(inventory)]
            )
            if measurement.returncode != 0:
                raise RuntimeError(f"validate {size}: {measurement.output_tail}")
            validate.append(measurement)
        out = folder / "render"
        shutil.rmtree(out, ignore_errors=True)
        render, _ = run_measured(
            "render", size, [GPUINFRA, "render", str(inventory), "--out", str(out)], timeout=7200
        )
        if render.returncode != 0:
            raise RuntimeError(f"render {size}: {render.output_tail}")
        rendered_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        shutil.rmtree(out, ignore_errors=True)
        started = time.monotonic()
        probe = subprocess.run(
            [sys.executable, "-c", PER_HOST_PROBE, str(inventory), str(SAMPLED_HOSTS)],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        per_host = json.loads(probe.stdout)
        results[str(size)] = {
            "hosts": size,
            "validate_seconds": [m.seconds for m in validate],
            "validate_cpu_seconds": [m.cpu_seconds for m in validate],
            "validate_median_seconds": statistics.median(m.seconds for m in validate),
            "validate_median_cpu_seconds": statistics.median(m.cpu_seconds for m in validate),
            "validate_peak_mib": max(m.peak_tree_mib for m in validate),
            "render_seconds": render.seconds,
            "render_cpu_seconds": render.cpu_seconds,
            "render_peak_mib": render.peak_tree_mib,
            "rendered_mib": round(rendered_bytes / 2**20, 1),
            "per_host": per_host,
            "load_before": [m.load_before for m in validate] + [render.load_before],
        }
        log(
            f"  scale {size}: validate {results[str(size)]['validate_median_seconds']:.2f} s "
            f"(cpu {results[str(size)]['validate_median_cpu_seconds']:.2f}), render "
            f"{render.seconds:.1f} s (cpu {render.cpu_seconds:.1f}), "
            f"{per_host['median_ms_per_host']:.2f} ms per host "
            f"({time.monotonic() - started:.0f} s probe)"
        )
    return results
