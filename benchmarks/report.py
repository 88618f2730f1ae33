"""results.json to results.md (tables, ratios, projection) and PNG plots."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks import control_plane_report, jobreport
from benchmarks.control_plane import EVENTS_IN_MAIN, SIZED
from benchmarks.suites import BASELINE, CONNECT, ENGINES, EXACT, PROBE_FLOOR
from engine.fingerprint.check import DEFAULT_PARALLEL

FLEET = 7500  # the fleet size the projection is for
HOSTS_PER_SHARD = 200  # the largest lab measured: a shard never goes past measured ground
TARGET_PYINFRA_RATIO = 1.5
TARGET_ANSIBLE_SPEEDUP = 10
TARGET_BOOTSTRAP_SECONDS = 300
# Issue 18: gpuinfra drift within 1.5x of one ssh command per host (benchmarks/floor.py).
TARGET_FLOOR_RATIO = 1.5
TARGET_VALIDATE_SECONDS = 3  # issue 18: a 7,500-host inventory
TARGET_CLI_CPU_SECONDS = 0.3  # issue 18: `--help` and `inventory validate inventory/sample`
TARGET_NOOP_APPLY_SECONDS = 15


def summarize(entry: dict) -> dict:
    """Per engine: median/min wall time, median CPU and peak memory; ratios paired by round
    (runs of one round are seconds apart, so the machine's load is most alike)."""
    runs = entry["runs"]
    engines: dict[str, dict] = {}
    for engine in (*ENGINES, BASELINE):
        mine = [r for r in runs if r["engine"] == engine]
        if not mine:
            continue
        engines[engine] = {
            "runs": len(mine),
            "median_seconds": statistics.median(r["seconds"] for r in mine),
            "min_seconds": min(r["seconds"] for r in mine),
            "median_cpu_seconds": statistics.median(r["cpu_seconds"] for r in mine),
            "median_machine_cpu_seconds": _median_or_none(
                [r.get("machine_cpu_seconds") for r in mine]
            ),
            "peak_tree_mib": statistics.median(r["peak_tree_mib"] for r in mine),
            "max_process_mib": statistics.median(r["max_process_mib"] for r in mine),
            "all_noop": all(r["returncode"] == 0 and r["changes"] == 0 for r in mine),
            "median_load": statistics.median(r["load_before"] for r in mine),
            "median_parallelism": _median_or_none([r.get("parallelism") for r in mine]),
        }
    ratios = {}
    rounds = [runs[i : i + len(engines)] for i in range(0, len(runs), len(engines))]

    def paired(numerator: str, denominator: str) -> float | None:
        values = []
        for batch in rounds:
            by = {r["engine"]: r["seconds"] for r in batch}
            if numerator in by and denominator in by and by[denominator] > 0:
                values.append(by[numerator] / by[denominator])
        return round(statistics.median(values), 2) if values else None

    def above_connection(numerator: str, denominator: str) -> float | None:
        """The same ratio, each engine's time less its round's connection alone."""
        values = []
        for batch in rounds:
            by = {r["engine"]: r["seconds"] for r in batch}
            if {numerator, denominator, CONNECT} <= by.keys() and by[denominator] > by[CONNECT]:
                work = by[numerator] - by[CONNECT], by[denominator] - by[CONNECT]
                values.append(work[0] / work[1])
        return round(statistics.median(values), 2) if values else None

    ratios["gpuinfra_over_pyinfra"] = paired("gpuinfra", "pyinfra")
    ratios["ansible_over_gpuinfra"] = paired("ansible", "gpuinfra")
    ratios["gpuinfra_over_floor"] = paired("gpuinfra", "floor")
    ratios["exact_over_floor"] = paired(EXACT, "floor")
    ratios["gpuinfra_over_probe_floor"] = paired("gpuinfra", PROBE_FLOOR)
    ratios["probe_floor_over_floor"] = paired(PROBE_FLOOR, "floor")
    ratios["connect_over_floor"] = paired(CONNECT, "floor")
    ratios["gpuinfra_over_floor_above_connect"] = above_connection("gpuinfra", "floor")
    if BASELINE in engines:
        ratios["baseline_over_gpuinfra"] = paired(BASELINE, "gpuinfra")
    return {"engines": engines, "ratios": ratios}


def _median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


_fit = jobreport.fit_line  # least-squares line y = a + b x


def projection(drift: dict[str, dict]) -> dict | None:
    """gpuinfra drift's per-host marginal cost, fitted over the measured sizes, projected to
    the fleet: in one process, and split into shards of at most HOSTS_PER_SHARD hosts."""
    rows = []
    for entry in drift.values():
        gpuinfra = summarize(entry)["engines"].get("gpuinfra")
        if gpuinfra:
            rows.append((entry["hosts"], gpuinfra))
    wall = _fit([(n, e["median_seconds"]) for n, e in rows])
    cpu = _fit([(n, e["median_cpu_seconds"]) for n, e in rows])
    memory = _fit([(n, e["peak_tree_mib"]) for n, e in rows])
    if not (wall and cpu and memory):
        return None
    shards = math.ceil(FLEET / HOSTS_PER_SHARD)
    per_shard = math.ceil(FLEET / shards)
    return {
        "fleet": FLEET,
        "sizes": sorted(n for n, _ in rows),
        "wall_fixed_seconds": round(wall[0], 2),
        "wall_per_host_seconds": round(wall[1], 4),
        "cpu_fixed_seconds": round(cpu[0], 2),
        "cpu_per_host_seconds": round(cpu[1], 4),
        "memory_fixed_mib": round(memory[0], 1),
        "memory_per_host_mib": round(memory[1], 3),
        "one_process_seconds": round(wall[0] + wall[1] * FLEET),
        "one_process_cpu_seconds": round(cpu[0] + cpu[1] * FLEET),
        "one_process_mib": round(memory[0] + memory[1] * FLEET),
        "shards": shards,
        "hosts_per_shard": per_shard,
        "shard_seconds": round(wall[0] + wall[1] * per_shard, 1),
        "shard_mib": round(memory[0] + memory[1] * per_shard),
        "parallelism": {
            n: e["median_parallelism"]
            for n, e in sorted(rows, key=lambda r: r[0])
            if e["median_parallelism"]
        },
    }


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _status(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "not met")


def markdown(results: dict) -> str:
    machine = results.get("machine", {})
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`python -m benchmarks`); method and caveats in `README.md`.",
        f"Machine: {machine.get('cpus', '?')} CPUs, {machine.get('memory_gib', '?')} GiB, "
        f"kernel {machine.get('kernel', '?')}, run {machine.get('date', '?')}; the lab's hosts "
        "run on the same machine as the controller.",
        "",
    ]
    drift = results.get("drift", {})
    bootstrap = results.get("bootstrap")
    entries = ([("default lab", bootstrap)] if bootstrap else []) + [
        (f"{entry['hosts']} hosts", entry)
        for entry in sorted(drift.values(), key=lambda e: e["hosts"])
    ]
    targets: list[str] = []
    if entries:
        lines += [
            "## No-op drift check: gpuinfra drift, raw pyinfra --dry, ansible-playbook --check "
            "and the floor",
            "",
            "The floor (`benchmarks/floor.py`): one OpenSSH connection per host, all hosts at "
            "once, one command per host that hashes every managed file, reads its mode and owner "
            "and asks dpkg for every package, compared on the controller: the same declared "
            "state the pyinfra deploy and the Ansible playbook check. gpuinfra checks more of "
            "each host than that (services, sysctls, the live nftables table, users, the pending "
            "restarts): `gpuinfra` is `gpuinfra drift` as operators run it (each host the last "
            "apply found converged answers in one round trip, engine/fingerprint/), "
            f"`{EXACT}` is `gpuinfra drift --exact` (every host operation by operation). "
            f"`{PROBE_FLOOR}` is the floor's client sending each host gpuinfra's own probe (the "
            "script `gpuinfra drift` sends it) and comparing the answer whole: gpuinfra / "
            f"{PROBE_FLOOR} is what gpuinfra's controller adds, {PROBE_FLOOR} / floor what "
            "checking the rest of gpuinfra's state on each host adds. "
            f"`{CONNECT}` is the floor's client with each host running `true`: the connection "
            "alone (key exchange, login, session), which every engine pays before its check; "
            "gpuinfra / floor above the connection divides what each of the two takes beyond "
            "it, round by round.",
            "",
            "Median of the runs (wall seconds, CPU seconds of the controller's process tree, "
            "CPU seconds of the whole machine over the run: the lab's hosts share it, so this "
            "counts their side too, peak memory of the controller's tree); ratios are medians of "
            "the per-round ratios. Load: the machine's 1-minute load average when the runs "
            "started (2 CPUs).",
            "",
            "| lab | engine | runs | wall s (min) | CPU s | machine CPU s | "
            "peak MiB (largest process) | no-op | load |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for label, entry in entries:
            summary = summarize(entry)
            for engine, e in summary["engines"].items():
                lines.append(
                    f"| {label} | {engine} | {e['runs']} | {e['median_seconds']:.2f} "
                    f"({e['min_seconds']:.2f}) | {e['median_cpu_seconds']:.2f} | "
                    f"{_fmt(e['median_machine_cpu_seconds'], '', 2)} | "
                    f"{e['peak_tree_mib']:.0f} ({e['max_process_mib']:.0f}) | "
                    f"{'yes' if e['all_noop'] else 'NO'} | {e['median_load']:.1f} |"
                )
        lines += [
            "",
            "| lab | hosts | operations per host (same state) | gpuinfra / floor | "
            f"gpuinfra / {PROBE_FLOOR} | {PROBE_FLOOR} / floor | {CONNECT} / floor | "
            "gpuinfra / floor above the connection | "
            f"{EXACT} / floor | gpuinfra / pyinfra | ansible / gpuinfra | {BASELINE} / gpuinfra |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for label, entry in entries:
            ratios = summarize(entry)["ratios"]
            lines.append(
                f"| {label} | {entry['hosts']} | {entry['operations_per_host']['same_state']} | "
                f"{_fmt(ratios.get('gpuinfra_over_floor'), 'x', 2)} | "
                f"{_fmt(ratios.get('gpuinfra_over_probe_floor'), 'x', 2)} | "
                f"{_fmt(ratios.get('probe_floor_over_floor'), 'x', 2)} | "
                f"{_fmt(ratios.get('connect_over_floor'), 'x', 2)} | "
                f"{_fmt(ratios.get('gpuinfra_over_floor_above_connect'), 'x', 2)} | "
                f"{_fmt(ratios.get('exact_over_floor'), 'x', 2)} | "
                f"{_fmt(ratios['gpuinfra_over_pyinfra'], 'x', 2)} | "
                f"{_fmt(ratios['ansible_over_gpuinfra'], 'x', 1)} | "
                f"{_fmt(ratios.get('baseline_over_gpuinfra'), 'x', 2)} |"
            )
        lines.append("")
        layer = results.get("converged_layer")
        converge = [
            f"{e['hosts']} hosts {e['first_apply_seconds']:.1f} s"
            for e in sorted(drift.values(), key=lambda e: e["hosts"])
            if e.get("on_converged_layer")
        ]
        if layer and converge:
            lines += [
                "How the drift labs were converged: one host from bare Debian by `gpuinfra apply` "
                f"({layer['apply_seconds']:.1f} s), saved with `gpuinfra lab save-layer`; the N "
                "hosts boot on that layer (each with its own identity, and Debian's open "
                "firewall) and one `gpuinfra apply` converges them: "
                + ", ".join(converge)
                + ". Every engine then checked hosts with nothing to change.",
                "",
            ]
        for entry in sorted(drift.values(), key=lambda e: e["hosts"]):
            for engine, why in entry.get("engines_not_run", {}).items():
                lines += [f"{entry['hosts']} hosts, {engine}: {why}.", ""]
        at_100 = drift.get("100")
        largest = max(drift.values(), key=lambda e: e["hosts"]) if drift else None
        ref = at_100 or largest
        for label, entry in entries:
            floor = summarize(entry)["ratios"].get("gpuinfra_over_floor")
            targets.append(
                f"| gpuinfra drift within {TARGET_FLOOR_RATIO}x of the floor ({label}) | "
                f"{_fmt(floor, 'x', 2)} | "
                f"{_status(None if floor is None else floor <= TARGET_FLOOR_RATIO)} |"
            )
        if ref:
            py = summarize(ref)["ratios"]["gpuinfra_over_pyinfra"]
            targets.append(
                f"| gpuinfra drift within {TARGET_PYINFRA_RATIO}x of raw pyinfra "
                f"({ref['hosts']} hosts) | {_fmt(py, 'x', 2)} | "
                f"{_status(None if py is None else py <= TARGET_PYINFRA_RATIO)} |"
            )
        with_ansible = [
            (label, entry)
            for label, entry in entries
            if summarize(entry)["ratios"].get("ansible_over_gpuinfra") is not None
        ]
        if with_ansible:
            label, entry = max(with_ansible, key=lambda item: item[1]["hosts"])
            an = summarize(entry)["ratios"]["ansible_over_gpuinfra"]
            targets.append(
                f"| at least {TARGET_ANSIBLE_SPEEDUP}x faster than ansible-playbook --check "
                f"({label}) | {_fmt(an, 'x', 1)} | {_status(an >= TARGET_ANSIBLE_SPEEDUP)} |"
            )
    if bootstrap:
        phases = bootstrap["apply_phase_seconds"]
        lines += [
            "## Bootstrap of the default lab from bare hosts",
            "",
            f"`lab up` {bootstrap['lab_up_seconds']:.1f} s; first `gpuinfra apply` "
            f"{bootstrap['apply_seconds']:.1f} s (the command; its report says "
            f"{bootstrap['apply_report_seconds']:.1f} s); a second, no-op apply "
            f"{bootstrap['noop_apply_seconds']:.1f} s (report "
            f"{bootstrap['noop_apply_report_seconds']:.1f} s; hosts not ok: "
            f"{bootstrap['noop_apply_hosts_not_ok'] or 'none'}).",
            "",
        ]
        cold = results.get("bootstrap_cold")
        if cold:
            lines += [
                "The lab's hosts download packages through apt-cacher-ng on the controller "
                f"(lab/aptcache.py). With that cache emptied first ({cold['date']}), the first "
                f"apply took {cold['apply_seconds']:.1f} s (lab up {cold['lab_up_seconds']:.1f} "
                f"s); the first apply above ran right after it, on the warm cache.",
                "",
            ]
        lines += [
            "| phase | first apply s | no-op apply s |",
            "| --- | --- | --- |",
        ]
        for key, seconds in phases.items():
            noop = bootstrap["noop_apply_phase_seconds"].get(key)
            lines.append(f"| {key} | {seconds:.1f} | {_fmt(noop)} |")
        lines.append("")
        cold = results.get("bootstrap_cold")
        if cold:
            targets.append(
                f"| default lab bootstrap under {TARGET_BOOTSTRAP_SECONDS} s, cold package "
                f"cache | {cold['apply_seconds']:.1f} s | "
                f"{_status(cold['apply_seconds'] < TARGET_BOOTSTRAP_SECONDS)} |"
            )
        targets += [
            f"| default lab bootstrap under {TARGET_BOOTSTRAP_SECONDS} s | "
            f"{bootstrap['apply_seconds']:.1f} s | "
            f"{_status(bootstrap['apply_seconds'] < TARGET_BOOTSTRAP_SECONDS)} |",
            f"| no-op apply under {TARGET_NOOP_APPLY_SECONDS} s | "
            f"{bootstrap['noop_apply_seconds']:.1f} s | "
            f"{_status(bootstrap['noop_apply_seconds'] < TARGET_NOOP_APPLY_SECONDS)} |",
        ]
    projected = projection(drift)
    if projected:
        p = projected
        lines += [
            f"## Projection to {p['fleet']} hosts",
            "",
            f"Linear fits of gpuinfra drift's median figures over {p['sizes']} hosts: wall "
            f"{p['wall_fixed_seconds']} s + {p['wall_per_host_seconds']} s per host, CPU "
            f"{p['cpu_fixed_seconds']} s + {p['cpu_per_host_seconds']} s per host, memory "
            f"{p['memory_fixed_mib']} MiB + {p['memory_per_host_mib']} MiB per host. "
            "Parallelism measured (hosts being prepared at once, on average, by size): "
            f"{p['parallelism'] or 'not recorded in these runs'}. The lab's hosts share the "
            "controller's CPUs, so the wall-time line is an upper bound for real hosts; the CPU "
            "line is the controller's own cost. The memory line is mostly the OpenSSH clients "
            "of the fast path, one per host asked at once; it asks at most "
            f"{DEFAULT_PARALLEL} hosts at a time (`--parallel`), so one process stays near the "
            f"{DEFAULT_PARALLEL}-host figure rather than the line's.",
            "",
            "| how | hosts per process | projected wall s | CPU s per process | MiB |",
            "| --- | --- | --- | --- | --- |",
            f"| one process | {p['fleet']} | {p['one_process_seconds']} | "
            f"{p['one_process_cpu_seconds']} | {p['one_process_mib']} |",
            f"| `--shard I/{p['shards']}`, {p['shards']} runners in parallel | "
            f"{p['hosts_per_shard']} | {p['shard_seconds']} | "
            f"{round(p['cpu_fixed_seconds'] + p['cpu_per_host_seconds'] * p['hosts_per_shard'])}"
            f" | {p['shard_mib']} |",
            "",
        ]
    at_scale = results.get("scale", {})
    if at_scale:
        lines += _scale_section(at_scale, projected, results.get("scale_machine", {}))
        largest = max(at_scale.values(), key=lambda e: e["hosts"])
        targets.append(
            f"| `inventory validate` of {largest['hosts']} hosts under "
            f"{TARGET_VALIDATE_SECONDS} s | {largest['validate_median_seconds']:.2f} s "
            f"(CPU {largest['validate_median_cpu_seconds']:.2f} s) | "
            f"{_status(largest['validate_median_seconds'] < TARGET_VALIDATE_SECONDS)} |"
        )
    command_line = results.get("cli")
    if command_line:
        lines += _cli_section(command_line, results.get("cli_machine", {}))
        for entry in command_line.values():
            cpu = entry["median_cpu_seconds"]
            targets.append(
                f"| `{entry['command']}` under {TARGET_CLI_CPU_SECONDS} s of CPU | {cpu:.2f} s "
                f"(median of {entry['runs']}) | {_status(cpu < TARGET_CLI_CPU_SECONDS)} |"
            )
    jobs = results.get("jobs")
    if jobs:
        lines += jobreport.markdown(jobs, results.get("jobs_machine", {}))
        row = jobreport.target_row(jobs)
        if row:
            targets.append(row)
    control_plane = results.get("controlplane")
    if control_plane:
        lines += [
            "## The control plane under a simulated fleet",
            "",
            "Its tables, plots and projection are in [control-plane.md](control-plane.md).",
            "",
        ]
        row = control_plane_report.target_row(control_plane)
        if row:
            targets.append(f"{row[0]} {_status(row[1])} |")
    if targets:
        lines += ["## Targets", "", "| target | measured | status |", "| --- | --- | --- |"]
        lines += targets + [""]
    return "\n".join(lines)


def _scale_section(at_scale: dict, projected: dict | None, machine: dict) -> list[str]:
    """Validate and render of generated inventories (benchmarks/fleet.py), no hosts."""
    lines = [
        "## Inventories at scale (benchmarks/fleet.py, no hosts)",
        "",
        f"Run {machine.get('date', '?')}, load average at the start "
        f"{machine.get('load_average_at_start', '?')} on {machine.get('cpus', '?')} CPUs.",
        "",
        "Generated inventories in the reference design's shape (5 etcd, 5 API servers, 2 load "
        "balancers, 3 DNS servers, 2 monitoring hosts, the rest GPU and CPU workers 7:1). "
        "Wall and CPU seconds of the command; render writes every host's files. Per host: the "
        "median CPU cost of building one host's managed files (what every run prepares per "
        "host), over hosts spread through the inventory.",
        "",
        "| hosts | validate s (CPU s) | render s (CPU s) | rendered MiB | "
        "per-host files ms | lines per host | /etc/hosts lines | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in sorted(at_scale.values(), key=lambda e: e["hosts"]):
        per_host = entry["per_host"]
        lines.append(
            f"| {entry['hosts']} | {entry['validate_median_seconds']:.2f} "
            f"({entry['validate_median_cpu_seconds']:.2f}) | {entry['render_seconds']:.1f} "
            f"({entry['render_cpu_seconds']:.1f}) | {entry['rendered_mib']:.1f} | "
            f"{per_host['median_ms_per_host']:.2f} | {per_host['median_lines_per_host']:.0f} | "
            f"{per_host['hosts_file_lines']} | {statistics.median(entry['load_before']):.1f} |"
        )
    largest = max(at_scale.values(), key=lambda e: e["hosts"])
    per_host_ms = largest["per_host"]["median_ms_per_host"]
    fleet = projected["fleet"] if projected else largest["hosts"]
    lines += [
        "",
        f"Projection from the {largest['hosts']}-host inventory itself: preparing the files of "
        f"{fleet} hosts costs {per_host_ms:.2f} ms each, {per_host_ms * fleet / 1000:.0f} s of "
        "CPU in one process (split over shards with `--shard`).",
        "",
    ]
    return lines


def _cli_section(command_line: dict, machine: dict) -> list[str]:
    """CPU seconds of two commands that connect to nothing (benchmarks/commandline.py)."""
    lines = [
        "## The command line (benchmarks/commandline.py, no hosts)",
        "",
        f"Run {machine.get('date', '?')}, load average at the start "
        f"{machine.get('load_average_at_start', '?')} on {machine.get('cpus', '?')} CPUs. "
        "CPU seconds (user + system) of the command, its bytecode caches written; the two "
        "commands alternate, run after run.",
        "",
        "| command | runs | CPU s median (min to max) | wall s median | load |",
        "| --- | --- | --- | --- | --- |",
    ]
    for entry in command_line.values():
        lines.append(
            f"| `{entry['command']}` | {entry['runs']} | {entry['median_cpu_seconds']:.3f} "
            f"({entry['min_cpu_seconds']:.3f} to {entry['max_cpu_seconds']:.3f}) | "
            f"{entry['median_seconds']:.3f} | {statistics.median(entry['load_before']):.1f} |"
        )
    return [*lines, ""]


def plots(results: dict, out: Path) -> list[Path]:
    written: list[Path] = []
    drift = sorted(results.get("drift", {}).values(), key=lambda e: e["hosts"])
    bootstrap = results.get("bootstrap")
    if drift or bootstrap:
        # Only these plots need it here: results without them report without `.[bench]`.
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    if drift:
        for metric, label, name in (
            ("median_seconds", "wall seconds (median)", "drift-wall.png"),
            ("peak_tree_mib", "controller peak memory, MiB", "drift-memory.png"),
            ("median_machine_cpu_seconds", "machine CPU seconds (median)", "drift-cpu.png"),
        ):
            fig, ax = plt.subplots(figsize=(6, 4))
            for engine in (*ENGINES, BASELINE):
                points = [
                    (e["hosts"], summarize(e)["engines"][engine][metric])
                    for e in drift
                    if summarize(e)["engines"].get(engine, {}).get(metric) is not None
                ]
                if points:
                    ax.plot(*zip(*points, strict=True), marker="o", label=engine)
            ax.set_xlabel("hosts")
            ax.set_ylabel(label)
            ax.set_title("No-op drift check, same declared state")
            ax.grid(alpha=0.3)
            ax.legend()
            fig.tight_layout()
            path = out / name
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    if bootstrap:
        fig, ax = plt.subplots(figsize=(6, 4))
        phases = bootstrap["apply_phase_seconds"]
        ax.barh(list(phases), list(phases.values()), label="first apply")
        noop = [bootstrap["noop_apply_phase_seconds"].get(k, 0) for k in phases]
        ax.barh(list(phases), noop, label="no-op apply", alpha=0.8)
        ax.set_xlabel("seconds")
        ax.set_title(f"Bootstrap of the default lab ({bootstrap['hosts']} hosts)")
        ax.invert_yaxis()
        ax.legend()
        fig.tight_layout()
        path = out / "bootstrap-phases.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    job_plot = jobreport.plot(results.get("jobs", {}), out)
    if job_plot is not None:
        written.append(job_plot)
    written += control_plane_report.plots(results.get("controlplane", {}), out)
    return written


def write(results: dict, out: Path) -> None:
    import json

    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    if "controlplane" in results:
        control_plane_report.write_doc(
            results["controlplane"],
            out / control_plane_report.DOC,
            results.get(EVENTS_IN_MAIN),
            results.get(SIZED),
        )
    plots(results, out)
