"""`gpuinfra kubernetes ...`: day-2 operations on the kubeadm cluster."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from cli.consoles import DeferredConsole
from cli.errors import UserError, changing, day2_call, load_cluster, reporting
from cli.exitcodes import ExitCode
from cli.options import BreakLockOpt, ClusterArg, FormatOpt, OnlyOpt, OutputFormat, SkipOpt
from cli.steps import chosen_steps, flow_help, progress, ran_alone
from day2.flows import (
    KUBERNETES_CERTS_RENEW,
    KUBERNETES_NODE_ADD,
    KUBERNETES_NODE_REMOVE,
    KUBERNETES_ROTATE_SECRETS_KEY,
    KUBERNETES_UPGRADE,
)
from day2.steps import Flow

app = typer.Typer(
    help="Day-2 operations on the Kubernetes cluster (kubeadm).", no_args_is_help=True
)
certs_app = typer.Typer(help="Control-plane certificates.", no_args_is_help=True)
node_app = typer.Typer(help="Add or remove nodes.", no_args_is_help=True)
app.add_typer(certs_app, name="certs")
app.add_typer(node_app, name="node")
console = DeferredConsole(highlight=False)

YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")]


_load = load_cluster


def _call(work):
    from day2.kubernetes import KubernetesOperationError

    return day2_call(work, KubernetesOperationError)


def _run_flow(flow: Flow, only: str | None, output: OutputFormat, work):
    """Run a flow's command: its result, or None once the one step --only ran is reported."""
    started = time.monotonic()
    result = _call(work)
    if not only:
        return result
    ran_alone(flow, only, output, time.monotonic() - started)
    return None


def _confirm(yes: bool, question: str) -> None:
    if not yes and not typer.confirm(question, default=False, err=True):
        raise typer.Exit(ExitCode.OK)


def _emit_outcome(outcome, output: OutputFormat) -> None:
    """The commands a flow sent, a row each, and its notes; nothing after a step run alone."""
    if outcome is None:
        return
    if output is OutputFormat.json:
        typer.echo(json.dumps(asdict(outcome), indent=2))
        return
    from rich.table import Table

    table = Table(title=outcome.operation)
    for column in ("#", "node", "step", "result"):
        table.add_column(column)
    for number, step in enumerate(outcome.steps, 1):
        table.add_row(str(number), step.host, step.action, "ok" if step.ok else step.detail)
    console.print(table)
    for note in outcome.notes:
        console.print(f"note: {note}", markup=False)


@app.command()
def status(cluster: ClusterArg, output: FormatOpt = OutputFormat.table) -> None:
    """Nodes (Ready, version, taints) and control-plane certificate expiry."""
    from day2.kubernetes import status as cluster_status

    with reporting():
        loaded = _load(cluster)
    result = _call(lambda: cluster_status(loaded))
    if output is OutputFormat.json:
        typer.echo(json.dumps(asdict(result), indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"kubernetes {result.cluster}: {len(result.nodes)} nodes")
        for column in ("node", "ready", "version", "schedulable", "taints"):
            table.add_column(column)
        for node in result.nodes:
            table.add_row(
                node.name,
                "yes" if node.ready else "NO",
                node.version,
                "no" if node.unschedulable else "yes",
                ", ".join(node.taints),
            )
        console.print(table)
        for line in result.certificates:
            console.print(line, markup=False)
    not_ready = [n for n in result.nodes if not n.ready]
    raise typer.Exit(ExitCode.DEGRADED if not_ready else ExitCode.OK)


RENEW_HELP = flow_help(
    KUBERNETES_CERTS_RENEW,
    "check-expiration, then renew every control-plane certificate, one node at a time.",
)


def _control_plane_flow(
    cluster: Path, flow: Flow, question: str, run, *, yes, skip, only, break_lock, output
) -> None:
    """A flow over the control plane: load, choose its steps, take the lock (the pre-apply
    checks first), ask `question` (`{name}`: the cluster's), run `run(loaded, skip=, only=,
    progress=)`, print the commands it sent."""
    with reporting():
        loaded = _load(cluster)
        steps = chosen_steps(flow, skip, only)
    with changing(loaded, break_lock=break_lock) as loaded:
        _confirm(yes, question.format(name=loaded.cluster.name))
        outcome = _run_flow(
            flow,
            only,
            output,
            lambda: run(loaded, skip=steps, only=only, progress=progress),
        )
    _emit_outcome(outcome, output)


@certs_app.command("renew", help=RENEW_HELP)
def certs_renew(
    cluster: ClusterArg,
    yes: YesOpt = False,
    skip: SkipOpt = None,
    only: OnlyOpt = None,
    break_lock: BreakLockOpt = False,
    output: FormatOpt = OutputFormat.table,
):
    from day2.kubernetes import renew_certificates

    _control_plane_flow(
        cluster,
        KUBERNETES_CERTS_RENEW,
        "Renew the certificates of every control-plane node of {name}?",
        renew_certificates,
        yes=yes, skip=skip, only=only, break_lock=break_lock, output=output,
    )  # fmt: skip


ROTATE_HELP = flow_help(
    KUBERNETES_ROTATE_SECRETS_KEY,
    (
        "a new key for the Secrets encrypted at rest, with no API server ever meeting a Secret "
        "it cannot read; a rotation that stopped is finished by running it again."
    ),
)


@app.command("rotate-secrets-key", help=ROTATE_HELP)
def rotate_secrets_key(
    cluster: ClusterArg,
    yes: YesOpt = False,
    skip: SkipOpt = None,
    only: OnlyOpt = None,
    break_lock: BreakLockOpt = False,
    output: FormatOpt = OutputFormat.table,
):
    from day2.encryption import rotate_key

    _control_plane_flow(
        cluster,
        KUBERNETES_ROTATE_SECRETS_KEY,
        "Rotate the key of the Secrets {name} encrypts at rest?",
        rotate_key,
        yes=yes, skip=skip, only=only, break_lock=break_lock, output=output,
    )  # fmt: skip


UPGRADE_HELP = flow_help(
    KUBERNETES_UPGRADE,
    (
        "upgrade apply on the first control-plane node, upgrade node on the others one "
        "by one, then workers drained, upgraded and uncordoned in batches within the budget."
    ),
)


@app.command(help=UPGRADE_HELP)
def upgrade(
    cluster: ClusterArg,
    version: Annotated[str, typer.Argument(help="Target version, at most one minor ahead.")],
    budget: Annotated[
        float, typer.Option("--budget", help="Percent of workers drained at once (at least 1).")
    ] = 20.0,
    yes: YesOpt = False,
    skip: SkipOpt = None,
    only: OnlyOpt = None,
    break_lock: BreakLockOpt = False,
    output: FormatOpt = OutputFormat.table,
) -> None:
    from day2.kubernetes import check_upgrade_step
    from day2.kubernetes import upgrade as run_upgrade

    with reporting():
        loaded = _load(cluster)
        if not 0 < budget <= 100:
            raise UserError(f"--budget {budget:g}: a percentage in (0, 100]")
        steps = chosen_steps(KUBERNETES_UPGRADE, skip, only)
    # A target the flow would refuse is refused before the lock and the hosts are touched.
    _call(lambda: check_upgrade_step(loaded.cluster.versions.kubernetes, version))
    with changing(loaded, break_lock=break_lock) as loaded:
        _confirm(yes, f"Upgrade {loaded.cluster.name} to {version}?")
        outcome = _run_flow(
            KUBERNETES_UPGRADE,
            only,
            output,
            lambda: run_upgrade(loaded, version, budget, progress=progress, skip=steps, only=only),
        )
    _emit_outcome(outcome, output)


NODE_ADD_HELP = flow_help(
    KUBERNETES_NODE_ADD, "Join nodes of the inventory (rate-limited, like every join)."
)


@node_app.command("add", help=NODE_ADD_HELP)
def node_add(
    cluster: ClusterArg,
    nodes: Annotated[list[str], typer.Argument(help="Inventory hosts to join.")],
    skip: SkipOpt = None,
    only: OnlyOpt = None,
    break_lock: BreakLockOpt = False,
    output: FormatOpt = OutputFormat.table,
) -> None:
    from day2.kubernetes import add_nodes
    from engine.reports import HostStatus

    with reporting():
        loaded = _load(cluster)
        steps = chosen_steps(KUBERNETES_NODE_ADD, skip, only)
    with changing(loaded, break_lock=break_lock) as loaded:
        report = _run_flow(
            KUBERNETES_NODE_ADD,
            only,
            output,
            lambda: add_nodes(loaded, nodes, skip=steps, only=only, progress=progress),
        )
    if report is None:
        return
    if output is OutputFormat.json:
        typer.echo(json.dumps(asdict(report), indent=2))
    else:
        for name, host in report.hosts.items():
            console.print(
                f"{name}: {host.status}" + (f" ({host.error})" if host.error else ""), markup=False
            )
    failed = report.with_status(HostStatus.failed, HostStatus.unreachable)
    raise typer.Exit(ExitCode.ERROR if failed else ExitCode.OK)


NODE_REMOVE_HELP = flow_help(
    KUBERNETES_NODE_REMOVE,
    "cordon, drain, delete the Node, then kubeadm reset on it.",
    (
        "A drain that fails leaves the node in the cluster, schedulable again if it was; a "
        "Node an earlier run deleted is only reset."
    ),
)


@node_app.command("remove", help=NODE_REMOVE_HELP)
def node_remove(
    cluster: ClusterArg,
    node: Annotated[str, typer.Argument(help="The node to cordon, drain, delete and reset.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Also delete pods that no controller manages (they are lost)."
        ),
    ] = False,
    yes: YesOpt = False,
    skip: SkipOpt = None,
    only: OnlyOpt = None,
    break_lock: BreakLockOpt = False,
    output: FormatOpt = OutputFormat.table,
) -> None:
    from day2.kubernetes import remove_node

    with reporting():
        loaded = _load(cluster)
        steps = chosen_steps(KUBERNETES_NODE_REMOVE, skip, only)
    with changing(loaded, break_lock=break_lock) as loaded:
        _confirm(yes, f"Remove {node} from {loaded.cluster.name} (drain, delete, kubeadm reset)?")
        outcome = _run_flow(
            KUBERNETES_NODE_REMOVE,
            only,
            output,
            lambda: remove_node(loaded, node, force, skip=steps, only=only, progress=progress),
        )
    _emit_outcome(outcome, output)


class Subset(StrEnum):
    ci = "ci"
    all = "all"


@app.command()
def conformance(
    cluster: ClusterArg,
    subset: Annotated[
        Subset,
        typer.Option(
            "--subset", help="ci: about 50 quick tests (day2/conformance-ci.txt); all: 441."
        ),
    ] = Subset.ci,
    registry: Annotated[
        str,
        typer.Option(
            "--registry",
            help=(
                "Registry holding the suite's images under registry.k8s.io's paths "
                "(e2e-test-images/agnhost, pause, ...); a lab's containerd mirrors the default."
            ),
        ),
    ] = "registry.k8s.io",
    processes: Annotated[
        int, typer.Option("--processes", min=1, max=32, help="e2e.test processes at once.")
    ] = 4,
    e2e_test: Annotated[
        Path | None,
        typer.Option("--e2e-test", help="An e2e.test of the cluster's release (default: go/'s)."),
    ] = None,
    rerun_failed: Annotated[
        bool,
        typer.Option(
            "--rerun-failed",
            help="Only the tests that failed in the subset's last run (results in <subset>-rerun).",
        ),
    ] = False,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """Run the Kubernetes conformance suite (e2e.test) through the operator's kubeconfig: the
    parallel tests first, then the [Serial] ones; JUnit and a summary in the state directory.
    Changes no host (no lock), but creates namespaces in the cluster that the suite deletes."""
    from day2.conformance import ConformanceError, ConformanceInputError, Suite, kubeconfig
    from day2.conformance import run as run_suite

    with reporting():
        loaded = _load(cluster)
        try:
            kubeconfig(loaded)
        except ConformanceInputError as exc:
            raise UserError(str(exc)) from None
        suite = Suite(
            e2e_test=e2e_test or _built_e2e_test(loaded.cluster.versions.kubernetes),
            kubectl=_built_kubectl(loaded.cluster.versions.kubernetes),
            registry=registry,
        )
    result = day2_call(
        lambda: run_suite(
            loaded, suite, subset.value, processes, console.print, rerun_failed=rerun_failed
        ),
        ConformanceError,
        refused=(ConformanceInputError,),
    )
    if output is OutputFormat.json:
        typer.echo(json.dumps({**asdict(result), "ok": result.ok}, indent=2))
    else:
        console.print(result.to_text(), end="", markup=False)
    raise typer.Exit(ExitCode.OK if result.ok else ExitCode.ERROR)


def _built_e2e_test(version: str) -> Path:
    """e2e.test of go/conformance-<minor>, or a UserError saying how to build it."""
    from lab import gobuild
    from lab.errors import LabError

    try:
        suite = gobuild.conformance_module(version)
    except LabError as exc:
        raise UserError(f"{exc}; give one with --e2e-test") from None
    if not suite.built:
        raise UserError(
            f"e2e.test for Kubernetes {version} is not built on this machine: run "
            f"`python -m lab.gobuild --module {suite.name}` (or `make conformance`), "
            "or give one with --e2e-test"
        )
    return suite.binary("e2e.test")


def _built_kubectl(version: str) -> Path | None:
    """The kubectl of the cluster's own build, for the suite's kubectl tests; None: PATH's."""
    from lab import gobuild
    from lab.errors import LabError

    try:
        return gobuild.kubernetes_module(version).binary("kubectl")
    except LabError:
        return None
