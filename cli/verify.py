"""`gpuinfra verify`: the testinfra suites of tests/verify/ against the cluster's hosts."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from cli import connecting
from cli.consoles import DeferredConsole
from cli.errors import UserError, reporting
from cli.exitcodes import ExitCode
from cli.options import ClusterArg, FormatOpt, OutputFormat
from engine.verify import DEFAULT_PROCESSES, available_suites, verify

console = DeferredConsole(highlight=False)


def verify_command(
    cluster: ClusterArg,
    limit: Annotated[
        str | None, typer.Option("--limit", "-l", help="Hosts or groups, comma-separated.")
    ] = None,
    roles: Annotated[
        str | None, typer.Option("--roles", "-r", help="Suites (role names), comma-separated.")
    ] = None,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Write a JUnit XML file: one case per test.")
    ] = None,
    parallel: Annotated[
        int, typer.Option("--parallel", min=1, help="pytest processes, hosts spread over them.")
    ] = DEFAULT_PROCESSES,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """Check that hosts behave as the inventory says (ports, DNS answers, services, sysctls).

    Exit codes: 0 every check passed, 7 a check failed, 4 a host could not be reached,
    2 bad input."""
    connecting()
    from engine.context import load
    from engine.selection import select_hosts

    selected_roles = _split(roles)
    selected_limit = _split(limit)
    with reporting():
        loaded = load(cluster)
        unknown = sorted(set(selected_roles) - set(available_suites()))
        if unknown:
            raise UserError(
                f"--roles: no verification suite for {', '.join(unknown)} "
                f"(suites: {', '.join(available_suites())})"
            )
        cluster_names = set(loaded.cluster.hosts) | {
            group for host in loaded.cluster.hosts.values() for group in host.groups
        }
        unknown_names = sorted(set(selected_limit) - cluster_names)
        if unknown_names:
            raise UserError(
                f"--limit: {', '.join(unknown_names)} matches no host or group of {loaded.source}"
            )
    hosts = select_hosts(loaded, selected_limit)
    started = time.monotonic()
    report = verify(loaded.source, hosts, selected_roles, junit, processes=parallel)
    seconds = time.monotonic() - started
    if report.broken:
        raise UserError(f"the verification suites could not run:\n{report.broken[0]}")
    if output is OutputFormat.json:
        typer.echo(
            json.dumps(
                {
                    "cluster": loaded.cluster.name,
                    "seconds": round(seconds, 2),
                    "counts": dict(report.counts()),
                    "unreachable": report.unreachable_hosts(),
                    "results": [asdict(r) for r in report.results],
                },  # fmt: skip
                indent=2,
            )
        )
    else:
        _print(report, loaded.cluster.name, seconds)
    raise typer.Exit(_exit_code(report))


def _exit_code(report) -> ExitCode:
    if report.unreachable_hosts():
        return ExitCode.UNREACHABLE
    if report.failures():
        return ExitCode.VERIFY_FAILED
    return ExitCode.OK


def _print(report, cluster: str, seconds: float) -> None:
    from rich.table import Table

    table = Table(title=f"verify {cluster}")
    for column in ("role", "host", "passed", "failed", "skipped"):
        table.add_column(column)
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for result in report.results:
        counts = rows.setdefault((result.role, result.host), {})
        outcome = "failed" if result.outcome == "error" else result.outcome
        counts[outcome] = counts.get(outcome, 0) + 1
    for (role, host), counts in sorted(rows.items()):
        failed = counts.get("failed", 0)
        table.add_row(
            role,
            host,
            str(counts.get("passed", 0)),
            f"[red]{failed}[/]" if failed else "0",
            str(counts.get("skipped", 0)),
        )
    console.print(table)
    for result in report.failures():
        console.print(f"[red]{result.outcome}[/] {result.role} {result.host} {result.test}")
        if result.message:
            console.print(f"    {result.message}", markup=False)
    counts = report.counts()
    console.print(
        f"{counts.get('passed', 0)} passed, {len(report.failures())} failed, "
        f"{counts.get('skipped', 0)} skipped in {seconds:.1f}s",
        markup=False,
    )
    for host in report.unreachable_hosts():
        console.print(f"[red]unreachable[/] {host}: every check failed to connect")


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()
