"""The control-plane suite's figures (benchmarks/control_plane.py): each step judged against the
API latency SLOs, the cost per simulated node, the projection to 7,500 nodes on five API
servers, and their section of docs/benchmarks/control-plane.md with its plots.

Pure functions of results.json["controlplane"], so `--report-only` rewrites them without a lab.

The SLOs are upstream Kubernetes' (sig-scalability's API call latency SLO): p99 at most 1 s
for calls on a single object (the histogram's scope "resource") and 30 s for cluster-scope
lists. A step records each API server's p99 of each call over the step; the worst of them is
judged, which is at least the p99 over all servers together (a mixture's quantile is never
above its largest part's), so a step that holds here holds the SLO.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.control_plane import EVENTS_PROCESS, SLO_EXCLUDED_VERBS
from inventory.sizing import SERIES_PER_NODE
from roles.fleet_policy.files import FLEET_PRIORITY_LEVEL as FLEET_LEVEL

FLEET = 7500  # the seeds' fleet, issue 44's projection
API_SERVERS = 5  # the reference design's API servers; the lab runs three
# The programs whose CPU is the control plane's cost; kwok, which plays the kubelets, is not.
CONTROL_PLANE = (
    "kube-apiserver", "etcd", EVENTS_PROCESS, "kube-scheduler", "kube-controller-manager"
)  # fmt: skip
# The writes of Events through the API servers: what the main etcd stops carrying when the
# Events have their own cluster.
EVENT_RESOURCES = {"events"}
EVENT_WRITES = {"POST", "PUT", "PATCH"}
DOC = "control-plane.md"
BEGIN = "<!-- controlplane:begin -->"
END = "<!-- controlplane:end -->"
LATENCY_PLOT = "control-plane-latency.png"
MEMORY_PLOT = "control-plane-memory.png"
MIB = 2**20

Step = dict[str, Any]


def _single_object(verb: str, scope: str) -> bool:
    return scope == "resource"


def _cluster_list(verb: str, scope: str) -> bool:
    return verb == "LIST" and scope == "cluster"


# key: (label, SLO seconds, which calls it covers)
SLOS: dict[str, tuple[str, float, Callable[[str, str], bool]]] = {
    "single_object": ("single-object", 1.0, _single_object),
    "cluster_list": ("cluster-scope LIST", 30.0, _cluster_list),
}


def worst_call(step: Step, covers: Callable[[str, str], bool]) -> dict[str, Any] | None:
    """The largest p99 of any API server among the calls `covers` takes: {call, apiserver,
    p99_s, count}; None when the step made no such call."""
    found = []
    for name, entry in step.get("requests", {}).items():
        verb, resource, scope = name.split(" ")
        if verb in SLO_EXCLUDED_VERBS or not covers(verb, scope):
            continue
        for host, p99 in entry["p99"].items():
            if p99 is not None:
                found.append((p99, f"{verb} {resource}", host, entry["count"]))
    if not found:
        return None
    p99, call, host, count = max(found)
    return {"call": call, "apiserver": host, "p99_s": p99, "count": count}


def verdict(step: Step, slo: str) -> dict[str, Any]:
    """The worst call of one SLO and whether it held (None: no such call in the step)."""
    _, limit, covers = SLOS[slo]
    worst = worst_call(step, covers)
    held = None if worst is None else worst["p99_s"] <= limit
    return {"worst": worst, "slo_s": limit, "held": held}


def etcd_db_bytes(step: Step) -> float | None:
    """The leader's database size; the members' mean when no member said it leads."""
    members = step.get("etcd", {}).values()
    leader = [m["db_bytes"] for m in members if m.get("leader") and m.get("db_bytes") is not None]
    if leader:
        return leader[0]
    sizes = [m["db_bytes"] for m in members if m.get("db_bytes") is not None]
    return statistics.mean(sizes) if sizes else None


def etcd_quota_bytes(step: Step) -> float | None:
    """The members' backend quota (`--quota-backend-bytes`); None where it was not read."""
    quotas = [m["quota_bytes"] for m in step.get("etcd", {}).values() if m.get("quota_bytes")]
    return min(quotas) if quotas else None


def _member_values(step: Step, key: str) -> list[Any]:
    return [m[key] for m in step.get("etcd", {}).values() if m.get(key) is not None]


def _worst_member(step: Step, key: str) -> float | None:
    values = _member_values(step, key)
    return max(values) if values else None


def resident(step: Step, program: str) -> dict[str, int]:
    """{host: resident bytes} of one program's processes."""
    found = {}
    for key, figures in step.get("processes", {}).items():
        host, name = key.split("/", 1)
        if name == program:
            found[host] = figures["rss_bytes"]
    return dict(sorted(found.items()))


def cpu_cores(step: Step, programs: tuple[str, ...]) -> float:
    """The CPU the programs' processes used over the step, in cores, summed."""
    return sum(
        figures["cpu_cores"]
        for key, figures in step.get("processes", {}).items()
        if key.split("/", 1)[1] in programs and figures.get("cpu_cores") is not None
    )


def per_node_costs(base: Step, step: Step) -> dict[str, Any]:
    """What each simulated node added from the base step to this one: etcd database bytes, API
    server resident bytes (summed over the API servers), the etcd members' resident bytes (their
    mean) and the control plane's CPU seconds per minute (the API servers' alone too)."""
    nodes = step["size"] - base["size"]
    db = etcd_db_bytes(step), etcd_db_bytes(base)

    def mean_resident(s: Step, program: str) -> float | None:
        values = list(resident(s, program).values())
        return statistics.mean(values) if values else None

    etcd_rss = mean_resident(step, "etcd"), mean_resident(base, "etcd")
    return {
        "from": base["size"],
        "to": step["size"],
        "etcd_db_bytes": None if None in db else (db[0] - db[1]) / nodes,
        "apiserver_rss_bytes": (
            sum(resident(step, "kube-apiserver").values())
            - sum(resident(base, "kube-apiserver").values())
        )
        / nodes,
        "etcd_member_rss_bytes": None if None in etcd_rss else (etcd_rss[0] - etcd_rss[1]) / nodes,
        "cpu_seconds_per_minute": (cpu_cores(step, CONTROL_PLANE) - cpu_cores(base, CONTROL_PLANE))
        * 60
        / nodes,
        "apiserver_cpu_seconds_per_minute": (
            cpu_cores(step, ("kube-apiserver",)) - cpu_cores(base, ("kube-apiserver",))
        )
        * 60
        / nodes,
    }


def projection(base: Step, costs: dict[str, Any]) -> dict[str, Any]:
    """Each figure at FLEET nodes on API_SERVERS API servers: its value at the base step plus
    its cost per node (from the base to the largest step) times the nodes added."""
    added = FLEET - base["size"]
    apiservers = resident(base, "kube-apiserver")
    measured_apiservers = len(apiservers) or 1
    apiserver_idle = statistics.mean(apiservers.values()) if apiservers else 0.0
    # Every API server caches every object (its watch cache), so each grows as each measured
    # one did: the sum's growth per node, shared by the servers that were measured.
    apiserver_each = apiserver_idle + costs["apiserver_rss_bytes"] / measured_apiservers * added
    apiserver_cpu = cpu_cores(base, ("kube-apiserver",))
    apiserver_cpu_idle = apiserver_cpu / measured_apiservers
    # The requests' CPU is shared among the servers behind the balancer; each idles alone.
    apiserver_cpu_each = (
        apiserver_cpu_idle + costs["apiserver_cpu_seconds_per_minute"] / 60 * added / API_SERVERS
    )
    cpu_total = (
        cpu_cores(base, CONTROL_PLANE)
        - apiserver_cpu
        + apiserver_cpu_idle * API_SERVERS
        + costs["cpu_seconds_per_minute"] / 60 * added
    )
    db = etcd_db_bytes(base)
    members = list(resident(base, "etcd").values())
    return {
        "fleet": FLEET,
        "api_servers": API_SERVERS,
        "measured_api_servers": measured_apiservers,
        "from": base["size"],
        "per_node_to": costs["to"],
        "etcd_db_bytes": None
        if db is None or costs["etcd_db_bytes"] is None
        else db + costs["etcd_db_bytes"] * added,
        "etcd_quota_bytes": etcd_quota_bytes(base),
        "etcd_member_rss_bytes": None
        if not members or costs["etcd_member_rss_bytes"] is None
        else statistics.mean(members) + costs["etcd_member_rss_bytes"] * added,
        "apiserver_rss_bytes_each": apiserver_each,
        "apiserver_rss_bytes_total": apiserver_each * API_SERVERS,
        "apiserver_cpu_cores_each": apiserver_cpu_each,
        "cpu_cores": cpu_total,
    }


def analyse(control_plane: dict[str, Any]) -> dict[str, Any]:
    """Every step's verdicts and figures, the largest size that held both SLOs (every smaller
    size holding too), what stopped the growth, the costs per node and the projection."""
    steps = sorted(control_plane.get("steps", []), key=lambda s: s["size"])
    rows = []
    held_up_to = None
    first_break = None
    for step in steps:
        verdicts = {slo: verdict(step, slo) for slo in SLOS}
        rows.append(
            {
                "size": step["size"],
                "seconds": step.get("seconds"),
                "load": step.get("load"),
                "verdicts": verdicts,
                "etcd_db_bytes": etcd_db_bytes(step),
                "wal_fsync_p99_s": _worst_member(step, "wal_fsync_p99_s"),
                "backend_commit_p99_s": _worst_member(step, "backend_commit_p99_s"),
                "resident": {p: resident(step, p) for p in (*CONTROL_PLANE, "kwok")},
                "cpu_cores": cpu_cores(step, CONTROL_PLANE),
            }
        )
        broken = [slo for slo, v in verdicts.items() if v["held"] is False]
        if first_break is None:
            if broken:
                first_break = {"size": step["size"], "slos": broken}
            else:
                held_up_to = step["size"]
    costs = [per_node_costs(steps[0], s) for s in steps[1:] if s["size"] > steps[0]["size"]]
    analysis: dict[str, Any] = {
        "rows": rows,
        "held_up_to": held_up_to,
        "first_break": first_break,
        "stopped": control_plane.get("stopped"),
        "per_node": costs,
        "projection": projection(steps[0], costs[-1]) if costs else None,
    }
    analysis["limit"] = limit_sentence(analysis)
    return analysis


def limit_sentence(analysis: dict[str, Any]) -> str:
    """How far the SLOs held, and what stopped them (an SLO broken, or the fleet not Ready)."""
    rows = {row["size"]: row for row in analysis["rows"]}
    causes = []
    if analysis["first_break"]:
        size = analysis["first_break"]["size"]
        broken = []
        for slo in analysis["first_break"]["slos"]:
            label, limit, _ = SLOS[slo]
            worst = rows[size]["verdicts"][slo]["worst"]
            broken.append(
                f"the {label} p99 was {worst['p99_s']:.2f} s ({worst['call']} on "
                f"{worst['apiserver']}), over its {limit:g} s SLO"
            )
        causes.append(f"at {size:,} simulated nodes " + " and ".join(broken))
    stopped = analysis["stopped"]
    if stopped:
        causes.append(
            f"the fleet did not get Ready at {stopped['size']:,} simulated nodes "
            f"({stopped['error']})"
        )
    if not rows:
        return "no step was measured" + (f": {causes[0]}" if causes else "")
    if analysis["held_up_to"] is None:
        held = "no measured size held both SLOs"
    elif analysis["held_up_to"] == 0:
        held = "both SLOs held only with no simulated node"
    else:
        held = f"both SLOs held up to {analysis['held_up_to']:,} simulated nodes"
    if not causes:
        return f"{held}, the largest size measured: no limit was reached"
    return f"{held}; the limit: " + "; then ".join(causes)


# ---------------------------------------------------------------- the document


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MIB:,.0f}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f}"


def _worst_cell(v: dict[str, Any]) -> str:
    worst = v["worst"]
    if worst is None:
        return "no call"
    return f"{worst['p99_s']:.2f} ({worst['call']}, {worst['apiserver']})"


def _held_cell(v: dict[str, Any]) -> str:
    return {None: "n/a", True: "yes", False: "**no**"}[v["held"]]


def _hosts(analysis: dict[str, Any], program: str) -> list[str]:
    return sorted({host for row in analysis["rows"] for host in row["resident"][program]})


def markdown(
    control_plane: dict[str, Any],
    events_in_main: dict[str, Any] | None = None,
    sized: dict[str, Any] | None = None,
) -> list[str]:
    """The section of docs/benchmarks/control-plane.md between its markers; with the run of
    `--cp-events-in-main`, the Events' before and after too, and with the run of
    `--cp-sized-for`, the sizing's."""
    analysis = analyse(control_plane)
    machine = control_plane.get("machine", {})
    lines = [
        "Written by `make bench BENCH_SUITES=controlplane` from `results.json` "
        "(benchmarks/control_plane_report.py); a rerun rewrites it.",
        "",
        f"Run {machine.get('date', '?')} on {machine.get('cpus', '?')} CPUs and "
        f"{machine.get('memory_gib', '?')} GiB, load average at the start "
        f"{machine.get('load_average_at_start', '?')}; lab `{control_plane.get('lab', '?')}`, "
        f"{control_plane.get('settle_s', '?')} s at each size after its fleet was Ready; sizes "
        f"asked: {control_plane.get('sizes', '?')}.",
        "",
        f"**Limit**: {analysis['limit']}.",
        "",
    ]
    if not analysis["rows"]:
        return lines
    lines += [
        "API call latency (each API server's p99 over the step, the worst server and call "
        "shown; WATCH and CONNECT are outside the SLO) and etcd (the leader's database size; "
        "the worst member's WAL fsync and backend commit p99 over the step):",
        "",
        "| simulated nodes | single-object p99 s (call, API server) | within 1 s | "
        "cluster LIST p99 s (call, API server) | within 30 s | etcd db MiB | "
        "WAL fsync p99 ms | backend commit p99 ms | step s | load average |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in analysis["rows"]:
        single, listing = row["verdicts"]["single_object"], row["verdicts"]["cluster_list"]
        lines.append(
            f"| {row['size']:,} | {_worst_cell(single)} | {_held_cell(single)} | "
            f"{_worst_cell(listing)} | {_held_cell(listing)} | {_mib(row['etcd_db_bytes'])} | "
            f"{_ms(row['wal_fsync_p99_s'])} | {_ms(row['backend_commit_p99_s'])} | "
            f"{row['seconds']} | {row['load']} |"
        )
    stopped = analysis["stopped"]
    if stopped:
        lines += ["", f"Stopped at {stopped['size']:,} simulated nodes: {stopped['error']}"]
    programs = (*CONTROL_PLANE, "kwok")
    hosts = {p: _hosts(analysis, p) for p in programs}
    lines += [
        "",
        "Resident memory (VmRSS, MiB) of each process at the end of the step, and the control "
        "plane's CPU over the step (kube-apiserver, etcd, kube-scheduler and "
        "kube-controller-manager together; kwok, which plays the kubelets, apart):",
        "",
        "| simulated nodes | "
        + " | ".join(f"{p} ({' / '.join(hosts[p])})" for p in programs)
        + " | control plane CPU cores |",
        "| --- | " + " | ".join("---" for _ in programs) + " | --- |",
    ]
    for row in analysis["rows"]:
        cells = [" / ".join(_mib(row["resident"][p].get(h)) for h in hosts[p]) for p in programs]
        lines.append(f"| {row['size']:,} | " + " | ".join(cells) + f" | {row['cpu_cores']:.2f} |")
    lines += ["", f"![API call p99 against simulated nodes]({LATENCY_PLOT})", ""]
    lines += [f"![etcd and API server memory against simulated nodes]({MEMORY_PLOT})", ""]
    if analysis["per_node"]:
        lines += _per_node_section(analysis)
    lines += _daemonset_section(analysis["rows"], control_plane["steps"])
    lines += _scheduling_section(control_plane.get("scheduling"))
    lines += _events_section(control_plane, events_in_main)
    # Read by the suite since 2026-12-04: from the plain run where it has them, else the sized.
    newer = [
        (run, which)
        for run, which in ((control_plane, "the run above"), (sized, "the run sized for its fleet"))
        if run
    ]
    lines += next(
        (section for run, which in newer if (section := _events_cluster_section(run, which))), []
    )
    lines += _sizing_section(control_plane, sized)
    lines += next(
        (
            section
            for run, which in newer
            if (section := _metric_budget_section(run.get("metric_budget"), which))
        ),
        [],
    )
    lines += _flow_control_section(control_plane, "the run above")
    lines += _flow_control_section(events_in_main, "the run with the Events in the main etcd")
    lines += _flow_control_section(sized, "the run sized for its fleet")
    return lines


def _daemonset_section(rows: list[dict[str, Any]], steps: list[Step]) -> list[str]:
    """Each DaemonSet's pods Ready of those it should run, at the end of each step: what the
    fleet's nodes run (kube-proxy, gpuinfra's GPU agents), played by kwok on simulated nodes."""
    by_size = {step["size"]: step.get("daemonsets") for step in steps}
    names = sorted({name for sets in by_size.values() if sets for name in sets})
    if not names:
        return []
    lines = [
        "DaemonSet pods Ready of those each DaemonSet should run, at the end of each step:",
        "",
        "| simulated nodes | " + " | ".join(f"`{name}`" for name in names) + " |",
        "| --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for row in rows:
        sets = by_size.get(row["size"]) or {}
        cells = [
            f"{sets[n]['ready']:,} / {sets[n]['desired']:,}" if n in sets else "n/a" for n in names
        ]
        lines.append(f"| {row['size']:,} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


def _scheduling_section(scheduling: dict[str, Any] | None) -> list[str]:
    """The scheduler at the largest fleet held: a pod of 8 GPUs per node of one team, without
    and then with a gang (benchmarks/control_plane.py `scheduling`)."""
    if scheduling and scheduling.get("error"):
        return [
            f"No scheduler measurement: the fleet did not get back to {scheduling['size']:,} "
            f"simulated nodes after the last step ({scheduling['error']}).",
            "",
        ]
    if not scheduling or not scheduling.get("batches"):
        return []
    ballooned = scheduling.get("balloon_nodes", 0)
    lines = [
        f"The scheduler at that size: a pod of 8 GPUs for each of the {scheduling['team']} "
        f"team's {scheduling['nodes']:,} simulated nodes less the {ballooned} its GPU "
        "balloons hold, created at once, without a gang and then as one gang (a Workload of "
        "that many; all bound or none). From the pods' own timestamps (whole seconds); pod "
        "startup's SLO is p99 at most 5 s:",
        "",
        "| batch | pods | running | bound per s | scheduled p50 / p99 s | Ready p50 / p99 s "
        "| all running after s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in scheduling["batches"]:
        lines.append(
            f"| {'one gang' if b['gang'] else 'no gang'} | {b['pods']:,} | {b['running']:,} | "
            f"{_seconds(b['pods_per_s'])} | {_seconds(b['scheduled_p50_s'])} / "
            f"{_seconds(b['scheduled_p99_s'])} | {_seconds(b['ready_p50_s'])} / "
            f"{_seconds(b['ready_p99_s'])} | {_seconds(b['all_running_s'])} |"
        )
    return [*lines, ""]


def _per_node_section(analysis: dict[str, Any]) -> list[str]:
    costs = analysis["per_node"]
    p = analysis["projection"]
    n = p["measured_api_servers"]
    lines = [
        f"Cost per simulated node, from the step at {costs[0]['from']:,} nodes to each larger "
        "one (the difference over the nodes added). The CPU is the mean over the step, the "
        "nodes' creation included, so it is above a steady fleet's:",
        "",
        "| to nodes | etcd db bytes per node | API server RSS KiB per node "
        f"(sum of {n}) | etcd member RSS KiB per node | control plane CPU-s per node per "
        "minute |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in costs:
        etcd_rss = c["etcd_member_rss_bytes"]
        lines.append(
            f"| {c['to']:,} | "
            + ("n/a" if c["etcd_db_bytes"] is None else f"{c['etcd_db_bytes']:,.0f}")
            + f" | {c['apiserver_rss_bytes'] / 1024:,.1f} | "
            + ("n/a" if etcd_rss is None else f"{etcd_rss / 1024:,.1f}")
            + f" | {c['cpu_seconds_per_minute']:.4f} |"
        )
    lines += [
        "",
        f"Projection to {p['fleet']:,} nodes on {p['api_servers']} API servers. A linear "
        f"extrapolation from the measured sizes, not a measurement: each figure is its value "
        f"at {p['from']:,} nodes plus its cost per node from {p['from']:,} to "
        f"{p['per_node_to']:,} nodes (the largest step) times the nodes added. It assumes "
        "that cost stays constant past the largest step (no cache, compaction or "
        "garbage-collection effect that grows with the fleet); that every API server holds "
        f"every object (its watch cache), so each of {p['api_servers']} grows per node as each "
        f"of the {n} measured did; that the balancer spreads the requests evenly, so their CPU "
        f"splits {p['api_servers']} ways while each server's idle CPU stays its own; and "
        "simulated nodes' objects, which lack a real kubelet's image list (etcd's bytes per "
        "node are a lower bound). Latency is not extrapolated: the limit above is measured.",
        "",
        f"| figure | at {p['fleet']:,} nodes |",
        "| --- | --- |",
        f"| etcd database (leader) | {_etcd_db_cell(p)} |",
        f"| each etcd member's RSS | {_mib(p['etcd_member_rss_bytes'])} MiB |",
        f"| each API server's RSS | {_mib(p['apiserver_rss_bytes_each'])} MiB |",
        f"| the {p['api_servers']} API servers' RSS | "
        f"{p['apiserver_rss_bytes_total'] / 2**30:.1f} GiB |",
        f"| each API server's CPU | {p['apiserver_cpu_cores_each']:.2f} cores |",
        f"| the control plane's CPU | {p['cpu_cores']:.2f} cores |",
        "",
    ]
    return lines


def _etcd_in_use_bytes(step: Step) -> float | None:
    """The leader's database bytes in use (what compaction left, before any defragmentation)."""
    members = step.get("etcd", {}).values()
    leader = [m.get("db_in_use_bytes") for m in members if m.get("leader")]
    return leader[0] if leader and leader[0] is not None else None


def event_writes(step: Step) -> dict[str, Any] | None:
    """The Events' writes over the step: their count on all API servers and the worst p99."""
    found = [
        entry
        for name, entry in step.get("requests", {}).items()
        if name.split(" ")[1] in EVENT_RESOURCES and name.split(" ")[0] in EVENT_WRITES
    ]
    if not found:
        return None
    p99s = [v for entry in found for v in entry["p99"].values() if v is not None]
    return {"count": sum(entry["count"] for entry in found), "p99_s": max(p99s) if p99s else None}


Figure = tuple[str, Callable[[Step], Any]]


def paired_steps(
    before_run: dict[str, Any], after_run: dict[str, Any], figures: tuple[Figure, ...]
) -> list[dict[str, Any]]:
    """At each size both runs measured, every figure of each: {"size", "<key>_before",
    "<key>_after"}."""
    before = {s["size"]: s for s in before_run.get("steps", [])}
    rows = []
    for after in sorted(after_run.get("steps", []), key=lambda s: s["size"]):
        if after["size"] not in before:
            continue
        pair = {"before": before[after["size"]], "after": after}
        rows.append(
            {"size": after["size"]}
            | {
                f"{key}_{when}": figure(step)
                for when, step in pair.items()
                for key, figure in figures
            }
        )
    return rows


def events_comparison(apart: dict[str, Any], in_main: dict[str, Any]) -> list[dict[str, Any]]:
    """At each size both runs measured: the main etcd with the Events in it (before, the run of
    `--cp-events-in-main`) and with them in their own cluster (after, the sample's choice)."""
    return paired_steps(
        in_main,
        apart,
        (
            ("db_bytes", etcd_db_bytes),
            ("in_use_bytes", _etcd_in_use_bytes),
            ("commit_p99_s", lambda s: _worst_member(s, "backend_commit_p99_s")),
            ("fsync_p99_s", lambda s: _worst_member(s, "wal_fsync_p99_s")),
            ("commits", lambda s: _sum_members(s, "backend_commit_count")),
            ("event_writes", event_writes),
        ),
    )


def _sum_members(step: Step, key: str) -> int | None:
    values = _member_values(step, key)
    return sum(values) if values else None


def _pair(row: dict[str, Any], key: str, cell: Callable[[Any], str]) -> str:
    return f"{cell(row[key + '_before'])} / {cell(row[key + '_after'])}"


def _writes_cell(writes: dict[str, Any] | None) -> str:
    if writes is None:
        return "none"
    p99 = "n/a" if writes["p99_s"] is None else f"{writes['p99_s']:.2f} s"
    return f"{writes['count']:,}, p99 {p99}"


def _events_section(apart: dict[str, Any], in_main: dict[str, Any] | None) -> list[str]:
    """Before and after for the Events' own etcd, when the run of `--cp-events-in-main` is
    in results.json."""
    if not in_main:
        return []
    rows = events_comparison(apart, in_main)
    date = in_main.get("machine", {}).get("date", "?")
    lines = [
        "Events in their own etcd, before and after: the same suite run with the Events in "
        f"the main etcd (`BENCH_ARGS=--cp-events-in-main`, run {date}, "
        f"{in_main.get('settle_s', '?')} s at each size) against the run above, at each size "
        "both measured. Each cell is before / after, for the main etcd only (the leader's "
        "database, its bytes in use, the worst member's backend commit and WAL fsync p99, the "
        "members' backend commits over the step) and the Events' writes through the API "
        "servers (count over the step, worst p99):",
        "",
    ]
    if not rows:
        return [*lines, "No size was measured in both runs.", ""]
    lines += [
        "| simulated nodes | main etcd db MiB | in use MiB | backend commit p99 ms | "
        "WAL fsync p99 ms | backend commits | Events writes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    count = lambda v: "n/a" if v is None else f"{v:,}"  # noqa: E731
    for row in rows:
        lines.append(
            f"| {row['size']:,} | {_pair(row, 'db_bytes', _mib)} | "
            f"{_pair(row, 'in_use_bytes', _mib)} | {_pair(row, 'commit_p99_s', _ms)} | "
            f"{_pair(row, 'fsync_p99_s', _ms)} | {_pair(row, 'commits', count)} | "
            f"{_pair(row, 'event_writes', _writes_cell)} |"
        )
    return [*lines, ""]


def events_cluster(step: Step) -> Step | None:
    """The step's figures of the Events cluster's members, shaped as a step (under "etcd") for
    the main cluster's readers; None where the run read no Events member."""
    members = step.get("etcd_events")
    return {"etcd": members} if members else None


def _events_cluster_section(control_plane: dict[str, Any], which: str) -> list[str]:
    """The Events cluster's own members at each step of the run, where it read them."""
    rows = [
        (step["size"], events)
        for step in sorted(control_plane.get("steps", []), key=lambda s: s["size"])
        if (events := events_cluster(step)) is not None
    ]
    if not rows:
        return []
    lines = [
        f"The Events cluster itself in {which} (its own members, read on their metrics "
        "port 2384): the leader's database, the worst member's backend commit and WAL fsync "
        "p99, the members' backend commits over the step:",
        "",
        "| simulated nodes | Events etcd db MiB | backend commit p99 ms | WAL fsync p99 ms | "
        "backend commits |",
        "| --- | --- | --- | --- | --- |",
    ]
    for size, events in rows:
        commits = _sum_members(events, "backend_commit_count")
        lines.append(
            f"| {size:,} | {_mib(etcd_db_bytes(events))} | "
            f"{_ms(_worst_member(events, 'backend_commit_p99_s'))} | "
            f"{_ms(_worst_member(events, 'wal_fsync_p99_s'))} | "
            f"{'n/a' if commits is None else f'{commits:,}'} |"
        )
    return [*lines, ""]


def refused(step: Step) -> int | None:
    """The API servers' 429 responses over the step (flow control's refusals); None where the
    run did not read the responses."""
    responses = step.get("responses")
    return None if responses is None else responses.get("429", 0)


def _worst_p99(step: Step, slo: str) -> float | None:
    worst = verdict(step, slo)["worst"]
    return None if worst is None else worst["p99_s"]


def _worst_resident(step: Step, program: str) -> int | None:
    values = resident(step, program).values()
    return max(values) if values else None


def _cpu_seconds(step: Step) -> float | None:
    """The control plane's CPU-seconds over the step: its work, whatever the step lasted."""
    seconds = step.get("seconds")
    return None if seconds is None else cpu_cores(step, CONTROL_PLANE) * seconds


def sizing_comparison(plain: dict[str, Any], sized: dict[str, Any]) -> list[dict[str, Any]]:
    """At each size both runs measured: the inventory sized for the lab's real nodes (before:
    upstream's defaults) and for the simulated fleet (after, `--cp-sized-for`)."""
    return paired_steps(
        plain,
        sized,
        (
            ("single_p99_s", lambda s: _worst_p99(s, "single_object")),
            ("list_p99_s", lambda s: _worst_p99(s, "cluster_list")),
            ("refused", refused),
            ("ready_s", lambda s: s.get("fleet", {}).get("ready_seconds")),
            ("apiserver_rss", lambda s: _worst_resident(s, "kube-apiserver")),
            ("cpu_seconds", _cpu_seconds),
            ("db_bytes", etcd_db_bytes),
        ),
    )


def _sizing_section(plain: dict[str, Any], sized: dict[str, Any] | None) -> list[str]:
    """Before and after for the settings sized from the fleet, when the run of
    `--cp-sized-for` is in results.json."""
    if not sized or "sized_for" not in sized:
        return []
    settings = sized["sized_for"]
    kube, etcd = settings["kubernetes"], settings["etcd"]
    date = sized.get("machine", {}).get("date", "?")
    lines = [
        f"Sizing from the fleet, before and after: the same suite run with the inventory sized "
        f"for {settings['nodes']:,} nodes (`BENCH_ARGS=--cp-sized-for {settings['nodes']}`, run "
        f"{date}): `--max-requests-inflight` {kube['max_requests_inflight']:,} and "
        f"`--max-mutating-requests-inflight` {kube['max_mutating_requests_inflight']:,} on "
        f"each API server, etcd's quota {etcd['quota_backend_bytes'] / 2**30:g} GiB, against "
        "the run above, sized for the lab's five real nodes (upstream's 400, 200 and 2 GiB). "
        "CoreDNS's replicas are left out (the simulated nodes' taints keep them off), and so "
        "is Prometheus' interval (it scrapes no simulated node). Each cell is before / after: "
        "the worst API server's p99 of each SLO's worst call, the 429s (flow control's "
        "refusals) over the step, the seconds until the step's new nodes were all Ready, the "
        "largest API server's memory, the control plane's CPU-seconds over the step, the main "
        "etcd's database:",
        "",
    ]
    rows = sizing_comparison(plain, sized)
    if not rows:
        return [*lines, "No size was measured in both runs.", ""]
    lines += [
        "| simulated nodes | single-object p99 s | cluster LIST p99 s | 429s | Ready after s | "
        "API server MiB | control plane CPU-s | etcd db MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    seconds = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
    count = lambda v: "n/a" if v is None else f"{v:,}"  # noqa: E731
    whole = lambda v: "n/a" if v is None else f"{v:,.0f}"  # noqa: E731
    for row in rows:
        lines.append(
            f"| {row['size']:,} | {_pair(row, 'single_p99_s', seconds)} | "
            f"{_pair(row, 'list_p99_s', seconds)} | {_pair(row, 'refused', count)} | "
            f"{_pair(row, 'ready_s', whole)} | {_pair(row, 'apiserver_rss', _mib)} | "
            f"{_pair(row, 'cpu_seconds', whole)} | {_pair(row, 'db_bytes', _mib)} |"
        )
    return [*lines, ""]


# The GPUs of one of the sample's GPU nodes, each with its own DCGM series.
GPUS_PER_NODE = 8


def budget_figures(budget: dict[str, Any]) -> dict[str, Any] | None:
    """Per job: targets and the series kept (mean, largest) and scraped (mean) per target; and
    what one Kubernetes node brings: its node exporter's kept series (the nodes' mean), and on
    a GPU node the DCGM keep-list's series for each GPU, against inventory/sizing.py's budget."""
    jobs = budget.get("jobs")
    if not jobs:
        return None
    rows = []
    for job, targets in sorted(jobs.items()):
        kept = [t["kept"] for t in targets.values()]
        scraped = [t["scraped"] for t in targets.values()]
        rows.append(
            {
                "job": job,
                "targets": len(targets),
                "kept_mean": statistics.mean(kept),
                "kept_max": max(kept),
                "scraped_mean": statistics.mean(scraped),
            }
        )
    nodes = [jobs.get("node", {}).get(name) for name in budget.get("kubernetes_nodes", [])]
    node_kept = [n["kept"] for n in nodes if n is not None]
    node_series = statistics.mean(node_kept) if node_kept else None
    dcgm = budget.get("dcgm_keep_metrics", 0) * GPUS_PER_NODE
    gpu_node = None if node_series is None else node_series + dcgm
    return {
        "rows": rows,
        "node_exporter_per_node": node_series,
        "dcgm_per_gpu_node": dcgm,
        "gpu_node": gpu_node,
        "budget": SERIES_PER_NODE,
    }


def _metric_budget_section(budget: dict[str, Any] | None, which: str) -> list[str]:
    """Prometheus' series per target at the end of the run, where it read them."""
    if not budget:
        return []
    if "error" in budget:
        return [f"Prometheus' series per target were not read: {budget['error']}", ""]
    figures = budget_figures(budget)
    if figures is None:
        return []
    lines = [
        f"The metric budget: the series each scrape brings Prometheus on {budget['host']} at the "
        f"end of {which} (`scrape_samples_scraped`, and `scrape_samples_post_metric_relabeling` "
        "after the monitoring role's drops and fleet_policy's DCGM keep-list), by job; "
        f"{budget['head_series']:,} series in its head block in all:",
        "",
        "| job | targets | kept per target (mean, largest) | scraped per target (mean) |",
        "| --- | --- | --- | --- |",
    ]
    for row in figures["rows"]:
        lines.append(
            f"| {row['job']} | {row['targets']} | {row['kept_mean']:,.0f}, {row['kept_max']:,} | "
            f"{row['scraped_mean']:,.0f} |"
        )
    per_node = figures["node_exporter_per_node"]
    if per_node is not None:
        lines += [
            "",
            f"A Kubernetes node brings {per_node:,.0f} series from its node exporter (the mean "
            f"of the lab's {len(budget['kubernetes_nodes'])} nodes); a GPU node adds "
            f"{budget['dcgm_keep_metrics']} kept DCGM series per GPU, "
            f"{figures['dcgm_per_gpu_node']:,} for {GPUS_PER_NODE} GPUs (the keep-list's; the "
            f"exporter needs a GPU, so none ran here): {figures['gpu_node']:,.0f} per GPU node "
            f"against inventory/sizing.py's budget of {figures['budget']:,} a node, which sets "
            "the scrape interval. The lab's hosts see 2 CPUs; the node exporter's per-CPU "
            "series (each CPU's modes, frequency, softnet) grow with the count, which a DGX "
            "H100's 224 multiplies: not measured here.",
        ]
    return [*lines, ""]


def _sec3(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _flow_control_section(run: dict[str, Any] | None, which: str) -> list[str]:
    """The fleet operation with and without fleet_policy's flow schema
    (benchmarks/flow_control.py), where the run made it."""
    apf = (run or {}).get("flow_control")
    if not apf or not apf.get("phases"):
        return []
    first = apf["phases"][0]
    lines = [
        f"API Priority and Fairness, before and after ({which}, at {apf['size']:,} simulated "
        f"nodes): {first['clients']} connections list every node as `{apf['sampler']}` for "
        f"{first['seconds']:g} s, first with fleet_policy's flow schema (its own Limited "
        "level), then without it (Kubernetes' `service-accounts` schema, workload-low), the "
        "fleet Ready before each. Beside them a workload's account asks for one pod every "
        "0.5 s (refused, 403, after flow control queued it). The queue waits and the Lease "
        "renewals are the worst API server's p99 over the phase:",
        "",
        "| flow schema | lists done (statuses) | list p50 s | probe p50 / p99 s | "
        "queue wait p99 s (our level / workload-low) | Lease PUT p99 s | "
        "simulated nodes not Ready after |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for phase in apf["phases"]:
        waits = phase.get("queue_wait_p99_s", {})
        ours = waits.get(FLEET_LEVEL)
        low = waits.get("workload-low")
        statuses = ", ".join(f"{n:,} {code}" for code, n in phase["flood"]["statuses"].items())
        name = "fleet_policy's" if phase["flow_schema"] == "gpuinfra" else "none (before)"
        lines.append(
            f"| {name} | {phase['flood']['requests']:,} ({statuses}) | "
            f"{_sec3(phase['flood']['p50_s'])} | {_sec3(phase['probe']['p50_s'])} / "
            f"{_sec3(phase['probe']['p99_s'])} | {_sec3(ours)} / {_sec3(low)} | "
            f"{_sec3(phase.get('lease_put_p99_s'))} | {phase['nodes_not_ready_after']:,} |"
        )
    errors = [e for e in apf.get("recovery", []) if e]
    if errors:
        lines += ["", f"The fleet did not get Ready again between phases: {errors[0]}"]
    return [*lines, ""]


def _etcd_db_cell(p: dict[str, Any]) -> str:
    db, quota = p["etcd_db_bytes"], p["etcd_quota_bytes"]
    if db is None:
        return "n/a"
    if quota is None:
        return f"{_mib(db)} MiB"
    return f"{_mib(db)} MiB, {db / quota:.0%} of the members' {quota / 2**30:g} GiB quota"


def write_doc(
    control_plane: dict[str, Any],
    path: Path,
    events_in_main: dict[str, Any] | None = None,
    sized: dict[str, Any] | None = None,
) -> None:
    """Replace the text between the markers of `path` (appending a Results section holding
    them when it has none), leaving the rest of the document as it is."""
    section = "\n".join([BEGIN, *markdown(control_plane, events_in_main, sized), END])
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        path.write_text(head + section + tail)
        return
    path.write_text(text + ("\n" if text else "") + "## Results\n\n" + section + "\n")


def target_row(control_plane: dict[str, Any]) -> tuple[str, bool] | None:
    """results.md's target: the SLOs held at every measured size, up to FLEET nodes."""
    analysis = analyse(control_plane)
    if not analysis["rows"]:
        return None
    largest = analysis["rows"][-1]["size"]
    met = analysis["held_up_to"] == largest and largest >= FLEET
    held = analysis["held_up_to"]
    measured = "no size held" if held is None else f"held up to {held:,}"
    return (
        f"| API call latency SLOs (1 s single-object, 30 s cluster LIST) to {FLEET:,} "
        f"simulated nodes | {measured} of {largest:,} measured |",
        met,
    )


# ---------------------------------------------------------------- the plots


def series(control_plane: dict[str, Any]) -> dict[str, Any]:
    """The points of the plots: each SLO's worst p99, the etcd database and each API server's
    resident memory, against simulated nodes."""
    analysis = analyse(control_plane)
    rows = analysis["rows"]
    latency = {
        slo: [
            (row["size"], row["verdicts"][slo]["worst"]["p99_s"])
            for row in rows
            if row["verdicts"][slo]["worst"] is not None
        ]
        for slo in SLOS
    }
    apiservers = {
        host: [
            (row["size"], row["resident"]["kube-apiserver"][host] / MIB)
            for row in rows
            if host in row["resident"]["kube-apiserver"]
        ]
        for host in _hosts(analysis, "kube-apiserver")
    }
    etcd = [(row["size"], row["etcd_db_bytes"] / MIB) for row in rows if row["etcd_db_bytes"]]
    return {"latency": latency, "etcd_db_mib": etcd, "apiserver_rss_mib": apiservers}


def plots(control_plane: dict[str, Any], out: Path) -> list[Path]:
    """control-plane-latency.png and control-plane-memory.png; none without a step."""
    if not control_plane.get("steps"):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def against_nodes(ax, title: str, unit: str) -> None:
        ax.set(xlabel="simulated nodes", ylabel=unit, title=title)
        ax.grid(alpha=0.3)

    def save(fig, name: str) -> Path:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        return out / name

    points = series(control_plane)
    fig, ax = plt.subplots(figsize=(6, 4))
    for index, (slo, (label, limit, _)) in enumerate(SLOS.items()):
        color = f"C{index}"
        if points["latency"][slo]:
            ax.plot(*zip(*points["latency"][slo], strict=True), marker="o", color=color,
                    label=f"{label}, worst p99")  # fmt: skip
        ax.axhline(limit, color=color, linestyle="--", label=f"{label} SLO {limit:g} s")
    ax.set_yscale("log")
    against_nodes(ax, "API call latency p99 (worst API server)", "seconds")
    ax.legend(fontsize="small")
    written = [save(fig, LATENCY_PLOT)]

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if points["etcd_db_mib"]:
        left.plot(*zip(*points["etcd_db_mib"], strict=True), marker="o")
    against_nodes(left, "etcd database size (leader)", "MiB")
    for host, host_points in points["apiserver_rss_mib"].items():
        right.plot(*zip(*host_points, strict=True), marker="o", label=host)
    against_nodes(right, "kube-apiserver resident memory", "MiB")
    right.legend()
    written.append(save(fig, MEMORY_PLOT))
    return written
