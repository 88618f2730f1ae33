"""`gpuinfra plan`, `apply` and `drift`: converge hosts or check them, with reports for CI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from cli import connecting
from cli.errors import UserError, changing, reporting, stderr
from cli.exitcodes import ExitCode
from cli.options import (
    BatchOpt,
    BreakLockOpt,
    ClusterArg,
    ConnectTimeoutOpt,
    FailPercentOpt,
    FormatOpt,
    LimitOpt,
    OutputFormat,
    ParallelOpt,
    RateOpt,
    RolesOpt,
    ShardOpt,
    parse_shard,
)
from cli.output import console, emit, exit_code, write_reports
from toolkit.ssh import CONNECT_TIMEOUT_S

# Seconds to wait for each host's SSH connection (pyinfra's connect and banner timeouts); the
# probes drift sends before it parses its options (engine/fingerprint/ send_early) use it too.
DEFAULT_CONNECT_TIMEOUT = CONNECT_TIMEOUT_S

# For tests that act at a given point of a run (tests/integration/test_faults.py kills the
# controller when the N-th host x operation has finished): each step appends "done total".
PROGRESS_FILE_ENV = "GPUINFRA_PROGRESS_FILE"


def plan(
    cluster: ClusterArg,
    limit: LimitOpt = None,
    roles: RolesOpt = None,
    diff: Annotated[bool, typer.Option("--diff", help="Show unified diffs of files.")] = False,
    parallel: ParallelOpt = None,
    shard: ShardOpt = None,
    connect_timeout: ConnectTimeoutOpt = DEFAULT_CONNECT_TIMEOUT,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """Show what apply would change, per host and operation; changes nothing."""
    connecting()
    from engine.context import load
    from engine.reports import Mode

    with reporting():
        loaded = load(cluster)
    options = _options(loaded, Mode.plan, limit, roles, parallel, connect_timeout, shard=shard)
    loaded = _read_only(loaded, roles)
    report = _run(loaded, options, output)
    emit(report, output, show_diff=diff)
    raise typer.Exit(exit_code(report))


def apply(
    cluster: ClusterArg,
    limit: LimitOpt = None,
    roles: RolesOpt = None,
    batch: BatchOpt = None,
    rate: RateOpt = None,
    fail_percent: FailPercentOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Apply without asking.")] = False,
    parallel: ParallelOpt = None,
    connect_timeout: ConnectTimeoutOpt = DEFAULT_CONNECT_TIMEOUT,
    report_path: Annotated[
        Path | None, typer.Option("--report", help="Write the run report (JSON) here.")
    ] = None,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="JUnit XML: one test case per host and role.")
    ] = None,
    output: FormatOpt = OutputFormat.table,
    reboot: Annotated[
        bool,
        typer.Option(
            "--reboot", help="Reboot hosts that need it, --batch at a time [default: one]."
        ),
    ] = False,
    break_lock: BreakLockOpt = False,
    job: Annotated[
        bool,
        typer.Option(
            "--job",
            help="Roll the workers out from a Kubernetes Job in the cluster "
            "(rollout_job.enabled; batch-policy groups only; docs/fleet-jobs.md).",
        ),
    ] = False,
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards", min=1, help="With --job: the number of pods [default: inventory]."
        ),
    ] = None,
    job_shard: Annotated[bool, typer.Option("--job-shard", hidden=True)] = False,
) -> None:
    """Converge hosts to the inventory, with per-phase and per-host timings.

    Holds the cluster's lock while it runs (exit 8 when another apply has it, or while a
    rollout Job runs), and refuses (exit 2) when the etcd members trust another CA than the
    controller's .state/."""
    connecting()
    if job_shard:  # a rollout Job's pod (engine/rolloutshard.py): its settings beside CLUSTER
        from engine.rolloutshard import exit_on_sigterm, main

        exit_on_sigterm()
        raise typer.Exit(main(Path(cluster)))
    from engine.context import load
    from engine.reports import Mode
    from toolkit.pacing import Rate

    with reporting():
        loaded = load(cluster)
        options = _options(
            loaded,
            Mode.apply,
            limit,
            roles,
            parallel,
            connect_timeout,
            batch,
            fail_percent,
            rate=Rate.parse(rate) if rate is not None else None,
        )
        if shards is not None and not job:
            raise UserError("--shards: only with --job")
        rollout = _rollout_job(loaded, options, shards, reboot) if job else None
    # Lock and CA check before asking: whoever confirms knows no other apply is running.
    with changing(loaded, break_lock=break_lock) as loaded:
        if not yes and not typer.confirm("Apply changes to the hosts?", default=False, err=True):
            raise typer.Exit(ExitCode.OK)
        if rollout is not None:
            report = _run_rollout(rollout, loaded)
        else:
            report = _run(loaded, options, output, record=True)
        if reboot:
            _reboot(cluster, report, batch)
    write_reports(report, report_path, junit)
    emit(report, output, show_diff=False)
    raise typer.Exit(exit_code(report))


def drift(
    cluster: ClusterArg,
    report_path: Annotated[
        Path | None, typer.Option("--report", help="JSON report of drifted hosts and diffs.")
    ] = None,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="JUnit XML: one test case per host and role.")
    ] = None,
    limit: LimitOpt = None,
    roles: RolesOpt = None,
    parallel: ParallelOpt = None,
    shard: ShardOpt = None,
    connect_timeout: ConnectTimeoutOpt = DEFAULT_CONNECT_TIMEOUT,
    output: FormatOpt = OutputFormat.table,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Check every host operation by operation, without the one-round-trip "
            "comparison with its converged record.",
        ),
    ] = False,
    job: Annotated[
        bool,
        typer.Option(
            "--job",
            help="Probe the hosts from a Kubernetes Job in the cluster (drift_job.enabled; "
            "docs/fleet-jobs.md); the hosts it cannot settle are checked from here.",
        ),
    ] = False,
    shards: Annotated[
        int | None,
        typer.Option("--shards", min=1, help="With --job: the number of pods [default: by size]."),
    ] = None,
    job_cluster: Annotated[
        Path | None,
        typer.Option(
            "--job-cluster",
            help="With --job: run the Job on this inventory's cluster (its drift_job nodes) "
            "instead of the checked one's; the checked hosts admit it by drift_job.sources.",
        ),
    ] = None,
) -> None:
    """The CI check: exit 0 clean, 3 drift, 4 unreachable, 1 error; never changes a host.

    A host that the last apply found converged is checked in one round trip: the commands its
    deploys asked then are run again and their outputs compared. Any other host, and any host
    whose outputs differ, is checked operation by operation (what `--exact` does for all)."""
    from engine.context import load
    from engine.reports import Mode

    with reporting():
        loaded = load(cluster)
    options = _options(loaded, Mode.drift, limit, roles, parallel, connect_timeout, shard=shard)
    if shards is not None and not job:
        with reporting():
            raise UserError("--shards: only with --job")
    if job_cluster is not None and not job:
        with reporting():
            raise UserError("--job-cluster: only with --job")
    if job:
        there = None
        if job_cluster is not None:
            with reporting():
                there = load(job_cluster)
        report = _drift_job(loaded, options, output, shards, exact, there)
    elif exact:
        loaded = _read_only(loaded, roles)
        connecting()
        report = _run(loaded, options, output)
    else:
        report = _drift(loaded, options, output)
    write_reports(report, report_path, junit)
    emit(report, output, show_diff=True)
    raise typer.Exit(exit_code(report))


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def _read_only(loaded, roles: str | None):
    """The cluster for plan and drift --exact: its state must be there (never created), and a
    note when an apply is running on it."""
    _note_running_apply(loaded)
    from engine.clusterstate import require_state  # the PKI: cryptography, only when checking

    with reporting():
        return require_state(loaded, _split(roles))


def _note_running_apply(loaded) -> None:
    from engine.applylock import current_holder

    holder = current_holder(loaded.state_dir)
    if holder is not None:
        stderr.print(f"note: an apply is running on this cluster: {holder.describe()}")


def _options(
    loaded,
    mode,
    limit,
    roles,
    parallel,
    connect_timeout,
    batch=None,
    fail_percent=None,
    shard=None,
    rate=None,
):
    """RunOptions from the command line, with the checks that need the inventory (exit 2)."""
    from engine.registry import PHASES
    from engine.reports import RunOptions

    with reporting():
        known_roles = {phase.role for phase in PHASES}
        unknown = set(_split(roles)) - known_roles
        if unknown:
            raise UserError(
                f"--roles: unknown role {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(known_roles))})"
            )
        unknown_names = sorted(set(_split(limit)) - _host_and_group_names(loaded))
        if unknown_names:
            raise UserError(
                f"--limit: {', '.join(unknown_names)} matches no host or group of {loaded.source}"
            )
    return RunOptions(
        mode=mode,
        limit=_split(limit),
        roles=_split(roles),
        parallel=parallel,
        batch=batch,
        rate=rate,
        fail_percent=fail_percent,
        connect_timeout=connect_timeout,
        shard=parse_shard(shard),
    )


def _host_and_group_names(loaded) -> set[str]:
    cluster = loaded.cluster
    return set(cluster.hosts) | {g for host in cluster.hosts.values() for g in host.groups}


def _drift(loaded, options, output):
    """The fast path, then the exact check of the hosts it left (engine/drift.py)."""
    from engine.drift import drift

    _note_running_apply(loaded)

    def run_exact(loaded, options):
        connecting()
        return _run(loaded, options, output)

    with reporting():
        return drift(loaded, options, run_exact)


def _drift_job(loaded, options, output, shards: int | None, exact: bool, job_cluster=None):
    """drift --job (day2/fleetjob.py): the Job's shards, then the exact check of the rest."""
    from day2.fleetjob import FleetJobBusy, JobRun, fleet_drift
    from day2.jobs import JobError, JobRefused

    if exact:
        with reporting():
            raise UserError("--job and --exact: --exact checks every host from here")
    _note_running_apply(loaded)

    def run_exact(loaded, options):
        connecting()
        return _run(loaded, options, output)

    with reporting():
        try:
            run = JobRun(loaded, options, run_exact, count=shards, job_cluster=job_cluster)
            return fleet_drift(run)
        except JobRefused as exc:
            raise UserError(str(exc)) from None
        except FleetJobBusy as exc:
            raise UserError(str(exc), ExitCode.LOCKED) from None
        except JobError as exc:
            raise UserError(str(exc), ExitCode.ERROR) from None


def _rollout_job(loaded, options, shards: int | None, reboot: bool):
    """apply --job's refusals (exit 2), before the lock: day2/rolloutjob.py `check_options`."""
    from day2.jobs import JobRefused
    from day2.rolloutjob import Rollout, check_options

    if reboot or options.batch or options.rate:
        raise UserError(
            "--job: no --reboot, --batch or --rate (the budget is rollout_job.budget, the join "
            "rate kubernetes.join_rate)"
        )
    rollout = Rollout(loaded, options, count=shards)
    try:
        check_options(rollout)
    except JobRefused as exc:
        raise UserError(str(exc)) from None
    return rollout


def _run_rollout(rollout, loaded):
    """The Job's flow, holding the apply lock all along (its ledger locks the cluster inside)."""
    from day2.jobs import JobBusy, JobError, JobRefused
    from day2.rolloutjob import fleet_rollout

    rollout.loaded = loaded
    with reporting():
        try:
            return fleet_rollout(rollout)
        except JobRefused as exc:
            raise UserError(str(exc)) from None
        except JobBusy as exc:
            raise UserError(str(exc), ExitCode.LOCKED) from None
        except JobError as exc:
            raise UserError(str(exc), ExitCode.ERROR) from None


def _run(loaded, options, output, record: bool = False):
    from engine.runner import run

    if os.environ.get(PROGRESS_FILE_ENV):
        return run(
            loaded, options, _progress_to_file(Path(os.environ[PROGRESS_FILE_ENV])), record=record
        )
    if output is OutputFormat.json or not console.is_terminal:
        return run(loaded, options, record=record)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console.get(), transient=True) as bar:
        task = bar.add_task(f"{options.mode} {loaded.cluster.name}", total=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=f"{what} (host x operation)", completed=done, total=total)

        return run(loaded, options, progress, record=record)


def _progress_to_file(path: Path):
    """A progress callback appending "done total" lines to `path`, flushed at each step."""
    stream = path.open("a", buffering=1)

    def progress(what: str, done: int, total: int) -> None:
        stream.write(f"{done} {total}\n")

    return progress


def _reboot(cluster, report, batch: str | None) -> None:
    """Reboot the hosts the run left "reboot required" (engine/reboot.py `reboot_waiting`)."""
    from engine.reboot import reboot_waiting

    with reporting():
        reboot_waiting(cluster, report, batch)
