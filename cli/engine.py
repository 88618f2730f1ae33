"""`gpuinfra plan`, `apply` and `drift`: converge hosts or check them, with reports for CI."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table

from cli.errors import UserError, reporting
from cli.exitcodes import ExitCode
from cli.options import ClusterArg, FormatOpt, OutputFormat
from inventory.loader import load
from roles.junit import write_junit

console = Console(highlight=False)

# For tests that act at a given point of a run (tests/integration/test_faults.py kills the
# controller when the N-th host x operation has finished): each step appends "done total".
PROGRESS_FILE_ENV = "GPUINFRA_PROGRESS_FILE"

LimitOpt = Annotated[
    str | None, typer.Option("--limit", help="Host or group names, comma-separated.")
]
RolesOpt = Annotated[str | None, typer.Option("--roles", help="Role names, comma-separated.")]
ParallelOpt = Annotated[
    int | None, typer.Option("--parallel", min=1, help="Hosts worked on at once [default: all].")
]
ShardOpt = Annotated[
    str | None,
    typer.Option(
        "--shard",
        help="I/N: only shard I (0-based) of N, hosts split by name order; one CI runner each.",
    ),
]


def plan(
    cluster: ClusterArg,
    limit: LimitOpt = None,
    roles: RolesOpt = None,
    diff: Annotated[bool, typer.Option("--diff", help="Show unified diffs of files.")] = False,
    parallel: ParallelOpt = None,
    shard: ShardOpt = None,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """Show what apply would change, per host and operation; changes nothing."""
    from roles.runner import Mode

    report = _run(cluster, Mode.plan, limit, roles, parallel, output, shard=shard)
    _emit(report, output, show_diff=diff)
    raise typer.Exit(_exit_code(report))


def apply(
    cluster: ClusterArg,
    limit: LimitOpt = None,
    roles: RolesOpt = None,
    batch: Annotated[
        str | None, typer.Option("--batch", help="Rolling batches: N hosts or P% at a time.")
    ] = None,
    fail_percent: Annotated[
        float | None,
        typer.Option("--fail-percent", min=0, max=100, help="Stop batches past this failure %."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Apply without asking.")] = False,
    parallel: ParallelOpt = None,
    report_path: Annotated[
        Path | None, typer.Option("--report", help="Write the run report (JSON) here.")
    ] = None,
    output: FormatOpt = OutputFormat.table,
    reboot: Annotated[
        bool,
        typer.Option(
            "--reboot", help="Reboot hosts that need it, --batch at a time [default: one]."
        ),
    ] = False,
) -> None:
    """Converge hosts to the inventory, with per-phase and per-host timings."""
    from roles.runner import Mode

    with reporting():
        if batch is not None and not (batch.rstrip("%").replace(".", "", 1).isdigit()):
            raise UserError(f"--batch: expected N or P% (got {batch!r})")
    if not yes and not typer.confirm("Apply changes to the hosts?", default=False, err=True):
        raise typer.Exit(ExitCode.OK)
    report = _run(cluster, Mode.apply, limit, roles, parallel, output, batch, fail_percent)
    if reboot:
        _reboot(cluster, report, batch)
    if report_path:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(asdict(report), indent=2))
    _emit(report, output, show_diff=False)
    raise typer.Exit(_exit_code(report))


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
    output: FormatOpt = OutputFormat.table,
) -> None:
    """The CI check: exit 0 clean, 3 drift, 4 unreachable, 1 error; never changes a host."""
    from roles.runner import Mode

    report = _run(cluster, Mode.drift, limit, roles, parallel, output, shard=shard)
    if report_path:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(asdict(report), indent=2))
    if junit:
        write_junit(report, junit)
    _emit(report, output, show_diff=True)
    raise typer.Exit(_exit_code(report))


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def parse_shard(value: str | None) -> tuple[int, int] | None:
    """ "I/N" with 0 <= I < N; a clear error otherwise."""
    if value is None:
        return None
    index, _, count = value.partition("/")
    if not (index.strip().isdigit() and count.strip().isdigit()):
        raise UserError(f"--shard: expected I/N, e.g. 0/4 (got {value!r})")
    shard = int(index), int(count)
    if not 0 <= shard[0] < shard[1]:
        raise UserError(f"--shard: index must be in 0..N-1 (got {value!r})")
    return shard


def _run(cluster, mode, limit, roles, parallel, output, batch=None, fail_percent=None, shard=None):
    from roles.phases import PHASES
    from roles.runner import RunOptions, run, select_hosts

    with reporting():
        loaded = load(cluster)
        known_roles = {phase.role for phase in PHASES}
        unknown = set(_split(roles)) - known_roles
        if unknown:
            raise UserError(
                f"--roles: unknown role {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(known_roles))})"
            )
        if limit and not select_hosts(loaded, _split(limit)):
            raise UserError(f"--limit: {limit} matches no host or group of {loaded.source}")
        shard_index = parse_shard(shard)
    options = RunOptions(
        mode=mode,
        limit=_split(limit),
        roles=_split(roles),
        parallel=parallel,
        batch=batch,
        fail_percent=fail_percent,
        shard=shard_index,
    )
    if os.environ.get(PROGRESS_FILE_ENV):
        return run(loaded, options, _progress_to_file(Path(os.environ[PROGRESS_FILE_ENV])))
    if output is OutputFormat.json or not console.is_terminal:
        return run(loaded, options)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(f"{mode} {loaded.cluster.name}", total=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=f"{what} (host x operation)", completed=done, total=total)

        return run(loaded, options, progress)


def _progress_to_file(path: Path):
    """A progress callback appending "done total" lines to `path`, flushed at each step."""
    stream = path.open("a", buffering=1)

    def progress(what: str, done: int, total: int) -> None:
        stream.write(f"{done} {total}\n")

    return progress


def _reboot(cluster, report, batch: str | None) -> None:
    """Reboot the hosts the run left "reboot required", in rolling batches; the report says
    which came back (flag cleared) and which did not (failed)."""
    from roles.reboot import Rebooter
    from roles.runner import HostStatus, batches

    waiting = [
        host.name
        for host in report.hosts.values()
        if host.reboot_required and host.status in (HostStatus.ok, HostStatus.changed)
    ]
    if not waiting:
        return
    with reporting():
        loaded = load(cluster)
    for outcome in Rebooter(loaded).rolling(batches(waiting, batch or "1")):
        entry = report.hosts[outcome.host]
        if outcome.ok:
            entry.reboot_required = False
            report.notes.append(f"{outcome.host}: rebooted, back in {outcome.seconds:.1f} s")
        else:
            entry.status = HostStatus.failed
            entry.error = f"reboot: {outcome.error}"
    left = [name for name in waiting if report.hosts[name].reboot_required]
    if left:
        report.notes.append(f"still waiting for a reboot: {', '.join(left)}")


def _exit_code(report) -> ExitCode:
    from roles.runner import HostStatus

    if report.with_status(HostStatus.failed):
        return ExitCode.ERROR
    if report.with_status(HostStatus.unreachable):
        return ExitCode.UNREACHABLE
    if report.with_status(HostStatus.drift):
        return ExitCode.DRIFT
    return ExitCode.OK


def _emit(report, output: OutputFormat, show_diff: bool) -> None:
    if output is OutputFormat.json:
        typer.echo(json.dumps(asdict(report), indent=2))
        return
    table = Table(title=f"{report.mode} {report.cluster}: {len(report.hosts)} hosts")
    for column in ("host", "status", "changes", "seconds", "reboot", "detail"):
        table.add_column(column)
    for host in report.hosts.values():
        detail = host.error or ", ".join(op.name for op in host.changes[:3])
        if len(host.changes) > 3:
            detail += f", ... ({len(host.changes) - 3} more)"
        table.add_row(
            host.name,
            host.status.value,
            str(len(host.changes)),
            f"{host.seconds:.1f}",
            "required" if host.reboot_required else "",
            detail,
        )
    console.print(table)
    if show_diff:
        for host in report.hosts.values():
            for op in host.changes:
                if op.diff:
                    console.print(f"[bold]{host.name}[/]: {op.name}")
                    console.print(
                        Syntax(op.diff, "diff", background_color="default", word_wrap=True)
                    )
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in report.phase_seconds.items())
    console.print(f"total {report.seconds:.1f}s ({timings})", markup=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
    if report.stopped:
        console.print(f"[red]{report.stopped}[/]")
