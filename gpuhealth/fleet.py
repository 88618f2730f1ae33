"""Run the node checks over SSH on sampled GPU workers and cordon failed ones within a budget."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpuhealth.commands import CommandResult, run_command
from gpuhealth.results import NodeReport, Verdict
from inventory.model import LoadedCluster
from roles.gpu_health import HEALTH_ANNOTATION
from roles.gpu_health.config import parse_budget
from toolkit.remote import SSH_FAILED, TIMED_OUT, RemoteRunner, run_remote

# (argv, timeout seconds) -> result; the default runs the local kubectl binary.
KubectlRunner = Callable[[list[str], float], CommandResult]


@dataclass
class HostOutcome:
    host: str
    status: str  # ok, degraded, failed, skipped (node verdicts), unreachable, error
    report: NodeReport | None = None
    message: str = ""  # why unreachable/error, or a summary of the failed checks
    cordoned: bool = False
    cordon_note: str = ""  # "over budget", kubectl's complaint, ...

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "status": self.status,
            "message": self.message,
            "cordoned": self.cordoned,
            "cordon_note": self.cordon_note,
            "report": self.report.to_dict() if self.report else None,
        }


@dataclass
class FleetReport:
    gpu_workers: int
    budget: int
    cordon: bool
    hosts: list[HostOutcome] = field(default_factory=list)
    # Failed hosts left schedulable because the budget was spent: a person must look at them.
    over_budget: list[str] = field(default_factory=list)

    @property
    def cordoned(self) -> list[str]:
        return [outcome.host for outcome in self.hosts if outcome.cordoned]

    def count(self, status: str) -> int:
        return sum(outcome.status == status for outcome in self.hosts)

    def to_dict(self) -> dict:
        return {
            "gpu_workers": self.gpu_workers,
            "sampled": len(self.hosts),
            "budget": self.budget,
            "cordon": self.cordon,
            "cordoned": self.cordoned,
            "over_budget": self.over_budget,
            "hosts": [outcome.to_dict() for outcome in self.hosts],
        }


def choose_hosts(
    loaded: LoadedCluster, sample: int | None, rng: random.Random
) -> tuple[list[str], int]:
    """K random GPU workers (all of them for None), in inventory order, and the pool size."""
    workers = loaded.cluster.in_group("gpu_worker")
    if sample is None or sample >= len(workers):
        return workers, len(workers)
    chosen = set(rng.sample(workers, sample))
    return [name for name in workers if name in chosen], len(workers)


def check_host(
    loaded: LoadedCluster, host: str, remote_command: str, ssh: RemoteRunner, timeout: float
) -> HostOutcome:
    result = ssh(loaded, host, remote_command, timeout=timeout)
    try:
        report = NodeReport.from_dict(json.loads(result.stdout))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        said = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}, no report"])[-1]
        if result.exit_code in (SSH_FAILED, TIMED_OUT):
            return HostOutcome(host, "unreachable", message=said)
        return HostOutcome(host, "error", message=f"no report (exit {result.exit_code}): {said}")
    report.host = host
    failed = sorted({check.check for check in report.checks if check.verdict is Verdict.failed})
    message = f"failed: {', '.join(failed)}" if failed else ""
    return HostOutcome(host, report.verdict.value, report=report, message=message)


def kube_node_name(loaded: LoadedCluster, host: str, style: str) -> str:
    return loaded.cluster.fqdn(host) if style == "fqdn" else host


def kubectl_argv(kubeconfig: Path | None, *args: str) -> list[str]:
    argv = ["kubectl"]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    return argv + list(args)


def run_fleet(
    loaded: LoadedCluster,
    *,
    sample: int | None,
    remote_command: str,
    budget: str,
    cordon: bool,
    kubeconfig: Path | None = None,
    parallel: int = 32,
    timeout: float = 1200,
    node_name: str = "host",
    seed: int | None = None,
    ssh: RemoteRunner = run_remote,
    kubectl: KubectlRunner = run_command,
) -> FleetReport:
    hosts, workers = choose_hosts(loaded, sample, random.Random(seed))
    report = FleetReport(gpu_workers=workers, budget=parse_budget(budget, workers), cordon=cordon)
    if hosts:
        with ThreadPoolExecutor(max_workers=min(parallel, len(hosts))) as pool:
            report.hosts = list(
                pool.map(lambda h: check_host(loaded, h, remote_command, ssh, timeout), hosts)
            )
    if cordon:
        cordon_failed(loaded, report, kubeconfig, node_name, kubectl)
    return report


def cordon_failed(
    loaded: LoadedCluster,
    report: FleetReport,
    kubeconfig: Path | None,
    node_name: str,
    kubectl: KubectlRunner,
) -> None:
    """Cordon failed hosts, worst first, and stop at the budget: a mass failure is more likely a
    bad check or a shared cause than many broken GPUs, and must not empty the fleet."""
    failed = [outcome for outcome in report.hosts if outcome.status == Verdict.failed.value]

    def failed_checks(outcome: HostOutcome) -> int:
        checks = outcome.report.checks if outcome.report else []
        return sum(check.verdict is Verdict.failed for check in checks)

    failed.sort(key=failed_checks, reverse=True)
    cordoned = 0
    for outcome in failed:
        if cordoned >= report.budget:
            outcome.cordon_note = f"not cordoned: budget of {report.budget} spent"
            report.over_budget.append(outcome.host)
            continue
        node = kube_node_name(loaded, outcome.host, node_name)
        result = kubectl(kubectl_argv(kubeconfig, "cordon", node), 60)
        if result.rc != 0:
            said = (result.stderr.strip().splitlines() or [f"exit {result.rc}"])[-1]
            outcome.cordon_note = f"kubectl cordon failed: {said}"
            continue
        outcome.cordoned = True
        cordoned += 1
        # Say why on the node itself, for whoever finds it cordoned.
        note = f"failed {outcome.message.removeprefix('failed: ')} (gpuinfra health fleet)"
        annotate = kubectl(
            kubectl_argv(kubeconfig, "annotate", "--overwrite", "node", node,
                         f"{HEALTH_ANNOTATION}={note}"),
            60,
        )  # fmt: skip
        if annotate.rc != 0:
            outcome.cordon_note = "cordoned, but the annotation could not be written"
