"""The rolling gate: a run's steps in order (engine/orchestrate.py plans them), each step's hosts
started as the gate grants them and the --rate limit allows, and the run stopped when the gate
says so or past --fail-percent, its untried hosts reported skipped."""

from __future__ import annotations

from collections.abc import Callable

from engine.fleetgate import Gate, LocalGate
from engine.orchestrate import batch_size, group_policies, paced_hosts, plan_steps
from engine.registry import PHASES
from engine.reports import HostReport, HostStatus, Mode, RunOptions, RunReport
from inventory.model import LoadedCluster
from toolkit.pacing import Pacer


def apply_steps(loaded: LoadedCluster, hosts: list[str], options: RunOptions) -> list[list[str]]:
    """The hosts in the steps an apply takes. One step unless --batch or --rate asks for
    rolling; then by each group's policy (engine/orchestrate.py): etcd's members together,
    never two of a one-at-a-time group at once, workers by --batch and --rate."""
    if options.mode is not Mode.apply or not (options.batch or options.rate):
        return [hosts] if hosts else []
    size = batch_size(options.batch, len(hosts)) if options.batch else None
    cluster = loaded.cluster
    groups_of = {name: cluster.hosts[name].groups for name in hosts}
    paced = options.rate.hosts if options.rate else None
    return plan_steps(hosts, groups_of, group_policies(PHASES), size, paced_per_step=paced)


def run_steps(
    loaded: LoadedCluster,
    options: RunOptions,
    hosts: list[str],
    report: RunReport,
    run_hosts: Callable[[list[str]], None],
    gate: Gate | None = None,
) -> None:
    """Run `hosts` step by step with `run_hosts`, which fills their entries in `report`. `gate`
    decides which of a step's hosts start when (a rollout shard's LedgerGate); None: the whole
    step."""
    steps = apply_steps(loaded, hosts, options)
    pacer = Pacer(options.rate) if options.rate else None
    policies = group_policies(PHASES)
    gate = gate if gate is not None else LocalGate()
    for number, step in enumerate(steps, 1):
        pending = list(step)
        # A local apply's gate grants the whole step at once; a rollout shard's grants what the
        # shared budget allows and waits for the rest (engine/fleetgate.py).
        while pending:
            granted = gate.acquire(pending, want=len(pending))
            if not granted:
                break
            pending = [h for h in pending if h not in granted]
            if pacer is not None:
                groups_of = {name: loaded.cluster.hosts[name].groups for name in granted}
                for _ in range(paced_hosts(granted, groups_of, policies)):
                    pacer.acquire()
            run_hosts(granted)
            gate.release({h: report.hosts[h].status.value for h in granted})
        if gate.stopped is not None:
            report.stopped = gate.stopped
            for name in pending + [h for later in steps[number:] for h in later]:
                report.hosts[name] = HostReport(
                    name, HostStatus.skipped, error="not tried: the rollout stopped before it"
                )
            break
        failed = len(report.with_status(HostStatus.failed, HostStatus.unreachable))
        if (
            options.fail_percent is not None
            and number < len(steps)
            and failed * 100 / len(report.hosts) > options.fail_percent
        ):
            report.stopped = (
                f"stopped after step {number} of {len(steps)}: {failed} of "
                f"{len(report.hosts)} hosts failed, over --fail-percent {options.fail_percent:g}"
            )
            for name in (h for later in steps[number:] for h in later):
                report.hosts[name] = HostReport(
                    name, HostStatus.skipped, error="not tried: the run stopped before its step"
                )
            break
    if len(steps) > 1:
        report.notes.append(f"{len(steps)} steps: " + " | ".join(",".join(s) for s in steps))
