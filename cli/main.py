"""The gpuinfra application: composes the command groups and holds the global options."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping
from typing import Annotated, Any

import typer
import typer.main
from typer._click.core import Command
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
from typer.core import TyperGroup
from typer.exceptions import Abort

from cli.errors import stderr
from cli.exitcodes import ExitCode
from cli.options import state

# Every command, in the order `--help` lists them: `module:function` for a command, `module` for
# a group (the module's `app`). A module is imported, and its commands built, only when one of
# them runs or help lists them: `inventory validate` pays for no other command's options and
# imports (about 40 ms of CPU).
COMMANDS: dict[str, str] = {
    "render": "cli.render:render",
    "plan": "cli.engine:plan",
    "apply": "cli.engine:apply",
    "drift": "cli.engine:drift",
    "verify": "cli.verify:verify_command",
    "inventory": "cli.inventory",
    "lab": "cli.lab",
    "health": "cli.health",
    "etcd": "cli.etcd",
    "kubernetes": "cli.kubernetes",
}


class LazyCommands(Mapping[str, Command]):
    """The top-level commands by name, each built by typer on first lookup, exactly as
    `add_typer` and `command` would build it (with Typer's default markup and exception
    settings, which `app` keeps)."""

    def __init__(self, targets: Mapping[str, str]) -> None:
        self._targets = targets
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            module_name, _, function = self._targets[name].partition(":")
            module = importlib.import_module(module_name)
            if function:
                holder = typer.Typer()
                holder.command(name)(getattr(module, function))
                self._built[name] = typer.main.get_group(holder).commands[name]
            else:
                group = typer.main.get_group(module.app)
                group.name = name
                self._built[name] = group
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)


class OneLineErrors(TyperGroup):
    """Every bad option value, unknown option or missing argument is one line on stderr with
    exit code 2 (click's usage block is noise in CI logs), and an unexpected error is one line
    with exit code 1; `--verbose` shows the traceback. Its commands are built on first use."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        if self.commands:  # registered on `app` itself: they would be lost, say where they go
            raise RuntimeError(f"list {', '.join(self.commands)} in cli.main.COMMANDS instead")
        self.commands = LazyCommands(COMMANDS)  # type: ignore[assignment]

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
