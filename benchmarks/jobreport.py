"""The jobs suite's figures (benchmarks/jobs.py): the fit of a shard's cost, the projection of
`gpuinfra drift --job` to 7,500 hosts, its section of results.md and docs/benchmarks/drift-job.png.

Pure functions of results.json["jobs"], so `--report-only` rewrites them without a lab.

The model (docs/design/fleet-jobs.md section 6), one core per shard:

    wall(S) = C + c*S + a + ceil(7500 / S) * b

b: a shard's CPU seconds per host and a: per shard (the least-squares line through every
shard's CPU seconds against its host count, all rounds and shard counts of the fleet lab);
C: the controller's time outside the shards (publish, scheduling, polling, collection, delete:
its wall time less the slowest shard's, median per shard count) plus its measured CPU for
7,500 hosts' records, and c: what each further shard adds to that (its log fetched and checked
one at a time), both from the line through the medians by shard count. The lab's walls are
upper bounds (its 2 cores run the hosts, the pods and the controller together), so the shards
are projected from CPU.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

FLEET = 7500
TARGET_SECONDS = 120  # issue #32 point 4: a 7,500-host drift under 2 minutes
# Shard counts shown in the projection's table (38: 200 hosts per shard, the default).
TABLE_SHARDS = (2, 4, 8, 16, 32, 38, 64)
LOCAL = "local"


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares line y = intercept + slope * x (as (intercept, slope)); None without two
    distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    xs, ys = zip(*points, strict=True)
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def job_runs(entry: dict) -> list[dict]:
    return [r for r in entry.get("runs", []) if r.get("shards")]


def shard_points(fleet: dict) -> list[tuple[int, float]]:
    """(hosts, CPU seconds) of every shard that reported, every lab size and round."""
    return [
        (shard["hosts"], shard["cpu_s"])
        for entry in fleet.values()
        for run in job_runs(entry)
        for shard in run.get("shard_usage", [])
        if shard.get("hosts") and shard.get("cpu_s") is not None
    ]


def controller_overhead(run: dict) -> float | None:
    """The controller's wall seconds outside its slowest shard."""
    seconds = [s["seconds"] for s in run.get("shard_usage", []) if s.get("seconds") is not None]
    if not seconds:
        return None
    return run["seconds"] - max(seconds)


def fit(jobs: dict) -> dict | None:
    """a, b, C and c from the fleet lab's runs (see the module docstring); None until there
    are shards of two sizes."""
    fleet = jobs.get("fleet", {})
    shard = fit_line([(float(h), c) for h, c in shard_points(fleet)])
    if shard is None:
        return None
    per_shard, per_host = shard
    by_count: dict[int, list[float]] = {}
    for entry in fleet.values():
        for run in job_runs(entry):
            overhead = controller_overhead(run)
            if overhead is not None:
                by_count.setdefault(run["shards"], []).append(overhead)
    medians = {count: statistics.median(values) for count, values in sorted(by_count.items())}
    line = fit_line([(float(count), value) for count, value in medians.items()])
    if line is not None and line[1] > 0:
        fixed, each_shard = line
    else:  # one shard count, or no growth measured: a constant
        fixed, each_shard = (statistics.median(medians.values()) if medians else 0.0), 0.0
    merge = jobs.get("merge_7500", {})
    merge_cpu = merge.get("cpu_seconds", 0.0) + merge.get("load_cpu_seconds", 0.0)
    return {
        "per_host_cpu_s": round(per_host, 5),
        "per_shard_cpu_s": round(per_shard, 3),
        "controller_fixed_s": round(max(fixed, 0.0) + merge_cpu, 2),
        "controller_outside_shards_s": round(max(fixed, 0.0), 2),
        "controller_merge_7500_cpu_s": round(merge_cpu, 2),
        "controller_per_shard_s": round(each_shard, 3),
        "overhead_by_shards": {str(k): round(v, 2) for k, v in medians.items()},
        "shards_measured": len(shard_points(fleet)),
    }


def projected_wall(model: dict, shards: int, fleet: int = FLEET) -> float:
    return (
        model["controller_fixed_s"]
        + model["controller_per_shard_s"] * shards
        + model["per_shard_cpu_s"]
        + math.ceil(fleet / shards) * model["per_host_cpu_s"]
    )


def shards_for_target(
    model: dict, fleet: int = FLEET, target: float = TARGET_SECONDS
) -> int | None:
    """The fewest shards whose projected wall is under the target; None when none is (more
    shards stop helping once the controller's per-shard cost outweighs them)."""
    for shards in range(1, fleet + 1):
        if projected_wall(model, shards, fleet) < target:
            return shards
    return None


def projection(jobs: dict) -> dict | None:
    model = fit(jobs)
    if model is None:
        return None
    meets = shards_for_target(model)
    best = min(range(1, FLEET + 1), key=lambda s: projected_wall(model, s))
    local = _local_per_host(jobs.get("fleet", {}))
    return {
        **model,
        "fleet": FLEET,
        "target_s": TARGET_SECONDS,
        "shards_meeting_target": meets,
        "wall_at_target_shards_s": round(projected_wall(model, meets), 1) if meets else None,
        "fastest_shards": best,
        "fastest_wall_s": round(projected_wall(model, best), 1),
        "table": {str(s): round(projected_wall(model, s), 1) for s in TABLE_SHARDS},
        "local_cpu_per_host_s": local,
        "local_one_process_cpu_s": round(local * FLEET) if local else None,
        "controller_memory_mib_7500": jobs.get("merge_7500", {}).get("peak_mib"),
    }


def _local_per_host(fleet: dict) -> float | None:
    """Local drift's CPU per host: the line through the sizes measured, or CPU over hosts at
    the one size there is."""
    points = [
        (float(entry["hosts"]), statistics.median(r["cpu_seconds"] for r in local))
        for entry in fleet.values()
        if (local := [r for r in entry.get("runs", []) if r.get("engine") == LOCAL])
    ]
    line = fit_line(points)
    if line is not None and line[1] > 0:
        return round(line[1], 5)
    if points:
        hosts, cpu = points[0]
        return round(cpu / hosts, 5)
    return None


def summary(entry: dict) -> list[dict]:
    """Per engine (local, job-S): runs, median wall, controller CPU and memory, shard figures."""
    rows = []
    names = []
    for run in entry.get("runs", []):
        if run["engine"] not in names:
            names.append(run["engine"])
    for name in names:
        mine = [r for r in entry["runs"] if r["engine"] == name]
        shards = [s for r in mine for s in r.get("shard_usage", [])]
        peaks = [s["memory_peak_bytes"] for s in shards if s.get("memory_peak_bytes")]
        rows.append(
            {
                "engine": name,
                "runs": len(mine),
                "median_seconds": statistics.median(r["seconds"] for r in mine),
                "median_cpu_seconds": statistics.median(r["cpu_seconds"] for r in mine),
                "peak_tree_mib": max(r["peak_tree_mib"] for r in mine),
                "exits": sorted({r["returncode"] for r in mine}),
                "same_as_local": all(r.get("same_as_local", True) for r in mine),
                "settled": sorted({r["settled"] for r in mine if r.get("settled") is not None}),
                "shard_cpu_s": statistics.median(s["cpu_s"] for s in shards) if shards else None,
                "shard_seconds": _median([s.get("seconds") for s in shards]),
                "shard_rss_mib": _median(
                    [s["max_rss_kib"] / 1024 for s in shards if s.get("max_rss_kib")]
                ),
                "pod_peak_mib": round(max(peaks) / 2**20, 1) if peaks else None,
                "median_load": statistics.median(r["load_before"] for r in mine),
            }
        )
    return rows


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _table(label: str, entry: dict) -> list[str]:
    lines = []
    for row in summary(entry):
        lines.append(
            f"| {label} | {row['engine']} | {row['runs']} | {row['median_seconds']:.2f} | "
            f"{row['median_cpu_seconds']:.2f} | {row['peak_tree_mib']:.0f} | "
            f"{', '.join(map(str, row['exits']))} | {'yes' if row['same_as_local'] else 'NO'} | "
            f"{', '.join(map(str, row['settled'])) or '-'} | {_fmt(row['shard_cpu_s'])} | "
            f"{_fmt(row['shard_seconds'])} | {_fmt(row['shard_rss_mib'], 1)} | "
            f"{_fmt(row['pod_peak_mib'], 1)} | {row['median_load']:.1f} |"
        )
    return lines


def markdown(jobs: dict, machine: dict | None = None) -> list[str]:
    """results.md's section for the jobs suite (empty without it)."""
    if not jobs:
        return []
    machine = machine or {}
    lines = [
        "## drift --job: the drift check as a Kubernetes Job (benchmarks/jobs.py)",
        "",
        f"Run {machine.get('date', '?')} on {machine.get('cpus', '?')} CPUs, "
        f"{machine.get('memory_gib', '?')} GiB. Lab A: the Kubernetes lab of "
        "tests/integration/test_drift_job.py (the default topology without its storage hosts, "
        f"the Job's pods on {jobs.get('job_node', 'cpu-1')}). Fleet lab B: plain hosts without "
        "Kubernetes, checked by `gpuinfra drift` from the controller (`local`) and by "
        "`gpuinfra drift --job --job-cluster A --shards S` (`job-S`): the pods run on lab A and "
        "reach B's hosts through both labs' masquerades. "
        f"{jobs.get('sizes_note', '')}",
        "",
        "Per engine, medians of the runs: the controller's wall and CPU seconds (its process "
        "tree) and peak memory; the exits seen; whether every run's exit and host statuses "
        "equalled local drift's in its round; hosts the shards settled; per shard: CPU seconds "
        "(getrusage of the shard and its ssh clients), wall seconds, largest process and its "
        "container's cgroup memory peak.",
        "",
        "| lab | engine | runs | wall s | CPU s | peak MiB | exits | same as local | settled | "
        "shard CPU s | shard wall s | shard RSS MiB | pod peak MiB | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lab_a = jobs.get("lab_a")
    if lab_a:
        lines += _table(f"A ({lab_a['hosts']} hosts)", lab_a)
    for entry in sorted(jobs.get("fleet", {}).values(), key=lambda e: e["hosts"]):
        lines += _table(f"B ({entry['hosts']} hosts)", entry)
    lines.append("")
    merge = jobs.get("merge_7500")
    if merge:
        lines += [
            f"The controller with {merge['hosts']} hosts' records (`benchmarks/jobs.py "
            "merge-records`, one process: a generated inventory of that size loaded, a record "
            "of lab B copied to every host and read, the shards' reports parsed and merged as "
            f"`drift --job` does): {merge['cpu_seconds']:.2f} s of CPU for the records and the "
            f"merge, peak resident memory {merge['peak_mib']:.0f} MiB "
            f"({merge['after_load_mib']:.0f} MiB after loading the inventory, "
            f"{merge['load_cpu_seconds']:.2f} s of CPU).",
            "",
        ]
    p = projection(jobs)
    if p:
        meets = p["shards_meeting_target"]
        lines += [
            f"### Projection to {p['fleet']} hosts",
            "",
            f"From {p['shards_measured']} shards' figures: b = {p['per_host_cpu_s']} CPU s per "
            f"host, a = {p['per_shard_cpu_s']} s per shard; the controller C = "
            f"{p['controller_fixed_s']} s ({p['controller_outside_shards_s']} s outside the "
            f"shards in the lab, {p['controller_merge_7500_cpu_s']} s of CPU for "
            f"{p['fleet']} records) and c = {p['controller_per_shard_s']} s per further shard "
            f"(outside the shards by shard count: {p['overhead_by_shards']}). "
            "wall(S) = C + c*S + a + ceil(7500/S)*b, one core per shard; the lab's walls "
            "are upper bounds, so this projects from CPU.",
            "",
            "| shards | projected wall s |",
            "| --- | --- |",
        ]
        lines += [f"| {s} | {w} |" for s, w in p["table"].items()]
        local = p["local_one_process_cpu_s"]
        lines += [
            "",
            f"Fewest shards under {p['target_s']} s: "
            + (f"**{meets}** ({p['wall_at_target_shards_s']} s)" if meets else "**none**")
            + f"; fastest: {p['fastest_shards']} shards ({p['fastest_wall_s']} s). "
            + (
                f"Local drift in one process: {p['local_cpu_per_host_s']} CPU s per host, "
                f"{local} s of CPU for {p['fleet']} hosts. "
                if local
                else ""
            )
            + (
                f"Controller memory for {p['fleet']} records: "
                f"{p['controller_memory_mib_7500']:.0f} MiB peak."
                if p["controller_memory_mib_7500"] is not None
                else ""
            ),
            "",
            "![drift --job projection](drift-job.png)",
            "",
        ]
    return lines


def target_row(jobs: dict) -> str | None:
    p = projection(jobs)
    if not p:
        return None
    meets = p["shards_meeting_target"]
    measured = f"{p['wall_at_target_shards_s']} s at {meets} shards" if meets else "no S"
    status = "met (projected)" if meets else "not met"
    return (
        f"| {p['fleet']}-host drift under {p['target_s']} s (drift --job) | {measured} | {status} |"
    )


def plot(jobs: dict, out: Path) -> Path | None:
    """drift-job.png: the shards' CPU against their hosts with the fit, and the projected
    7,500-host wall by shard count against the target."""
    p = projection(jobs)
    if not p:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    points = shard_points(jobs.get("fleet", {}))
    left.scatter(*zip(*points, strict=True), s=14, label="a shard (lab B)")
    top = max(h for h, _ in points)
    left.plot(
        [0, top],
        [p["per_shard_cpu_s"], p["per_shard_cpu_s"] + p["per_host_cpu_s"] * top],
        color="C1",
        label=f"a + b*hosts (b = {p['per_host_cpu_s']} s)",
    )
    left.set_xlabel("hosts in the shard")
    left.set_ylabel("shard CPU seconds")
    left.set_title("A shard's cost")
    left.grid(alpha=0.3)
    left.legend()
    shards = list(range(1, 129))
    right.plot(shards, [projected_wall(p, s) for s in shards], label="projected wall")
    right.axhline(p["target_s"], color="C3", linestyle="--", label=f"target {p['target_s']} s")
    if p["shards_meeting_target"]:
        s = p["shards_meeting_target"]
        right.scatter([s], [projected_wall(p, s)], color="C3", zorder=3, label=f"{s} shards")
    right.set_xlabel("shards")
    right.set_ylabel("seconds")
    right.set_yscale("log")
    right.set_title(f"drift --job of {p['fleet']} hosts, projected")
    right.grid(alpha=0.3)
    right.legend()
    fig.tight_layout()
    path = out / "drift-job.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
