"""What every day-2 flow command shares (`day2/steps.py`): its help ending with the flow's
steps, `--skip` and `--only` checked before the lock, each step on stderr as it starts, and
the line a step run alone ends with."""

from __future__ import annotations

import json

import typer

from cli.consoles import DeferredConsole
from cli.errors import UserError, stderr
from cli.options import OutputFormat
from day2.steps import Flow

console = DeferredConsole(highlight=False)


# Also what keeps the steps' indentation: Typer dedents the paragraphs after the first as one
# text (inspect.cleandoc), which strips it when the steps come right after the first.
STEPS_NOTE = (
    "A failed step names itself and the state it left. --skip leaves out a step marked so "
    "below, --only runs one by itself."
)


def flow_help(flow: Flow, summary: str, *paragraphs: str) -> str:
    """A flow command's help: its summary and paragraphs, then its steps as the flow lists
    them."""
    return "\n\n".join((summary, *paragraphs, STEPS_NOTE, flow.help()))


def chosen_steps(flow: Flow, skip: list[str] | None, only: str | None) -> list[str]:
    """--skip's steps, or refused (exit 2, before the lock and the hosts) with --only's step,
    unless the flow may skip them or run that one alone."""
    try:
        flow.check_only(only, skip or ())
        return sorted(flow.check_skip(skip or ()))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def progress(line: str) -> None:
    """Each step of a day-2 flow as it starts, on stderr (stdout keeps the result)."""
    stderr.print(line, markup=False)


def ran_alone(flow: Flow, only: str, output: OutputFormat, seconds: float) -> None:
    """What a command ends with when it ran one step by itself (exit 0): the flow's result
    needs every step, so the step and its time stand in for it."""
    if output is OutputFormat.json:
        done = {"flow": flow.name, "step": only, "status": "done", "seconds": seconds}
        typer.echo(json.dumps(done, indent=2))
    else:
        console.print(f"{flow.name}: step {only} done in {seconds:.1f}s", markup=False)
