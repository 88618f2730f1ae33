"""The benchmark suites: drift at scale (three engines), bootstrap of the default lab.

Each suite boots its own lab (name `bench` unless BENCH_LAB says otherwise), one at a time,
and takes it down afterwards, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.commandline import WRITE_BYTECODE
from benchmarks.engines import declared_state, write_engines, write_probes
from benchmarks.measure import Measurement, run_measured
from engine.context import load

BIN = Path(sys.executable).parent
GPUINFRA = str(BIN / "gpuinfra")
LAB = os.environ.get("BENCH_LAB", "bench")
# gpuinfra-exact: `gpuinfra drift --exact`, every host operation by operation (the path a host
# takes when it has no converged record or differs from it); gpuinfra: the default fast path.
EXACT = "gpuinfra-exact"
# floor-probe: gpuinfra's own probe sent by the floor's client (benchmarks/floor.py --probes).
PROBE_FLOOR = "floor-probe"
# connect: the floor's client with each host running `true` (benchmarks/floor.py --connect):
# the connection alone, which every engine's time includes.
CONNECT = "connect"
ENGINES = ("gpuinfra", EXACT, "pyinfra", "ansible", "floor", PROBE_FLOOR, CONNECT)
# `--baseline DIR`: another checkout of gpuinfra (e.g. `git archive` of an older commit) run
# as a fourth engine in the same rounds, for before/after figures of an engine change.
BASELINE = "gpuinfra-baseline"
# ansible-playbook with forks = N holds one process of about 75 MiB per host (7.5 GiB at 100
# hosts, measured): past this size it would not fit in memory beside the lab's hosts.
ANSIBLE_MAX_HOSTS = 100

Log = Callable[[str], None]


def _run(argv: list[str], log: Log, timeout: float = 3600, **kwargs) -> tuple[float, str]:
    """Run a setup step; fail loudly with its output."""
    started = time.monotonic()
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kwargs
    )
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:4])}... exited {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    log(f"  {' '.join(Path(a).name if '/' in a else a for a in argv[:3])}: {seconds:.1f}s")
    return seconds, result.stdout


def lab_up(
    work: Path, log: Log, hosts: int | None = None, layer: Path | None = None
) -> tuple[Path, float]:
    inventory = work / "cluster.yml"
    shape = ["--hosts", str(hosts)] if hosts else ["--topology", "default"]
    # The engine's figures stay comparable with earlier runs: the hosts' roles, no Kubernetes.
    shape.append("--no-kubernetes")
    if layer is not None:
        shape += ["--layer", str(layer)]
    subprocess.run([GPUINFRA, "lab", "down", "--name", LAB], capture_output=True)
    seconds, _ = _run(
        [GPUINFRA, "lab", "up", "--name", LAB, *shape, "--inventory", str(inventory)], log
    )
    return inventory, seconds


def converged_layer(work: Path, log: Log) -> tuple[Path, dict]:
    """One plain host converged from bare by `gpuinfra apply`, saved as a lab layer: the drift
    suite's N hosts boot on it, so converging them is an apply of their own files only (minutes
    of apt per host, and a copy of every package per host on disk and in memory, saved)."""
    layer = (work / "layer").absolute()
    subprocess.run(["rm", "-rf", str(layer)], check=True)
    log("converged layer: 1 host")
    try:
        inventory, boot = lab_up(work, log, hosts=1)
        seconds, _ = apply(inventory, work / "apply.json", log)
        _run([GPUINFRA, "lab", "save-layer", "host-001", "--name", LAB, "--out", str(layer)], log)
    finally:
        lab_down(log)
    return layer, {"lab_up_seconds": round(boot, 2), "apply_seconds": round(seconds, 2)}


def lab_down(log: Log) -> None:
    result = subprocess.run([GPUINFRA, "lab", "down", "--name", LAB], capture_output=True)
    log(f"  lab down: exit {result.returncode}")


def apply(inventory: Path, report: Path, log: Log) -> tuple[float, dict]:
    seconds, _ = _run(
        [GPUINFRA, "apply", str(inventory), "--yes", "--format", "json", "--report", str(report)],
        log,
    )
    data = json.loads(report.read_text())
    statuses = {h["status"] for h in data["hosts"].values()}
    if not statuses <= {"ok", "changed"}:
        raise RuntimeError(f"apply left hosts {statuses}")
    return seconds, data


class Engines:
    """The three engines' commands on one lab, each checking the same declared state."""

    def __init__(self, inventory: Path, work: Path, log: Log, baseline: Path | None = None):
        self.baseline = baseline
        self.inventory = inventory.resolve()
        self.work = work.resolve()  # pyinfra runs in it: every path below must be absolute
        self.log = log
        self.loaded = load(self.inventory)
        self.hosts = len(self.loaded.cluster.hosts)
        engines = tuple(e for e in ENGINES if e != "ansible" or self.hosts <= ANSIBLE_MAX_HOSTS)
        self.names = engines + ((BASELINE,) if baseline else ())
        self.skipped = {} if "ansible" in self.names else {
            "ansible": f"not run past {ANSIBLE_MAX_HOSTS} hosts: forks = {self.hosts} would "
            "need about 75 MiB per fork beside the lab's hosts on this machine"
        }  # fmt: skip
        render = self.work / "render"
        _run([GPUINFRA, "render", str(self.inventory), "--out", str(render)], log)
        self.state = declared_state(self.loaded, render)
        self.files = write_engines(self.loaded, self.state, self.work / "engines")
        self.ansible_env = {
            "ANSIBLE_CONFIG": str(self.files.ansible_cfg),
            "ANSIBLE_NOCOLOR": "1",
        }
        self.probes: Path | None = None  # prepare_probes, once the records are final

    def prepare_probes(self) -> None:
        self.probes = write_probes(load(self.inventory), self.files.floor_hosts)
        self.log(f"  {PROBE_FLOOR}: probes written and checked against the records")

    def prepare_ansible(self) -> bool:
        """Ansible's apt module needs python3-apt on the host (check mode cannot install it).
        True when it ran (the hosts have python3-apt now)."""
        if "ansible" not in self.names:
            return False
        _run(
            [
                str(BIN / "ansible"),
                "all",
                "-m",
                "raw",
                "-a",
                "dpkg -s python3-apt >/dev/null 2>&1 || "
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
                "python3-apt",
            ],
            self.log,
            env={**os.environ, **self.ansible_env},
        )
        return True

    def warm_up(self) -> None:
        """gpuinfra runs as an installed command does, its bytecode caches written (as the
        command-line suite runs it, benchmarks/commandline.py): one unmeasured run of each of
        its paths writes them, and the measured runs may write what is left."""
        for engine in ("gpuinfra", EXACT, BASELINE):
            if engine in self.names:
                self.measure(engine, log=False)

    def measure(self, engine: str, log: bool = True) -> Measurement:
        if engine in ("gpuinfra", EXACT, BASELINE):
            entry = [GPUINFRA]
            if engine == BASELINE:
                entry = [sys.executable, "-c", "import sys; sys.path.insert(0, '.'); "
                         "from cli.main import app; app()"]  # fmt: skip
            argv = [*entry, "drift", str(self.inventory.resolve()), "--format", "json"]
            argv += ["--exact"] if engine == EXACT else []
            cwd = self.baseline if engine == BASELINE else None
            measurement, output = run_measured(
                engine, self.hosts, argv, cwd=cwd, env=WRITE_BYTECODE
            )
            measurement.changes = _gpuinfra_changes(output)
            measurement.parallelism = _gpuinfra_parallelism(output)
        elif engine == "pyinfra":
            argv = [
                str(BIN / "pyinfra"),
                str(self.files.pyinfra_inventory),
                str(self.files.pyinfra_deploy),
                "--dry",  # without --yes: pyinfra skips change detection under --yes
                "--json",  # non-interactive, and the plan says which hosts would change
                "--parallel",
                str(self.hosts),
            ]
            measurement, output = run_measured(engine, self.hosts, argv, cwd=self.work)
            measurement.changes = _pyinfra_changes(output)
        elif engine in ("floor", PROBE_FLOOR, CONNECT):
            argv = [sys.executable, "-m", "benchmarks.floor"]
            if engine == PROBE_FLOOR:
                argv += ["--probes", str(self.probes)]
            elif engine == CONNECT:
                argv.append("--connect")
            else:
                argv.append(str(self.files.state))
            argv.append(str(self.files.floor_hosts.resolve()))
            cwd = Path(__file__).resolve().parents[1]
            measurement, output = run_measured(engine, self.hosts, argv, cwd=cwd)
            measurement.changes = _floor_changes(output)
        else:
            # A fresh control-socket folder per run: no master connection survives from an
            # earlier run, as neither other engine keeps connections between runs.
            control = self.work / "ansible-cp" / str(time.monotonic_ns())
            control.mkdir(parents=True)
            argv = [str(BIN / "ansible-playbook"), "--check", str(self.files.ansible_playbook)]
            env = {**self.ansible_env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control)}
            measurement, output = run_measured(engine, self.hosts, argv, env=env)
            measurement.changes = _ansible_changes(output)
            _end_control_masters(control)
        if not log:
            return measurement
        self.log(
            f"  {engine:8} {self.hosts:4} hosts: {measurement.seconds:7.2f}s "
            f"cpu {measurement.cpu_seconds:6.2f}s peak {measurement.peak_tree_mib:7.1f} MiB "
            f"exit {measurement.returncode} changes {measurement.changes} "
            f"machine cpu {measurement.machine_cpu_seconds:6.2f}s "
            f"load {measurement.load_before:.1f}"
        )
        return measurement


def _end_control_masters(control: Path) -> None:
    """Ansible's ssh control masters outlive the run by ControlPersist (60 s), detached from
    its process tree: end them so they do not run beside the next engine."""
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(control) in " ".join(process.info["cmdline"] or []):
                process.terminate()


def _gpuinfra_changes(output: str) -> int | None:
    try:
        report = json.loads(output)
    except ValueError:
        return None
    return sum(1 for h in report["hosts"].values() for op in h["operations"] if op["changed"])


def _gpuinfra_parallelism(output: str) -> float | None:
    try:
        report = json.loads(output)
    except ValueError:
        return None
    busy = sum(h["seconds"] for h in report["hosts"].values())
    return round(busy / report["seconds"], 1) if report["seconds"] else None


def _pyinfra_changes(output: str) -> int | None:
    try:
        plan = json.loads(output)["plan"]
    except (ValueError, KeyError):
        return None
    return sum(len(op["hosts_with_change"]) for op in plan)


def _floor_changes(output: str) -> int | None:
    try:
        hosts = json.loads(output)["hosts"].values()
    except (ValueError, KeyError):
        return None
    return sum(h["changes"] or 0 for h in hosts)


def _ansible_changes(output: str) -> int | None:
    recap = re.findall(r"changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output)
    if not recap:
        return None
    return sum(int(c) + int(u) + int(f) for c, u, f in recap)


def compare_engines(engines: Engines, repeats: int) -> list[Measurement]:
    """Every engine `repeats` times, interleaved, the order rotated each round so that load
    drifting during the run does not favour one engine."""
    results: list[Measurement] = []
    names = engines.names
    for round_number in range(repeats):
        shift = round_number % len(names)
        order = names[shift:] + names[:shift]
        for engine in order:
            results.append(engines.measure(engine))
    return results


def check_with_engines(
    inventory: Path, work: Path, log: Log, baseline: Path | None, repeats: int
) -> tuple[Engines, list[Measurement]]:
    """Every engine's no-op check of a converged lab, `repeats` rounds."""
    engines = Engines(inventory, work, log, baseline)
    if engines.prepare_ansible():
        # python3-apt changed every host's package list, a fact the roles' deploys read: an
        # apply (which changes nothing) keeps each host's converged record as it is now, as an
        # operator's next apply would after installing a package by hand.
        apply(inventory, work / "apply-after-ansible.json", log)
    engines.prepare_probes()
    engines.warm_up()
    return engines, compare_engines(engines, repeats)


def drift_at_scale(
    size: int,
    repeats: int,
    work: Path,
    log: Log,
    baseline: Path | None = None,
    layer: Path | None = None,
) -> dict:
    """Boot N plain hosts (on a converged layer when given), converge them with one apply, then
    compare the three engines' no-op checks."""
    work.mkdir(parents=True, exist_ok=True)
    log(f"drift at scale: {size} hosts")
    try:
        inventory, boot = lab_up(work, log, hosts=size, layer=layer)
        apply_seconds, _ = apply(inventory, work / "apply.json", log)
        engines, runs = check_with_engines(inventory, work, log, baseline, repeats)
    finally:
        lab_down(log)
    return {
        "hosts": size,
        "topology": f"--hosts {size}",
        "lab_up_seconds": round(boot, 2),
        "first_apply_seconds": round(apply_seconds, 2),
        "on_converged_layer": layer is not None,
        "engines_not_run": engines.skipped,
        "operations_per_host": _operations(engines),
        "runs": [r.to_json() for r in runs],
    }


def _operations(engines: Engines) -> dict:
    counts = engines.state.operations_per_host
    return {"same_state": max(counts.values()) if counts else 0}


def empty_package_cache(log: Log) -> None:
    """Stop the lab's package cache and remove what it holds: the next `lab up` starts it
    empty, so the first apply downloads every package once (a cold cache)."""
    from lab import aptcache

    aptcache.empty()
    log(f"package cache emptied: {aptcache.CACHE_DIR}")


def bootstrap_cold(work: Path, log: Log) -> dict:
    """The first apply of the default lab with the package cache emptied before it."""
    work.mkdir(parents=True, exist_ok=True)
    log("bootstrap: default lab, cold package cache")
    empty_package_cache(log)
    try:
        inventory, boot = lab_up(work, log)
        first, report = apply(inventory, work / "apply.json", log)
    finally:
        lab_down(log)
    return {
        "lab_up_seconds": round(boot, 2),
        "apply_seconds": round(first, 2),
        "apply_phase_seconds": {k: round(v, 2) for k, v in report["phase_seconds"].items()},
    }


def bootstrap(repeats: int, work: Path, log: Log, baseline: Path | None = None) -> dict:
    """The default 12-host lab from bare hosts: apply (per phase), a no-op apply, and the
    engines' no-op checks on it."""
    work.mkdir(parents=True, exist_ok=True)
    log("bootstrap: default lab")
    try:
        inventory, boot = lab_up(work, log)
        first, first_report = apply(inventory, work / "apply.json", log)
        second, second_report = apply(inventory, work / "apply-noop.json", log)
        changed = [
            n for n, h in second_report["hosts"].items() if h["status"] != "ok"
        ]  # fmt: skip
        engines, runs = check_with_engines(inventory, work, log, baseline, repeats)
    finally:
        lab_down(log)
    return {
        "hosts": engines.hosts,
        "topology": "default",
        "lab_up_seconds": round(boot, 2),
        "apply_seconds": round(first, 2),
        "apply_report_seconds": round(first_report["seconds"], 2),
        "apply_phase_seconds": {k: round(v, 2) for k, v in first_report["phase_seconds"].items()},
        "noop_apply_seconds": round(second, 2),
        "noop_apply_report_seconds": round(second_report["seconds"], 2),
        "noop_apply_phase_seconds": {
            k: round(v, 2) for k, v in second_report["phase_seconds"].items()
        },
        "noop_apply_hosts_not_ok": changed,
        "operations_per_host": _operations(engines),
        "runs": [r.to_json() for r in runs],
    }
