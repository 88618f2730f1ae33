"""The gpuinfra application: composes the command groups and holds the global options."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
from typer.core import TyperGroup
from typer.exceptions import Abort

from cli import engine, etcd, health, inventory, kubernetes, lab, render, verify
from cli.errors import stderr
from cli.exitcodes import ExitCode
from cli.options import state


class OneLineErrors(TyperGroup):
    """Every bad option value, unknown option or missing argument is one line on stderr with
    exit code 2 (click's usage block is noise in CI logs), and an unexpected error is one line
    with exit code 1; `--verbose` shows the traceback."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):  # type: ignore[override]
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)
        except NoArgsIsHelpError as exc:
            exc.show()  # the help text, as `no_args_is_help` promises
            sys.exit(exc.exit_code)
        except ClickException as exc:
            hint = ""
            if isinstance(exc, UsageError) and exc.ctx is not None:
                hint = f" (see '{exc.ctx.command_path} --help')"
            stderr.print(f"error: {exc.format_message()}{hint}", markup=False)
            sys.exit(exc.exit_code)
        except Abort:
            stderr.print("aborted", markup=False)
            sys.exit(ExitCode.ERROR)
        except Exception as exc:
            if state.verbose:
                raise
            stderr.print(
                f"error: unexpected {type(exc).__name__}: {exc} (--verbose shows the traceback)",
                markup=False,
            )
            sys.exit(ExitCode.ERROR)
        sys.exit(result if isinstance(result, int) else ExitCode.OK)


app = typer.Typer(
    name="gpuinfra",
    cls=OneLineErrors,
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
        from importlib.metadata import version

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
