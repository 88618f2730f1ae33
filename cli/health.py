"""`gpuinfra health`: GPU health checks on a node and across the fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.consoles import DeferredConsole
from cli.errors import UserError, reporting, stderr
from cli.exitcodes import ExitCode
from cli.options import ClusterArg, FormatOpt, OutputFormat
from gpuhealth.results import NodeReport, Verdict, worst

if TYPE_CHECKING:
    from gpuhealth.fleet import FleetReport

app = typer.Typer(
    help="GPU health: passive and active checks, fleet sampling, cordoning.", no_args_is_help=True
)
stdout = DeferredConsole(highlight=False, soft_wrap=True)

STYLE = {"ok": "green", "degraded": "yellow", "failed": "bold red", "skipped": "dim"}
NODE_EXIT = {
    Verdict.ok: ExitCode.OK,
    Verdict.skipped: ExitCode.OK,
    Verdict.degraded: ExitCode.DEGRADED,
    Verdict.failed: ExitCode.UNHEALTHY,
}


@app.command("run")
def run(
    expect_count: Annotated[
        int | None, typer.Option("--expect-count", min=1, help="GPUs this node must have.")
    ] = None,
    expect_model: Annotated[
        str | None, typer.Option("--expect-model", help="GPU model, e.g. H100.")
    ] = None,
    expect_driver: Annotated[
        str | None, typer.Option("--expect-driver", help="NVIDIA driver version, exactly.")
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option("--cluster", help="Take expectations and thresholds from this inventory."),
    ] = None,
    expect_file: Annotated[
        Path | None,
        typer.Option("--expect-file", help="Or from the expect.json rendered for the cluster."),
    ] = None,
    host: Annotated[
        str | None, typer.Option("--host", help="This node's inventory name (default: hostname).")
    ] = None,
    passive_only: Annotated[
        bool, typer.Option("--passive-only", help="Skip the burn-in, bandwidth and DCGM tests.")
    ] = False,
    require_active: Annotated[
        bool,
        typer.Option("--require-active", help="Fail when the active tests cannot run (preflight)."),
    ] = False,
    dcgm_level: Annotated[
        int | None, typer.Option("--dcgm-level", min=1, max=4, help="dcgmi diag -r level.")
    ] = None,
    no_dcgm: Annotated[bool, typer.Option("--no-dcgm", help="Do not run dcgmi diag.")] = False,
    output: FormatOpt = OutputFormat.table,
    textfile: Annotated[
        Path | None,
        typer.Option("--textfile", help="Also write a Prometheus textfile here (atomically)."),
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option("--replay", help="Judge a recording from `health record` instead of GPUs."),
    ] = None,
) -> None:
    """Check this node's GPUs. Exit 0 healthy, 5 degraded, 6 unhealthy (drain it)."""
    from gpuhealth.expect import UnknownHost
    from gpuhealth.node import NodeRequest, check_node
    from gpuhealth.report import to_json, to_prometheus, write_atomically

    if cluster is not None and expect_file is not None:
        _bad_input("give --cluster or --expect-file, not both")
    request = NodeRequest(
        host=host,
        expect_count=expect_count,
        expect_model=expect_model,
        expect_driver=expect_driver,
        cluster=cluster,
        expect_file=expect_file,
        active=not passive_only,
        require_active=require_active,
        dcgm=not (no_dcgm or passive_only),
        dcgm_level=dcgm_level,
        replay=replay,
    )
    with reporting():
        try:
            report = check_node(request)
        except UnknownHost as exc:
            raise UserError(str(exc)) from None
        except (OSError, ValueError) as exc:  # unreadable recording or expectations file
            raise UserError(f"cannot read input: {exc}") from None
        if textfile is not None:
            try:
                write_atomically(textfile, to_prometheus(report))
            except OSError as exc:
                raise UserError(f"cannot write {textfile}: {exc}", ExitCode.ERROR) from None
    if output is OutputFormat.json:
        typer.echo(to_json(report))
    else:
        render_node(report)
    raise typer.Exit(NODE_EXIT[report.verdict])


@app.command("record")
def record(
    out: Annotated[Path, typer.Argument(help="JSON file to write.", show_default=False)],
) -> None:
    """Record this node's NVML answers and kernel log, for `run --replay` and for tests."""
    from gpuhealth.node import record_node
    from gpuhealth.nvml import NvmlError

    with reporting():
        try:
            recording = record_node()
        except NvmlError as exc:
            raise UserError(str(exc), ExitCode.ERROR) from None
    out.write_text(json.dumps(recording, indent=2) + "\n")
    stdout.print(f"recorded {len(recording['devices'])} GPUs into {out}", markup=False)


@app.command("fleet")
def fleet(
    cluster: ClusterArg,
    sample: Annotated[
        int | None, typer.Option("--sample", "-k", min=1, help="Check K random GPU workers.")
    ] = None,
    all_hosts: Annotated[bool, typer.Option("--all", help="Check every GPU worker.")] = False,
    cordon: Annotated[
        bool, typer.Option("--cordon", help="Cordon failed nodes, within the budget.")
    ] = False,
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            callback=lambda value: _budget(value),
            help="Most nodes to cordon in this run: 10% or a number.",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="kubeconfig for kubectl cordon.")
    ] = None,
    remote_command: Annotated[
        str | None,
        typer.Option("--remote-command", help="What runs on each node; must print JSON."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed the sample, to repeat a run.")
    ] = None,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """Run the checks over SSH on sampled GPU workers; with --cordon, cordon failed ones."""
    from engine.context import load
    from gpuhealth.fleet import run_fleet
    from roles.gpu_health.config import cluster_config

    if (sample is None) == (not all_hosts):
        _bad_input("give exactly one of --sample K or --all")
    with reporting():
        loaded = load(cluster)
        cfg = cluster_config(loaded)
        if not loaded.cluster.in_group("gpu_worker"):
            raise UserError(f"{cluster}: no host is in the gpu_worker group")
        try:
            report = run_fleet(
                loaded,
                sample=sample,
                remote_command=remote_command or cfg.remote_command,
                budget=budget or cfg.cordon_budget,
                cordon=cordon,
                kubeconfig=kubeconfig,
                parallel=cfg.fleet_parallel,
                timeout=cfg.fleet_timeout_s,
                node_name=cfg.node_name,
                seed=seed,
            )
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if output is OutputFormat.json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        render_fleet(report)
    if report.over_budget:
        stderr.print(
            f"cordon budget of {report.budget} spent: stopped cordoning; "
            f"{len(report.over_budget)} failed node(s) left schedulable: "
            f"{', '.join(report.over_budget)}",
            markup=False,
        )
    if report.count("failed"):
        code = ExitCode.UNHEALTHY
    elif report.count("unreachable") or report.count("error"):
        code = ExitCode.UNREACHABLE
    elif report.count("degraded"):
        code = ExitCode.DEGRADED
    else:
        code = ExitCode.OK
    raise typer.Exit(code)


@app.command("fabric")
def fabric(
    cluster: ClusterArg,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed the pairing, to repeat a run.")
    ] = None,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """RDMA write bandwidth (ib_write_bw) between random pairs of GPU workers, port by port,
    against each port's rate in the fabric settings. Needs gpu_health.fabric_check."""
    from engine.context import load
    from gpuhealth.fabric import run_fabric_check
    from roles.gpu_health.config import GpuHealthConfig
    from toolkit.spec import host_config

    with reporting():
        loaded = load(cluster)
        workers = loaded.cluster.in_group("gpu_worker")
        if len(workers) < 2:
            raise UserError(f"{cluster}: the pair check needs two hosts in gpu_worker")
        if not host_config(loaded, workers[0], "gpu_health", GpuHealthConfig).fabric_check:
            raise UserError(f"{cluster}: gpu_health.fabric_check is off (the pair check is opt-in)")
        checks = run_fabric_check(loaded, workers, seed)
    if output is OutputFormat.json:
        typer.echo(json.dumps([check.to_dict() for check in checks], indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"fabric: {len(checks)} port measurement(s)")
        for column in ("pair", "verdict", "measured", "threshold"):
            table.add_column(column)
        for check in checks:
            table.add_row(check.detail, _verdict(check.verdict), check.measured, check.threshold)
        stdout.print(table)
    raise typer.Exit(NODE_EXIT[worst([check.verdict for check in checks])])


def _budget(value: str | None) -> str | None:
    """The budget's form (a share or a count), checked before anything connects."""
    from roles.gpu_health.config import parse_budget

    if value is not None:
        try:
            parse_budget(value, 1)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--budget") from None
    return value


def _bad_input(message: str) -> None:
    stderr.print(f"error: {message}", markup=False)
    raise typer.Exit(ExitCode.BAD_INPUT)


def _verdict(text: str) -> str:
    return f"[{STYLE.get(text, 'bold red')}]{text}[/]"


def render_node(report: NodeReport) -> None:
    from rich.table import Table

    table = Table(
        title=f"{report.host}: {_verdict(report.verdict.value)} (active tests: {report.backend})"
    )
    for column in ("check", "gpu", "measured", "threshold", "verdict", "detail"):
        table.add_column(column)
    for check in report.checks:
        table.add_row(
            check.check,
            "" if check.gpu is None else str(check.gpu),
            check.measured,
            check.threshold,
            _verdict(check.verdict.value),
            check.detail,
        )
    stdout.print(table)


def render_fleet(report: FleetReport) -> None:
    from rich.table import Table

    table = Table(title=f"{len(report.hosts)} of {report.gpu_workers} GPU workers checked")
    for column in ("host", "status", "why", "cordon"):
        table.add_column(column)
    for outcome in report.hosts:
        cordon = "cordoned" if outcome.cordoned else outcome.cordon_note
        table.add_row(outcome.host, _verdict(outcome.status), outcome.message, cordon)
    stdout.print(table)
    if report.cordon:
        stdout.print(
            f"cordoned {len(report.cordoned)} (budget {report.budget}): "
            f"{', '.join(report.cordoned) or 'none'}",
            markup=False,
        )
