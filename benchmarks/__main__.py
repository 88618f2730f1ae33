"""`python -m benchmarks` (what `make bench` runs): run the suites, then write the results.

Results merge into OUT/results.json by suite and size, so one size can be rerun alone; the
Markdown table and the plots are always rewritten from the whole file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

from benchmarks import commandline, control_plane, flow_control, jobs, report, scale, suites
from toolkit.limits import raise_open_files_limit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--sizes", default="10 50 100 200", help="host counts for drift")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each engine per size")
    parser.add_argument(
        "--suites",
        default="bootstrap,drift",
        help="comma-separated: bootstrap, drift, scale, cli, jobs, controlplane",
    )
    parser.add_argument(
        "--jobs-sizes",
        default=" ".join(map(str, jobs.SIZES)),
        help="fleet lab sizes of the jobs suite; past the first, each only with "
        f"{jobs.MIN_AVAILABLE_GIB:.0f} GiB available with both labs up",
    )
    parser.add_argument(
        "--cp-sizes",
        default=" ".join(map(str, control_plane.SIZES)),
        help="simulated nodes of the controlplane suite, in order; a fleet that cannot get "
        "Ready ends the growth",
    )
    parser.add_argument(
        "--cp-settle",
        type=float,
        default=control_plane.SETTLE_S,
        help="seconds the controlplane suite waits at each size once its fleet is Ready",
    )
    parser.add_argument(
        "--cp-events-in-main",
        action="store_true",
        help="the controlplane suite with the Events in the main etcd: the before of the "
        "sample's own etcd for Events, kept apart in results.json",
    )
    parser.add_argument(
        "--cp-apf",
        action="store_true",
        help="the controlplane suite ends with a fleet operation with and without "
        "fleet_policy's flow schema, at the largest size held",
    )
    parser.add_argument(
        "--cp-sized-for",
        type=int,
        metavar="NODES",
        help="the controlplane suite with the API servers' slots and etcd's quota sized for "
        "NODES nodes (inventory/sizing.py): the after of the sizing comparison, kept apart "
        "in results.json",
    )
    parser.add_argument(
        "--scale-sizes", default="1000 7500", help="host counts of the scale suite's inventories"
    )
    parser.add_argument(
        "--cold-cache",
        action="store_true",
        help="bootstrap once more before the others, with the lab's package cache emptied",
    )
    parser.add_argument(
        "--ansible-max-hosts",
        type=int,
        default=suites.ANSIBLE_MAX_HOSTS,
        help="run ansible-playbook --check only on labs of at most this many hosts",
    )
    parser.add_argument("--quick", action="store_true", help="10 hosts, one run each, no bootstrap")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--work", type=Path, default=Path("build/bench"))
    parser.add_argument(
        "--baseline", type=Path, help="another gpuinfra checkout, run as a fourth engine"
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="drift hosts converge from bare Debian, not from a converged layer (slow)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the table and plots only"
    )
    args = parser.parse_args(argv)
    if args.cp_events_in_main and args.cp_sized_for is not None:
        # Each comparison changes one thing against the plain run.
        parser.error("--cp-events-in-main and --cp-sized-for are two comparisons: one per run")
    if args.quick:
        args.sizes, args.repeats, args.suites = "10", 1, "drift"
    sizes = [int(s) for s in args.sizes.split()]
    wanted = {s.strip() for s in args.suites.split(",") if s.strip()}

    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    if not args.report_only:
        if wanted & {"bootstrap", "drift", "jobs", "controlplane"} and os.geteuid() != 0:
            print("benchmarks boot lab hosts and need root", file=sys.stderr)
            return 2
        raise_open_files_limit()  # inherited by all three engines alike
        # A stopped run still takes its lab down (the suites' finally blocks).
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

        def log(line: str) -> None:
            print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)

        if wanted & {"bootstrap", "drift"}:
            results["machine"] = _machine()
        suites.ANSIBLE_MAX_HOSTS = args.ansible_max_hosts
        if "bootstrap" in wanted and args.cold_cache:
            cold = suites.bootstrap_cold(args.work / "bootstrap-cold", log)
            results["bootstrap_cold"] = {**cold, "date": time.strftime("%Y-%m-%d %H:%M UTC")}
            results_path.write_text(json.dumps(results, indent=2))
        if "bootstrap" in wanted:
            results["bootstrap"] = suites.bootstrap(
                args.repeats, args.work / "bootstrap", log, args.baseline
            )
            results_path.write_text(json.dumps(results, indent=2))
        if "scale" in wanted:
            # Its own date and load: the lab suites' figures may come from another run.
            results["scale_machine"] = _machine()
            sizes_of_scale = tuple(int(s) for s in args.scale_sizes.split())
            results.setdefault("scale", {}).update(
                scale.scale(sizes_of_scale, args.repeats, args.work / "scale", log)
            )
            results_path.write_text(json.dumps(results, indent=2))
        if "cli" in wanted:
            results["cli_machine"] = _machine()
            results["cli"] = commandline.command_line(log)
            results_path.write_text(json.dumps(results, indent=2))
        if "jobs" in wanted:
            results["jobs_machine"] = _machine()
            sizes_of_jobs = tuple(int(s) for s in args.jobs_sizes.split())
            results["jobs"] = jobs.jobs(args.repeats, args.work / "jobs", log, sizes_of_jobs)
            results_path.write_text(json.dumps(results, indent=2))
        if "controlplane" in wanted:
            machine = _machine()
            sizes_of_fleet = tuple(int(s) for s in args.cp_sizes.split())
            key = "controlplane"
            if args.cp_events_in_main:
                key = control_plane.EVENTS_IN_MAIN
            elif args.cp_sized_for is not None:
                key = control_plane.SIZED
            results[key] = {
                "machine": machine,
                **control_plane.suite(
                    sizes_of_fleet,
                    args.cp_settle,
                    args.work / key,
                    log,
                    events_apart=not args.cp_events_in_main,
                    flow_control=flow_control.comparison if args.cp_apf else None,
                    sized_for=args.cp_sized_for,
                ),
            }
            results_path.write_text(json.dumps(results, indent=2))
        if "drift" in wanted:
            drift = results.setdefault("drift", {})
            layer = None
            if not args.bare:
                layer, results["converged_layer"] = suites.converged_layer(args.work / "layer", log)
            for size in sizes:
                drift[str(size)] = suites.drift_at_scale(
                    size, args.repeats, args.work / f"drift-{size}", log, args.baseline, layer
                )
                results_path.write_text(json.dumps(results, indent=2))
    report.write(results, args.out)
    print(f"results: {results_path}, {args.out / 'results.md'}")
    return 0


def _machine() -> dict:
    import psutil

    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


if __name__ == "__main__":
    sys.exit(main())
