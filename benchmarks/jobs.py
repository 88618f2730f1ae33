"""The jobs suite (`make bench BENCH_SUITES=jobs`): `gpuinfra drift --job` measured on two labs
at once, for the projection to 7,500 hosts (docs/design/fleet-jobs.md sections 6 and 7 step 6).

- Lab A (BENCH_JOBS_LAB_A, default `bench-jobs-k8s`): the Kubernetes lab of
  tests/integration/test_drift_job.py, its topology (the default one without the storage
  hosts) and its drift Job settings (pods on cpu-1, the lab's own gpuinfra image, `cni: routes`
  with `routes_nat_outgoing`); without that test's team and balloon pool, whose 700m on cpu-1
  would leave eight shards' pods waiting on a preemption. Local drift against `--job` in
  interleaved rounds: their exits and host statuses must be equal.
- Fleet lab B (BENCH_JOBS_LAB_B, default `bench-jobs-fleet`): `--hosts N`, no Kubernetes, on a
  converged layer as the drift suite boots its labs, with `drift_job.sources: [B's gateway]`:
  the pods on lab A reach B through A's masquerade, so B sees them come from its own gateway,
  its admin network. First a pod on cpu-1 opens ssh on B's hosts (a FORWARD drop shows here),
  then the rounds: local drift against `drift --job --job-cluster A --shards S` for S in 2, 4,
  8. Each shard reports its CPU (getrusage of itself and its ssh clients) and its container's
  memory peak; the controller keeps them in its report's notes.
- N: 100, then 200 when the machine still has 10 GiB available (MemAvailable, what `free`
  shows as available) with both labs up at 100; the results say which ran and why.
- The controller with 7,500 hosts' records: `python -m benchmarks.jobs merge-records`, one
  process, its peak resident memory.

Both labs are taken down at the end, also on failure (BENCH_JOBS_KEEP=1 leaves them up).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import yaml

from benchmarks.commandline import WRITE_BYTECODE
from benchmarks.measure import run_measured
from benchmarks.suites import GPUINFRA, Log, _run, apply, converged_layer

LAB_A = os.environ.get("BENCH_JOBS_LAB_A", "bench-jobs-k8s")
LAB_B = os.environ.get("BENCH_JOBS_LAB_B", "bench-jobs-fleet")
KEEP_ENV = "BENCH_JOBS_KEEP"
NODE = "cpu-1"  # lab A's node the Job's pods run on, as in the lab test
SHARDS = (2, 4, 8)
LAB_A_SHARDS = 2
SIZES = (100, 200)
# A further fleet size runs only with this much memory available, both labs up (design §6).
MIN_AVAILABLE_GIB = 10.0
# ssh clients per shard in lab B (39 MiB + 6.1 MiB each, results.md) and the pods' memory
# limit, set in lab A (the Job's cluster places the pods): 39 + 6.1 * 32 = 234 MiB.
PARALLEL = 32
POD_MEMORY = "384Mi"
# A CPU request small enough for eight pods on cpu-1's 1 CPU allocatable (requests only
# schedule: a pod is not throttled to it).
POD_CPU = "50m"
MERGE_HOSTS = 7500
MERGE_HOSTS_PER_SHARD = 200
SETTLED = re.compile(r"drift --job: (\d+) shard\(s\) settled (\d+) of (\d+) hosts")
PREFLIGHT_S = 240


def jobs(repeats: int, work: Path, log: Log, sizes: tuple[int, ...] = SIZES) -> dict:
    """Both labs, every run, the merge measurement; both labs down at the end."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"job_node": NODE, "parallel": PARALLEL, "pod_memory": POD_MEMORY}
    log(f"jobs: lab A {LAB_A} (Kubernetes), fleet lab B {LAB_B} at {sizes} hosts")
    layer, results["converged_layer"] = converged_layer(work / "layer", log)
    _down(LAB_A, log)
    _down(LAB_B, log)
    try:
        lab_a = _lab_a(work / "a", log)
        results["lab_a"] = _compare_a(lab_a, repeats, log)
        fleet: dict[str, dict] = {}
        results["fleet"] = fleet
        notes = []
        for position, size in enumerate(sizes):
            if position > 0:
                available = _available_gib()
                if available < MIN_AVAILABLE_GIB:
                    notes.append(
                        f"Lab B at {size} hosts not run: {available:.1f} GiB available with both "
                        f"labs up at {sizes[position - 1]} hosts, under {MIN_AVAILABLE_GIB:.0f}."
                    )
                    log(f"jobs: {notes[-1]}")
                    break
                notes.append(
                    f"Lab B at {size} hosts: {available:.1f} GiB were available with both labs "
                    f"up at {sizes[position - 1]} hosts."
                )
                log(f"jobs: {notes[-1]}")
                _down(LAB_B, log)
            fleet[str(size)] = _fleet(lab_a, size, layer, work / f"b-{size}", repeats, log, results)
            fleet[str(size)]["available_gib_both_labs_up"] = round(_available_gib(), 1)
        ran = ", ".join(str(e["hosts"]) for e in fleet.values())
        results["sizes_note"] = f"Lab B ran at {ran} hosts. " + " ".join(notes)
    finally:
        if os.environ.get(KEEP_ENV) == "1":
            log(f"jobs: {KEEP_ENV}=1: labs {LAB_A} and {LAB_B} left up")
        else:
            _down(LAB_B, log)
            _down(LAB_A, log)
    return results


# -- the labs ----------------------------------------------------------------------------------


class LabA:
    def __init__(self, inventory: Path, hosts: int):
        from engine.context import load
        from lab import gobuild

        self.inventory = inventory
        self.hosts = hosts
        loaded = load(inventory)
        self.kubectl_binary = str(
            gobuild.kubernetes_module(loaded.cluster.versions.kubernetes).binary("kubectl")
        )
        self.image = loaded.cluster.group_vars["all"]["drift_job"]["image"]

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        kubeconfig = self.inventory.parent / ".state" / "kubernetes" / "admin.conf"
        result = subprocess.run(
            [self.kubectl_binary, "--kubeconfig", str(kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()[-2000:]}")
        return result.stdout


def kubernetes_topology():
    """The default lab without its storage hosts: the drift Job's figures need no CephFS."""
    from lab.topology import Topology, default_topology

    hosts = tuple(host for host in default_topology().hosts if "storage" not in host.groups)
    return Topology(hosts, "kubernetes")


def lab_a_inventory(path: Path) -> None:
    """The lab test's drift Job settings (tests/integration/test_drift_job.py job_inventory),
    with the pods' requests of this suite."""
    data = yaml.safe_load(path.read_text())
    everyone = data["group_vars"]["all"]
    everyone["drift_job"] = {
        "enabled": True,
        "nodes": [NODE],
        "image": everyone["gpu_health"]["image"],  # the lab's gpuinfra image, this checkout's
        "cpu": POD_CPU,
        "memory": POD_MEMORY,
        "parallel": 16,
    }
    everyone["kubernetes"]["routes_nat_outgoing"] = True
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def lab_b_inventory(path: Path) -> str:
    """Lab B's Job settings: no node of its own, the key admitted from its gateway (where lab
    A's masquerade makes the pods come from). Returns that gateway."""
    data = yaml.safe_load(path.read_text())
    gateway = data["networks"]["admin"][0]
    data["group_vars"]["all"]["drift_job"] = {
        "enabled": True,
        "sources": [gateway],
        "parallel": PARALLEL,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return gateway


def _lab_a(work: Path, log: Log) -> LabA:
    from lab import lifecycle

    work.mkdir(parents=True, exist_ok=True)
    topology = kubernetes_topology()
    log(f"lab A: {len(topology.hosts)} hosts with Kubernetes")
    started = time.monotonic()
    result = lifecycle.up(LAB_A, topology, inventory_path=work / "cluster.yml", kubernetes=True)
    log(f"  lab up: {time.monotonic() - started:.1f}s")
    lab_a_inventory(result.inventory_path)
    apply(result.inventory_path, work / "apply.json", log)
    return LabA(result.inventory_path, len(topology.hosts))


def _fleet(
    lab_a: LabA, size: int, layer: Path, work: Path, repeats: int, log: Log, results: dict
) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    inventory = work / "cluster.yml"
    log(f"lab B: {size} hosts, no Kubernetes")
    boot, _ = _run(
        [GPUINFRA, "lab", "up", "--name", LAB_B, "--hosts", str(size), "--no-kubernetes",
         "--layer", str(layer), "--inventory", str(inventory)],
        log,
    )  # fmt: skip
    gateway = lab_b_inventory(inventory)
    log(f"  drift_job.sources: [{gateway}]")
    apply_seconds, _ = apply(inventory, work / "apply.json", log)
    preflight(lab_a, inventory, log)
    if "merge_7500" not in results:
        results["merge_7500"] = merge_measured(inventory, work / "merge", log)
    engines = {"local": []} | {f"job-{s}": ["--job", "--job-cluster", str(lab_a.inventory),
                                           "--shards", str(s)] for s in SHARDS}  # fmt: skip
    runs = rounds(inventory, size, engines, repeats, log, expect_settled=size)
    return {
        "hosts": size,
        "lab_up_seconds": round(boot, 2),
        "first_apply_seconds": round(apply_seconds, 2),
        "runs": runs,
    }


def _compare_a(lab_a: LabA, repeats: int, log: Log) -> dict:
    log(f"lab A: local drift against --job --shards {LAB_A_SHARDS}, {repeats} rounds")
    engines = {"local": [], f"job-{LAB_A_SHARDS}": ["--job", "--shards", str(LAB_A_SHARDS)]}
    runs = rounds(lab_a.inventory, lab_a.hosts, engines, repeats, log, expect_settled=lab_a.hosts)
    return {"hosts": lab_a.hosts, "runs": runs}


def _down(name: str, log: Log) -> None:
    result = subprocess.run([GPUINFRA, "lab", "down", "--name", name], capture_output=True)
    log(f"  lab down {name}: exit {result.returncode}")


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


# -- the preflight: a pod of lab A reaches lab B's ssh -----------------------------------------

PREFLIGHT_SCRIPT = """
import socket, sys
failed = 0
for address in sys.argv[1:]:
    try:
        with socket.create_connection((address, 22), timeout=5) as s:
            s.settimeout(5)
            print(address, s.recv(64).decode(errors="replace").strip())
    except OSError as exc:
        failed += 1
        print(address, "error", exc)
sys.exit(1 if failed else 0)
"""


def preflight(lab_a: LabA, inventory: Path, log: Log) -> None:
    """A pod on the Job's node opens ssh on a few of B's hosts and reads their banners: a
    FORWARD drop or a missing masquerade between the labs fails here, named."""
    from engine.context import load

    hosts = load(inventory).cluster.hosts
    targets = [str(h.address) for h in list(hosts.values())[:3]]
    name = f"bench-jobs-preflight-{time.monotonic_ns() % 1000000}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "preflight",
                    "image": lab_a.image,
                    "command": ["python3", "-c", PREFLIGHT_SCRIPT, *targets],
                }
            ],
        },
    }
    lab_a.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    try:
        deadline = time.monotonic() + PREFLIGHT_S
        phase = ""
        while time.monotonic() < deadline:
            status = json.loads(lab_a.kubectl("get", "pod", "-n", "default", name, "-o", "json"))
            phase = status.get("status", {}).get("phase", "")
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(2)
        said = lab_a.kubectl("logs", "-n", "default", name, check=False).strip()
        if phase != "Succeeded":
            raise RuntimeError(
                f"preflight: a pod on lab A's {NODE} could not open ssh on lab B's hosts "
                f"(pod {phase or 'not ended'} after {PREFLIGHT_S} s): {said or 'no output'}; "
                "check the machine's FORWARD chain and both labs' nft tables"
            )
        log(f"  preflight from a pod on {NODE}: {said.splitlines()[0] if said else 'ok'}")
    finally:
        lab_a.kubectl("delete", "pod", "-n", "default", name, "--wait=false", check=False)


# -- the runs ----------------------------------------------------------------------------------


def rounds(
    inventory: Path,
    hosts: int,
    engines: dict[str, list[str]],
    repeats: int,
    log: Log,
    expect_settled: int,
) -> list[dict]:
    """One unmeasured run of each engine (bytecode, image pulls, and the first check that the
    shards settle every host), then `repeats` rounds, the order rotated each round; each run
    compared with its round's local one."""
    names = list(engines)
    for name in names:
        run = measured(inventory, hosts, name, engines[name], log, warm_up=True)
        if run["shards"] and run.get("settled") != expect_settled:
            raise RuntimeError(
                f"{name}: the shards settled {run.get('settled')} of {expect_settled} hosts "
                f"(the pods cannot log in?): {run.get('notes_tail')}"
            )
    results: list[dict] = []
    for number in range(repeats):
        shift = number % len(names)
        batch = [
            measured(inventory, hosts, name, engines[name], log, round_number=number)
            for name in names[shift:] + names[:shift]
        ]
        local = next(r for r in batch if r["engine"] == "local")
        expected = (local["returncode"], local["_statuses"])
        for run in batch:
            run["same_as_local"] = (run["returncode"], run.pop("_statuses")) == expected
            if not run["same_as_local"]:
                log(f"  WARNING {run['engine']} round {number}: not as local drift: "
                    f"exit {run['returncode']} against {local['returncode']}")  # fmt: skip
        results += batch
    return results


def measured(
    inventory: Path,
    hosts: int,
    engine: str,
    extra: list[str],
    log: Log,
    round_number: int = -1,
    warm_up: bool = False,
) -> dict:
    argv = [GPUINFRA, "drift", str(inventory), "--format", "json", *extra]
    measurement, output = run_measured(engine, hosts, argv, env=WRITE_BYTECODE, timeout=1800)
    run = measurement.to_json()
    run.update(round=round_number, shards=_shards_of(engine))
    try:
        report = json.loads(output)
    except ValueError:
        report = None
    if report is None:
        run.update(_statuses={}, status_counts={}, settled=None, shard_usage=[])
        log(f"  {'warm-up ' if warm_up else ''}{engine}: exit {run['returncode']}, no report: "
            f"{measurement.output_tail[-600:]}")  # fmt: skip
        if warm_up:
            raise RuntimeError(f"{engine} on {inventory}: exit {run['returncode']}, no report")
        return run
    from day2.fleetjob import read_usage_notes

    statuses = {name: host["status"] for name, host in report["hosts"].items()}
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    settled = next((SETTLED.search(n) for n in report["notes"] if SETTLED.search(n)), None)
    usage = read_usage_notes(report["notes"])
    run.update(
        _statuses=statuses,
        status_counts=counts,
        settled=int(settled.group(2)) if settled else None,
        shard_usage=[{"index": i, **usage[i]} for i in sorted(usage)],
        notes_tail=report["notes"][-6:] if run["returncode"] else [],
    )
    shard_cpu = sum(s.get("cpu_s", 0) for s in run["shard_usage"])
    log(
        f"  {'warm-up ' if warm_up else ''}{engine:7} {hosts:4} hosts: {run['seconds']:7.2f}s "
        f"cpu {run['cpu_seconds']:6.2f}s peak {run['peak_tree_mib']:6.1f} MiB exit "
        f"{run['returncode']} {counts} settled {run['settled']} shards' cpu {shard_cpu:.2f}s "
        f"load {run['load_before']:.1f}"
    )
    return run


def _shards_of(engine: str) -> int:
    return int(engine.split("-")[1]) if engine.startswith("job-") else 0


# -- the controller with 7,500 hosts' records ----------------------------------------------------


def merge_measured(inventory: Path, work: Path, log: Log) -> dict:
    """`merge-records` in a process of its own, on a real record of lab B."""
    from engine import fingerprint
    from engine.context import load

    loaded = load(inventory)
    first = next(iter(loaded.cluster.hosts))
    template = fingerprint.record_path(loaded.state_dir, first)
    argv = [sys.executable, "-m", "benchmarks.jobs", "merge-records", str(template), str(work)]
    measurement, output = run_measured(
        "merge", MERGE_HOSTS, argv, cwd=Path(__file__).resolve().parents[1], timeout=1800
    )
    if measurement.returncode != 0:
        raise RuntimeError(f"merge-records: {measurement.output_tail}")
    figures = json.loads(output)
    figures["tree_peak_mib"] = measurement.peak_tree_mib
    log(
        f"  controller with {MERGE_HOSTS} records: {figures['cpu_seconds']:.2f}s CPU "
        f"(inventory {figures['load_cpu_seconds']:.2f}s), peak {figures['peak_mib']:.0f} MiB"
    )
    return figures


def _high_water_mib() -> float:
    """This process's peak resident memory (VmHWM: this process's own, reset by exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def merge_records(
    template: Path, work: Path, hosts: int = MERGE_HOSTS, per_shard: int = MERGE_HOSTS_PER_SHARD
) -> dict:
    """What the controller of a `hosts`-host `drift --job` holds and does after its shards
    answered: the inventory (benchmarks/fleet.py), every host's record read from .state/ (a
    copy of `template`), every shard's report line parsed, and the merged report (day2/
    fleetjob.py `merge`) written as JSON. CPU seconds and peak memory of this process."""
    from benchmarks.fleet import write_fleet
    from day2 import fleetjob
    from engine import fingerprint
    from engine import fleetshard as shard_io
    from engine.context import load
    from engine.reports import Mode, RunOptions, RunReport
    from engine.selection import shard_hosts

    base = _high_water_mib()
    started = time.process_time()
    loaded = load(write_fleet(hosts, work / "fleet"))
    load_cpu = time.process_time() - started
    after_load = _high_water_mib()
    names = list(loaded.cluster.hosts)
    state = work / "state"
    data = template.read_bytes()
    fingerprint.record_path(state, names[0]).parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        fingerprint.record_path(state, name).write_bytes(data)
    count = math.ceil(hosts / per_shard)
    run = fleetjob.JobRun(loaded, RunOptions(mode=Mode.drift), lambda loaded, options: None)
    lines = []
    for index in range(count):  # the shards' side: not the controller's cost
        mine = shard_hosts(names, index, count)
        answers = [shard_io.ShardHost(n, shard_io.MATCHED, "", 0.5) for n in mine]
        usage = {"cpu_s": 1.0, "max_rss_kib": 40000, "seconds": 2.0}
        lines.append(shard_io.report_line(run.run, index, count, answers, usage))
        run.shard_of.append(mine)
        run.sheets.append(("", ""))
    started = time.process_time()
    run.hosts = names
    for name in names:
        record = fingerprint.load_record(state, name)
        if record is None:
            raise RuntimeError(f"{template}: not a record of this gpuinfra")
        run.records[name] = record
    for index, line in enumerate(lines):
        document = shard_io.read_report(line)
        for name, status, reason, seconds in document["hosts"]:
            run.answered[name] = shard_io.ShardHost(name, status, reason, seconds)
        run.usage[index] = document["rusage"]
    run.exact_report = RunReport(cluster=loaded.cluster.name, mode=Mode.drift)
    fleetjob.merge(run)
    assert run.report is not None
    text = json.dumps(asdict(run.report), indent=2)
    cpu = time.process_time() - started
    return {
        "hosts": hosts,
        "shards": count,
        "operations_per_record": len(run.records[names[0]].operations),
        "report_mib": round(len(text) / 2**20, 1),
        "load_cpu_seconds": round(load_cpu, 3),
        "cpu_seconds": round(cpu, 3),
        "base_mib": round(base, 1),
        "after_load_mib": round(after_load, 1),
        "peak_mib": round(_high_water_mib(), 1),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "merge-records":
        print("usage: python -m benchmarks.jobs merge-records RECORD WORK", file=sys.stderr)
        return 2
    print(json.dumps(merge_records(Path(argv[1]), Path(argv[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
