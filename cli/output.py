"""What plan, apply and drift print and write: the table or JSON, the JSON report, the JUnit
file and the exit code. No typer here: the drift that answers before the command line is
imported (cli/launch.py) writes its answer with these same functions."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from cli.consoles import DeferredConsole
from cli.exitcodes import ExitCode

if TYPE_CHECKING:
    from engine.reports import RunReport

console = DeferredConsole(highlight=False)


def exit_code(report: RunReport) -> ExitCode:
    from engine.reports import HostStatus

    if report.with_status(HostStatus.failed):
        return ExitCode.ERROR
    if report.with_status(HostStatus.unreachable):
        return ExitCode.UNREACHABLE
    if report.with_status(HostStatus.drift):
        return ExitCode.DRIFT
    return ExitCode.OK


def write_reports(report: RunReport, report_path: Path | None, junit: Path | None) -> None:
    """The JSON report (--report) and the JUnit file (--junit), each when asked for."""
    from toolkit.statefiles import write_atomically

    if report_path:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(report_path, json.dumps(asdict(report), indent=2).encode())
    if junit:
        from engine.junit import write_junit

        write_junit(report, junit)


def emit(report: RunReport, output: str, show_diff: bool) -> None:
    """The report on stdout: JSON for `--format json`, else a table, diffs and notes."""
    if output == "json":
        sys.stdout.write(json.dumps(asdict(report), indent=2) + "\n")
        sys.stdout.flush()
        return
    from rich.table import Table

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
                    from rich.syntax import Syntax  # pygments: only when there is a diff

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
