"""The gpuinfra application: composes the command groups and holds the global options."""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated

import typer

from cli import engine, etcd, health, inventory, kubernetes, lab, render, verify
from cli.options import state

app = typer.Typer(
    name="gpuinfra",
    help="Provision GPU Kubernetes clusters with pyinfra, and check them in CI.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(inventory.app, name="inventory")
app.add_typer(lab.app, name="lab")
app.add_typer(health.app, name="health")
app.add_typer(etcd.app, name="etcd")
app.add_typer(kubernetes.app, name="kubernetes")
app.command("render")(render.render)
app.command("plan")(engine.plan)
app.command("apply")(engine.apply)
app.command("drift")(engine.drift)
app.command("verify")(verify.verify_command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuinfra {version('gpuinfra')}")
        raise typer.Exit()


@app.callback()
def main(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show tracebacks and debug output.")
    ] = False,
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    state.verbose = verbose
