"""Turn known failures into one clear line on stderr and a deliberate exit code."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import typer

from cli.consoles import DeferredConsole
from cli.exitcodes import ExitCode
from cli.options import state
from engine.applylock import LockHeld
from inventory.errors import InventoryInvalid
from toolkit.statefiles import StateMissing

stderr = DeferredConsole(stderr=True, highlight=False, soft_wrap=True)


class UserError(Exception):
    """A problem the operator can fix, reported without a traceback."""

    def __init__(self, message: str, code: ExitCode = ExitCode.BAD_INPUT):
        super().__init__(message)
        self.code = code


@contextmanager
def reporting() -> Iterator[None]:
    try:
        yield
    except InventoryInvalid as exc:
        for error in exc.errors:
            stderr.print(f"error: {error}", markup=False)
        _traceback_if_verbose()
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    except UserError as exc:
        stderr.print(f"error: {exc}", markup=False)
        _traceback_if_verbose()
        raise typer.Exit(exc.code) from None
    except StateMissing as exc:
        stderr.print(f"error: {exc}", markup=False)
        _traceback_if_verbose()
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    except LockHeld as exc:
        stderr.print(f"error: {exc}", markup=False)
        _traceback_if_verbose()
        raise typer.Exit(ExitCode.LOCKED) from None


def _traceback_if_verbose() -> None:
    if state.verbose:
        import traceback

        traceback.print_exc(file=sys.stderr)


def load_cluster(cluster):
    """The cluster with its role settings. Imported here: `gpuinfra --help` must not pay for
    the inventory's model."""
    from engine.context import load

    return load(cluster)


def day2_call(work, error: type[Exception], refused: tuple[type[Exception], ...] = ()):
    """Run a day-2 flow: its own `error` is one line with exit code 1; bad input, and a
    `refused` error (the flow stopped before it changed anything), one line with exit 2."""
    with reporting():
        try:
            return work()
        except refused as exc:
            raise UserError(str(exc)) from None
        except error as exc:
            raise UserError(str(exc), ExitCode.ERROR) from None


@contextmanager
def changing(loaded, *, break_lock: bool = False) -> Iterator:
    """For a command that changes hosts (apply, the day-2 flows): hold the cluster's apply lock
    and run every role's pre-apply check before anything is asked or changed, as `apply` does
    (engine/clusterstate.py `applying`). Another holder: one line, exit 8; a refused check
    (the etcd members trust another CA, say): one line, exit 2. Yields the cluster allowed to
    create missing state."""
    from engine.clusterstate import applying
    from toolkit.spec import PreApplyRefused

    with ExitStack() as held:
        with reporting():
            try:
                loaded, lock = held.enter_context(applying(loaded, break_lock=break_lock))
            except PreApplyRefused as exc:
                raise UserError(str(exc)) from None
        for note in lock.notes:
            stderr.print(f"note: {note}", markup=False)
        if lock.taken_over:
            stderr.print(
                f"note: took over the cluster lock left by {lock.taken_over.describe()}",
                markup=False,
            )
        yield loaded
