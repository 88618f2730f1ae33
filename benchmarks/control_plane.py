"""The control plane under a simulated fleet (issue 44): grow a lab's kwok fleet step by step and
read what the API servers, etcd and the control plane's processes say about it.

`python -m benchmarks.control_plane --lab kwok --sizes 0 100 500 --settle 120 --out FILE`
needs a lab booted with Kubernetes and applied (`gpuinfra lab up`, `gpuinfra apply`);
`make bench BENCH_SUITES=controlplane` boots, applies and takes down its own (`suite`). For each
size it makes the fleet that size (`gpuinfra lab fleet`'s code), waits `--settle` seconds at it,
and records over the step (growth and settle together):
- each API server's `apiserver_request_duration_seconds` p99 per verb and resource, from the
  histogram's bucket counts grown during the step (as Prometheus' histogram_quantile);
- each API server's responses over the step by status code (`apiserver_request_total`: the
  429s are the requests flow control refused);
- etcd's `etcd_mvcc_db_total_size_in_bytes` and backend quota, and its WAL fsync and backend
  commit p99 over the step, on every member of the main cluster and of the Events cluster
  (read inside each member's network namespace on 127.0.0.1, on the plain metrics listeners
  the etcd role opens to the monitoring hosts only: 2381 and the Events members' 2384);
- the resident memory (VmRSS, which `process_resident_memory_bytes` reports too) and the CPU
  each API server, etcd member, scheduler and controller-manager used, read from /proc on this
  machine, where every lab host's processes run.
A fleet that cannot get Ready at a size (`fleet.scale` gives up after its timeout) ends the
growth: that size is recorded as where it stopped, with the error, and the steps before it kept.
Nothing here is a timed assertion: it writes JSON and prints a summary;
benchmarks/control_plane_report.py judges the steps against the SLOs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from benchmarks import suites
from inventory.sizing import KUBERNETES_NODE_GROUPS, sizing
from lab import fleet, gobuild, naming
from lab.errors import LabError
from roles.etcd.clusters import EVENTS, MAIN, events_members
from roles.fleet_policy.files import fleet_config
from roles.fleet_policy.gang import in_tree_gang
from roles.monitoring.targets import PROMETHEUS_PORT
from toolkit import nodes

PROCESSES = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "kwok")
COMMS = {name[:15]: name for name in PROCESSES}
# An Events member runs beside the main one on each etcd host (roles/etcd/clusters.py): the
# same program, told apart by its member name's suffix, so neither hides the other.
EVENTS_PROCESS = EVENTS.name
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ETCD_FAMILIES = (
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_disk_wal_fsync_duration_seconds_bucket",
    "etcd_disk_backend_commit_duration_seconds_bucket",
    "etcd_server_is_leader",
    "etcd_server_quota_backend_bytes",
    "process_resident_memory_bytes",
)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# Long-running requests (watches, proxied streams) are outside the latency SLO.
SLO_EXCLUDED_VERBS = {"WATCH", "CONNECT"}
# The suite's sizes (issue 44 asks 500, 2,500 and 7,500, or as far as the machine holds).
SIZES = (0, 500, 1000, 2500)
SETTLE_S = 120.0
# results.json's key of the run with the Events in the main etcd (`--cp-events-in-main`).
EVENTS_IN_MAIN = "controlplane_events_in_main"
# results.json's key of the run with the inventory sized for its simulated fleet
# (`--cp-sized-for N`); the plain run's inventory is sized for the lab's five real nodes.
SIZED = "controlplane_sized"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str, families: tuple[str, ...]) -> Samples:
    """The samples of the named metric families from Prometheus' text format."""
    samples: Samples = {}
    for line in text.splitlines():
        if not line.startswith(families):
            continue
        match = _SAMPLE.match(line)
        if match:
            labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
            samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """histogram_quantile over cumulative bucket counts {upper bound: count}."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    previous_bound, previous_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return previous_bound
            if count == previous_count:
                return bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / (
                count - previous_count
            )
        previous_bound, previous_count = bound, count
    return bounds[-1]


def histogram_p99(
    before: Samples, after: Samples, name: str, by: tuple[str, ...]
) -> dict[tuple[str, ...], tuple[float | None, float]]:
    """p99 and request count of a histogram's growth between two readings, grouped by labels."""
    grown: dict[tuple[str, ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for (metric, labels), value in after.items():
        if metric != f"{name}_bucket":
            continue
        label = dict(labels)
        key = tuple(label.get(b, "") for b in by)
        bound = float(label["le"])
        grown[key][bound] += value - before.get((metric, labels), 0.0)
    return {
        key: (quantile(0.99, dict(buckets)), max(buckets.values()))
        for key, buckets in grown.items()
        if max(buckets.values()) > 0
    }


# ---------------------------------------------------------------- reading the lab


def apiserver_metrics(loaded, address: str) -> str:
    kubectl = gobuild.kubernetes_module(loaded.cluster.versions.kubernetes).binary("kubectl")
    port = loaded.cluster.api.port
    result = subprocess.run(
        [str(kubectl), f"--kubeconfig={fleet.kubeconfig(loaded)}",
         f"--server=https://{address}:{port}", "get", "--raw", "/metrics"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return result.stdout


def etcd_metrics(lab: str, host: str, port: int = MAIN.metrics_port) -> str:
    return host_get(lab, host, f"http://127.0.0.1:{port}/metrics")


def host_get(lab: str, host: str, url: str) -> str:
    """GET `url` from inside a lab host's network namespace (its loopback listeners)."""
    netns = naming.LabNames(lab, 0).netns(host)
    fetch = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
    result = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", fetch],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return result.stdout


def events_member(cmdline: bytes) -> bool:
    """Whether an etcd process (its /proc cmdline) is a member of the Events cluster."""
    return any(
        arg.startswith(b"--name=") and arg.endswith(EVENTS.suffix.encode())
        for arg in cmdline.split(b"\0")
    )


def lab_processes() -> dict[str, tuple[int, int]]:
    """{"<host>/<program>": (resident bytes, CPU ticks so far)} for the control plane's
    programs on this machine; a lab host's name is its hostname."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The kernel keeps 15 characters of a name: kube-controller-manager is cut.
            comm = COMMS.get((entry / "comm").read_text().strip())
            if comm is None:
                continue
            host = "machine"
            if comm != "kwok":
                host = (entry / "root" / "etc" / "hostname").read_text().strip()
            if comm == "etcd" and events_member((entry / "cmdline").read_bytes()):
                comm = EVENTS_PROCESS
            status = (entry / "status").read_text()
            rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, AttributeError, ValueError, IndexError):
            continue
        found[f"{host}/{comm}"] = (rss, ticks)
    return found


def reading(lab: str, loaded) -> dict[str, Any]:
    cluster = loaded.cluster
    api = {
        host: parse(
            apiserver_metrics(loaded, str(cluster.hosts[host].address)),
            (
                "apiserver_request_duration_seconds_bucket",
                "apiserver_request_total",
                "process_resident_memory_bytes",
            ),
        )
        for host in cluster.in_group("control_plane")
    }
    etcd = {
        host: parse(etcd_metrics(lab, host, MAIN.metrics_port), ETCD_FAMILIES)
        for host in cluster.in_group("etcd")
    }
    events = {
        host: parse(etcd_metrics(lab, host, EVENTS.metrics_port), ETCD_FAMILIES)
        for host in events_members(loaded)
    }
    return {
        "time": time.monotonic(),
        "api": api,
        "etcd": etcd,
        "etcd_events": events,
        "processes": lab_processes(),
    }


def metric_budget(lab: str, loaded) -> dict[str, Any]:
    """What each scrape target brings Prometheus, from Prometheus' own per-target series on the
    monitoring host: samples scraped and kept after the role's drops, by job and host; the head
    block's series in all; the Kubernetes nodes; and the DCGM series a GPU keeps (its keep-list:
    the exporter needs a GPU, so none is scraped here). {} without a monitoring host."""
    monitoring = loaded.cluster.in_group("monitoring")
    if not monitoring:
        return {}
    host = monitoring[0]

    def query(expr: str) -> dict[tuple[str, str], float]:
        url = f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        body = json.loads(host_get(lab, host, url))
        return {
            (r["metric"].get("job", ""), r["metric"].get("host", "")): float(r["value"][1])
            for r in body["data"]["result"]
        }

    scraped = query("scrape_samples_scraped")
    kept = query("scrape_samples_post_metric_relabeling")
    jobs: dict[str, dict[str, dict[str, int]]] = {}
    for (job, target), count in sorted(kept.items()):
        jobs.setdefault(job, {})[target] = {
            "scraped": int(scraped.get((job, target), 0)),
            "kept": int(count),
        }
    cluster = loaded.cluster
    return {
        "host": host,
        "jobs": jobs,
        "head_series": int(sum(query("prometheus_tsdb_head_series").values())),
        "kubernetes_nodes": sorted(
            {name for group in KUBERNETES_NODE_GROUPS for name in cluster.in_group(group)}
        ),
        "dcgm_keep_metrics": len(fleet_config(loaded).dcgm_keep_metrics),
    }


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def step_figures(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    seconds = after["time"] - before["time"]
    latencies: dict[str, Any] = {}
    for host, samples in after["api"].items():
        grouped = histogram_p99(
            before["api"][host], samples, "apiserver_request_duration_seconds",
            ("verb", "resource", "scope"),
        )  # fmt: skip
        for (verb, resource, scope), (p99, count) in grouped.items():
            if verb in SLO_EXCLUDED_VERBS:
                continue
            entry = latencies.setdefault(f"{verb} {resource} {scope}", {"count": 0, "p99": {}})
            entry["count"] += int(count)
            entry["p99"][host] = p99
    responses: dict[str, float] = defaultdict(float)
    for host, samples in after["api"].items():
        for (metric, labels), value in samples.items():
            if metric == "apiserver_request_total":
                code = dict(labels).get("code", "")
                responses[code] += value - before["api"][host].get((metric, labels), 0.0)
    processes = {}
    for key, (rss, ticks) in sorted(after["processes"].items()):
        start = before["processes"].get(key)
        cpu = (ticks - start[1]) / CLOCK_TICKS / seconds if start else None
        processes[key] = {"rss_bytes": rss, "cpu_cores": cpu}
    figures = {
        "seconds": round(seconds, 1),
        "requests": latencies,
        "responses": {code: int(n) for code, n in sorted(responses.items()) if n > 0},
        "etcd": member_figures(before["etcd"], after["etcd"]),
        "processes": processes,
    }
    if after.get("etcd_events"):
        figures["etcd_events"] = member_figures(before["etcd_events"], after["etcd_events"])
    return figures


def member_figures(before: dict[str, Samples], after: dict[str, Samples]) -> dict[str, Any]:
    """Each etcd member's figures over a step, from its two readings: database size, bytes in
    use, quota, leadership, and its WAL fsync and backend commit p99 and counts."""
    etcd: dict[str, Any] = {}
    for host, samples in after.items():
        figures = {}
        for name, key in (
            ("etcd_disk_wal_fsync_duration_seconds", "wal_fsync_p99_s"),
            ("etcd_disk_backend_commit_duration_seconds", "backend_commit_p99_s"),
        ):
            grown = histogram_p99(before[host], samples, name, ())
            figures[key] = grown.get((), (None, 0))[0]
            figures[key.replace("p99_s", "count")] = int(grown.get((), (None, 0))[1])
        figures["db_bytes"] = samples.get(("etcd_mvcc_db_total_size_in_bytes", ()))
        figures["db_in_use_bytes"] = samples.get(("etcd_mvcc_db_total_size_in_use_in_bytes", ()))
        figures["leader"] = samples.get(("etcd_server_is_leader", ())) == 1.0
        figures["quota_bytes"] = samples.get(("etcd_server_quota_backend_bytes", ()))
        etcd[host] = figures
    return etcd


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _condition_time(pod: dict, kind: str) -> float | None:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == kind and condition["status"] == "True":
            return _stamp(condition["lastTransitionTime"])
    return None


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def pod_startup(pods: list[dict]) -> dict[str, Any]:
    """Pod startup as upstream's SLI reads it, from the pods' own objects: creation to
    scheduled (PodScheduled) and creation to Ready, p50 and p99 over the pods (SLO: p99 at most
    5 s for a pod whose image is present, kubelet's or here kwok's start included), and the
    scheduler's rate over them: pods bound per second from the first creation to the last
    binding. The API's timestamps are whole seconds, so a figure under about 2 s is coarse."""
    created = {p["metadata"]["name"]: _stamp(p["metadata"]["creationTimestamp"]) for p in pods}
    scheduled = {p["metadata"]["name"]: _condition_time(p, "PodScheduled") for p in pods}
    ready = {p["metadata"]["name"]: _condition_time(p, "Ready") for p in pods}
    to_scheduled = [scheduled[n] - created[n] for n in created if scheduled[n] is not None]
    to_ready = [ready[n] - created[n] for n in created if ready[n] is not None]
    bound = [t for t in scheduled.values() if t is not None]
    span = max(bound) - min(created.values()) if bound else None
    return {
        "pods": len(pods),
        "scheduled": len(bound),
        "ready": len(to_ready),
        "scheduled_p50_s": percentile(to_scheduled, 0.5),
        "scheduled_p99_s": percentile(to_scheduled, 0.99),
        "ready_p50_s": percentile(to_ready, 0.5),
        "ready_p99_s": percentile(to_ready, 0.99),
        # Whole-second stamps: a span of 0 s is read as 1 s.
        "pods_per_s": round(len(bound) / max(span, 1.0), 1) if span is not None else None,
    }


# ---------------------------------------------------------------- the scheduler at fleet size

SCHEDULING_TEAM = "research"  # boot() gives it gpu-1 and half the simulated fleet
SCHEDULING_TIMEOUT_S = 600.0  # for a batch to run, and again for it to go
POD_IMAGE = "registry.k8s.io/pause:3.10.1"  # never pulled: kwok plays the pods


def gpu_pods(team: str, batch: str, count: int, workload_api: str | None) -> list[dict]:
    """`count` pods of `team` asking 8 GPUs each, so one per simulated node, as a training
    job's workers; with `workload_api` (the cluster's Workload group/version) a Workload first,
    holding them as one gang of `count` (the scheduler binds all of them or none)."""
    workload = {
        "apiVersion": workload_api,
        "kind": "Workload",
        "metadata": {"name": batch, "namespace": team},
        "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": count}}}]},
    }
    gpus = {"nvidia.com/gpu": "8"}
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{batch}-{i}", "namespace": team, "labels": {"batch": batch}},
            "spec": {
                **({"workloadRef": {"name": batch, "podGroup": "workers"}} if workload_api else {}),
                "tolerations": [
                    {"key": nodes.TEAM_TAINT_KEY, "value": team, "effect": "NoSchedule"}
                ],
                "containers": [
                    {
                        "name": "main",
                        "image": POD_IMAGE,
                        "resources": {"requests": {"cpu": "100m", **gpus}, "limits": gpus},
                    }
                ],
            },
        }
        for i in range(count)
    ]
    return [workload, *pods] if workload_api else pods


def _batch_pods(loaded, team: str, batch: str) -> list[dict]:
    listed = fleet.kubectl(loaded, "get", "pods", "-n", team, "-l", f"batch={batch}", "-o", "json")
    return json.loads(listed)["items"]


def _batch_names(loaded, team: str, batch: str, *selector: str) -> list[str]:
    """The batch's pod names only: polled every second, a thousand pods' objects would load
    the control plane being measured."""
    args = ("get", "pods", "-n", team, "-l", f"batch={batch}", *selector, "-o", "name")
    return fleet.kubectl(loaded, *args).split()


def schedule_batch(loaded, team: str, count: int, workload_api: str | None) -> dict[str, Any]:
    """Create `count` GPU pods of `team` at once (several kubectl processes, as a Job
    controller would), wait until all run, read upstream's pod startup SLI and the scheduler's
    rate from their own timestamps (`pod_startup`), then delete them and wait until they are
    gone, so the next batch finds the nodes free. A batch that does not run whole within
    SCHEDULING_TIMEOUT_S is recorded with the count that did."""
    batch = "sched-gang" if workload_api else "sched-plain"
    objects = gpu_pods(team, batch, count, workload_api)
    started = time.monotonic()
    if workload_api:  # before its pods, which the scheduler holds until it exists
        fleet.kubectl(loaded, "create", "-f", "-", stdin=json.dumps(objects.pop(0)))
    fleet.create(loaded, objects)
    created_s = time.monotonic() - started
    not_running = "--field-selector=status.phase!=Running"
    while _batch_names(loaded, team, batch, not_running):
        if time.monotonic() - started > SCHEDULING_TIMEOUT_S:
            break
        time.sleep(1)
    pods = _batch_pods(loaded, team, batch)
    running = sum(p.get("status", {}).get("phase") == "Running" for p in pods)
    ready = [_condition_time(p, "Ready") for p in pods]
    first = min((_stamp(p["metadata"]["creationTimestamp"]) for p in pods), default=None)
    whole = running >= count and first is not None and None not in ready
    figures = pod_startup(pods) | {
        "gang": bool(workload_api),
        "created_s": round(created_s, 1),
        "running": running,
        # From the first pod's creation to the last one's Ready, by the pods' own stamps.
        "all_running_s": max(ready) - first if whole else None,
    }
    fleet.kubectl(loaded, "delete", "pods", "-n", team, "-l", f"batch={batch}", "--wait=false")
    if workload_api:
        workload = f"workloads.{workload_api.split('/')[0]}"
        fleet.kubectl(loaded, "delete", workload, "-n", team, batch, "--ignore-not-found")
    deadline = time.monotonic() + SCHEDULING_TIMEOUT_S
    while _batch_names(loaded, team, batch):
        if time.monotonic() > deadline:
            raise LabError(f"the {batch} pods of {team} were not gone after the batch")
        time.sleep(2)
    return figures


def scheduling(loaded, log: Callable[[str], None]) -> dict[str, Any]:
    """The scheduler at the fleet's size: the team's simulated nodes are cleared of the
    preflight taint, as the gate clears a node whose burn-in passed (no burn-in runs on a
    simulated node), then one batch of a pod per team node (less those its GPU balloons hold)
    without a gang, and the same batch as one gang. The taint is put back after, also on
    failure."""
    team_nodes = sorted(
        name
        for name, node in fleet.simulated_nodes(loaded).items()
        if node["metadata"].get("labels", {}).get(nodes.TEAM_LABEL_KEY) == SCHEDULING_TEAM
    )
    # A GPU balloon of the team holds a node of its own once the taint is lifted: the batches
    # leave it that room, so both measure the scheduler alone, not preemption (make test
    # shows a balloon preempted).
    ballooned = sum(
        pool.replicas
        for pool in fleet_config(loaded).balloons.values()
        if pool.team == SCHEDULING_TEAM and pool.gpus
    )
    count = len(team_nodes) - ballooned
    if count <= 0:
        return {"team": SCHEDULING_TEAM, "nodes": len(team_nodes), "batches": []}
    workload_api = in_tree_gang(loaded.cluster.versions.kubernetes).workload_api
    fleet.kubectl(loaded, "taint", "nodes", *team_nodes, f"{nodes.PREFLIGHT_TAINT_KEY}-")
    batches = []
    try:
        for api in (None, workload_api):
            figures = schedule_batch(loaded, SCHEDULING_TEAM, count, api)
            batches.append(figures)
            log(
                f"  scheduling {figures['pods']} pods ({'one gang' if api else 'no gang'}): "
                f"{figures['pods_per_s']} bound/s, all running after {figures['all_running_s']} s"
            )
    finally:
        fleet.kubectl(loaded, "taint", "nodes", "--overwrite", *team_nodes, nodes.PREFLIGHT_TAINT)
    return {
        "team": SCHEDULING_TEAM,
        "nodes": len(team_nodes),
        "balloon_nodes": ballooned,
        "batches": batches,
    }


def summary(size: int, step: dict[str, Any]) -> str:
    lines = [f"== {size} simulated nodes: step of {step['seconds']} s, load {step['load']}"]
    lines.append(f"   fleet: {step['fleet']}")
    worst = sorted(
        step["requests"].items(),
        key=lambda item: -max((v or 0) for v in item[1]["p99"].values()),
    )[:12]
    for name, entry in worst:
        p99 = max((v or 0) for v in entry["p99"].values())
        lines.append(f"   {name:55s} n={entry['count']:7d} p99 max {p99 * 1000:8.1f} ms")
    for host, figures in step["etcd"].items():
        lines.append(
            f"   {host}: db {figures['db_bytes'] / 2**20:.1f} MiB, fsync p99 "
            f"{(figures['wal_fsync_p99_s'] or 0) * 1000:.1f} ms, commit p99 "
            f"{(figures['backend_commit_p99_s'] or 0) * 1000:.1f} ms"
            + (" (leader)" if figures["leader"] else "")
        )
    for key, figures in step["processes"].items():
        cpu = figures["cpu_cores"]
        lines.append(
            f"   {key:40s} rss {figures['rss_bytes'] / 2**20:7.0f} MiB"
            + (f"  cpu {cpu:.2f} cores" if cpu is not None else "")
        )
    return "\n".join(lines)


def sized_settings(nodes: int) -> dict[str, dict[str, int]]:
    """What inventory/sizing.py derives for a fleet of `nodes`, as the inventory keys that set
    it: the API servers' read and write slots and etcd's quota. Not CoreDNS's replicas (157 at
    2,500 nodes: the simulated nodes' taints keep them off, and the lab's two workers hold 110
    pods each) nor Prometheus' scrape interval (it scrapes no simulated node)."""
    fleet_sizing = sizing(nodes)
    return {
        "kubernetes": {
            "max_requests_inflight": fleet_sizing.max_requests_inflight,
            "max_mutating_requests_inflight": fleet_sizing.max_mutating_requests_inflight,
        },
        "etcd": {"quota_backend_bytes": fleet_sizing.etcd_quota_backend_bytes},
    }


def boot(
    lab: str,
    inventory: Path | None = None,
    events_apart: bool = True,
    sized_for: int | None = None,
) -> Path:
    """The smallest lab with the real control plane: the default topology without its storage
    hosts (as tests/integration/test_kubernetes.py boots it): five etcd members, three API
    servers behind lb-1, cpu-1 and gpu-1; the sample's two teams, research owning gpu-1 and
    inference only simulated nodes. Apply it next (`gpuinfra apply`). Without `events_apart`
    the Events stay in the main etcd (`etcd.events.enabled: false`), the comparison's before:
    the sample keeps them in their own cluster. With `sized_for` the inventory sets what
    inventory/sizing.py derives for that many nodes (`sized_settings`); without it the lab's
    five real nodes size it, which is upstream's defaults: the sizing comparison's before."""
    from lab import lifecycle
    from lab.topology import Topology, default_topology

    hosts = tuple(host for host in default_topology().hosts if "storage" not in host.groups)
    result = lifecycle.up(
        lab, Topology(hosts, "kubernetes"), inventory_path=inventory, kubernetes=True
    )
    data = yaml.safe_load(result.inventory_path.read_text())
    data["teams"] = {"research": {"hosts": ["gpu-1"]}, "inference": {"hosts": []}}
    if not events_apart:
        data["group_vars"]["etcd"]["etcd"]["events"] = {"enabled": False}
    if sized_for is not None:
        settings = sized_settings(sized_for)
        data["group_vars"]["all"]["kubernetes"].update(settings["kubernetes"])
        data["group_vars"]["etcd"]["etcd"].update(settings["etcd"])
    result.inventory_path.write_text(yaml.safe_dump(data, sort_keys=False))
    return result.inventory_path


def daemonsets(loaded) -> dict[str, dict[str, int]]:
    """Each DaemonSet's pods: how many nodes it should run on and on how many it is Ready
    (kwok plays those on the simulated nodes), by namespace/name."""
    listed = json.loads(fleet.kubectl(loaded, "get", "daemonsets", "-A", "-o", "json"))
    return {
        f"{item['metadata']['namespace']}/{item['metadata']['name']}": {
            "desired": item.get("status", {}).get("desiredNumberScheduled", 0),
            "ready": item.get("status", {}).get("numberReady", 0),
        }
        for item in listed["items"]
    }


def measure_step(lab: str, loaded, size: int, settle: float) -> dict[str, Any]:
    """Make the fleet `size` nodes, wait `settle` seconds, and read the step's figures."""
    before = reading(lab, loaded)
    result = fleet.scale(lab, size)
    time.sleep(settle)
    after = reading(lab, loaded)
    step = step_figures(before, after)
    step.update(size=size, fleet=result.__dict__, load=load_average())
    step["daemonsets"] = daemonsets(loaded)
    return step


def grow(
    lab: str,
    sizes: list[int] | tuple[int, ...],
    settle: float,
    results: dict[str, Any],
    save: Callable[[dict[str, Any]], None],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Append a step per size to results["steps"], saving after each. A fleet that cannot get
    Ready ends the growth: the sizes past it would only wait out the same timeout again."""
    loaded = fleet.lab_cluster(lab)
    for size in sizes:
        try:
            step = measure_step(lab, loaded, size, settle)
        except LabError as error:
            results["stopped"] = {"size": size, "error": str(error)}
            save(results)
            log(f"control plane: stopped at {size} simulated nodes: {error}")
            break
        results["steps"].append(step)
        save(results)
        log(summary(size, step))
    return results


def scheduling_at(size: int, log: Callable[[str], None]) -> dict[str, Any]:
    """`scheduling` with the fleet made `size` nodes again. A fleet that does not get back to
    that size (the nodes deleted above it load the control plane as much as their creation) is
    recorded as the error, so the steps measured before it still reach the report."""
    try:
        fleet.scale(suites.LAB, size)
    except LabError as error:
        log(f"control plane: no scheduler measurement at {size} simulated nodes: {error}")
        return {"size": size, "error": str(error), "batches": []}
    return {"size": size, **scheduling(fleet.lab_cluster(suites.LAB), log)}


def _saver(path: Path) -> Callable[[dict[str, Any]], None]:
    def save(results: dict[str, Any]) -> None:
        path.write_text(json.dumps(results, indent=1, default=str))

    return save


def _print(line: str) -> None:
    print(line, flush=True)


def suite(
    sizes: tuple[int, ...],
    settle: float,
    work: Path,
    log: Callable[[str], None],
    events_apart: bool = True,
    flow_control: Callable[[str, int, Callable[[str], None]], dict[str, Any]] | None = None,
    sized_for: int | None = None,
) -> dict[str, Any]:
    """`make bench BENCH_SUITES=controlplane`: boot the lab (`boot`), apply it, grow its fleet
    through `sizes`, and take it down at the end, also on failure. The steps are saved to
    WORK/steps.json as they come, so a run stopped halfway keeps them. Without `events_apart`
    (`--cp-events-in-main`) the lab keeps its Events in the main etcd and the run is the
    before of that comparison: the same steps, no scheduler batches. Every run ends with
    Prometheus' series per target (`metric_budget`). With `sized_for`
    (`--cp-sized-for N`) the inventory is sized for N nodes (`boot`), the after of the sizing
    comparison, again without scheduler batches. `flow_control`
    (`--cp-apf`: benchmarks/flow_control.py's `comparison`) runs last, at the largest size
    held: a fleet operation with and without fleet_policy's flow schema."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "lab": suites.LAB, "sizes": list(sizes), "settle_s": settle,
        "events_etcd": events_apart, "steps": [],
    }  # fmt: skip
    if sized_for is not None:
        results["sized_for"] = {"nodes": sized_for, **sized_settings(sized_for)}
    log(f"control plane: lab {suites.LAB}, simulated nodes {' '.join(map(str, sizes))}")
    suites.lab_down(log)  # a lab of that name left by an earlier run
    try:
        started = time.monotonic()
        inventory = boot(suites.LAB, work / "cluster.yml", events_apart, sized_for)
        log(f"  lab up: {time.monotonic() - started:.1f}s")
        suites.apply(inventory, work / "apply.json", log)
        grow(suites.LAB, sizes, settle, results, _saver(work / "steps.json"), log)
        # At the largest size the growth held: the scheduler's rate there, with and without
        # gangs (a fleet that stopped growing has the held size's nodes back first).
        held = [step["size"] for step in results["steps"]]
        if events_apart and sized_for is None and held and held[-1]:
            results["scheduling"] = scheduling_at(held[-1], log)
            _saver(work / "steps.json")(results)
        if flow_control is not None and held and held[-1]:
            results["flow_control"] = flow_control(suites.LAB, held[-1], log)
            _saver(work / "steps.json")(results)
        try:
            results["metric_budget"] = metric_budget(suites.LAB, fleet.lab_cluster(suites.LAB))
        except (OSError, subprocess.SubprocessError, ValueError, KeyError) as error:
            # The steps measured above still reach the report.
            results["metric_budget"] = {"error": str(error)}
        _saver(work / "steps.json")(results)
    finally:
        # kwok's log goes with the lab: kept beside the steps, where a stopped growth is read.
        kwok_log = fleet.fleet_dir(suites.LAB) / "kwok.log"
        if kwok_log.is_file():
            shutil.copyfile(kwok_log, work / "kwok.log")
        suites.lab_down(log)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.control_plane", description=__doc__)
    parser.add_argument("--lab", default=naming.DEFAULT_NAME)
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 100, 500])
    parser.add_argument("--settle", type=float, default=SETTLE_S, help="seconds at each size")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--boot", action="store_true", help="boot the lab and stop there")
    args = parser.parse_args(argv)
    if args.boot:
        print(f"inventory: {boot(args.lab)}")
        return 0
    if args.out is None:
        parser.error("--out is required")
    results = json.loads(args.out.read_text()) if args.out.exists() else {"steps": []}
    grow(args.lab, args.sizes, args.settle, results, _saver(args.out), _print)
    return 0 if "stopped" not in results else 1


if __name__ == "__main__":
    sys.exit(main())
