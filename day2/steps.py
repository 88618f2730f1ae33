"""Day-2 flows the way kubeadm runs its phases (`phases/workflow`): a flow is an ordered list of
named steps, each with a one-line description; `--help` lists them, `--skip` leaves out the ones
marked safe to leave out, `--only` runs one marked safe to run alone, and a failed step names
itself and the state it left.

Standard library only, and a step's code is named as "module:function" and imported on its
first run: `gpuinfra --help` builds every command's help from these lists without importing the
flows (or the inventory's model) they run.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# A step's code: the function itself, or "module:function" resolved when the step first runs.
Code = str | Callable[..., Any]


def _resolve(code: Code) -> Callable[..., Any]:
    if callable(code):
        return code
    module, _, name = code.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Step:
    """One named step. `run(context)` does it and raises the flow's error when it cannot.
    `left(context)`, when given, is called if `run` failed: it undoes what can safely be
    undone and returns the state the step left, for the operator (empty: nothing to add).
    `done(context)`, when given, is asked first: true when an earlier run of the command
    finished this step already (a flow that resumes), which is then reported, not run again."""

    name: str
    description: str
    run: Code
    left: Code | None = None
    skippable: bool = False  # leaving it out leaves the cluster in a state the flow accepts
    alone: bool = False  # it needs no earlier step: running it by itself is safe
    done: Code | None = None

    @property
    def marks(self) -> str:
        """What `--help` adds after the description: the options that may name this step."""
        marked = (("--skip", self.skippable), ("--only", self.alone))
        options = [option for option, allowed in marked if allowed]
        return f" ({', '.join(options)})" if options else ""


@dataclass(frozen=True)
class StepReport:
    name: str
    status: str  # done, skipped, already done
    seconds: float = 0.0


@dataclass(frozen=True)
class Flow:
    name: str  # the command that runs it: "etcd replace"
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        names = [step.name for step in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: two steps share a name: {names}")

    @property
    def names(self) -> list[str]:
        return [step.name for step in self.steps]

    @property
    def skippable(self) -> list[str]:
        return [step.name for step in self.steps if step.skippable]

    @property
    def alone(self) -> list[str]:
        return [step.name for step in self.steps if step.alone]

    def help(self) -> str:
        """The steps as `--help` lists them, a line each (Typer's rich help keeps the line
        breaks of a paragraph after the first), marked where `--skip` may leave one out or
        `--only` run it alone."""
        width = max(len(name) for name in self.names)
        lines = [f"  {step.name:<{width}}  {step.description}{step.marks}" for step in self.steps]
        return "Steps, in order:\n" + "\n".join(lines)

    def _known(self, name: str) -> None:
        if name not in self.names:
            raise ValueError(f"{self.name}: no step {name!r} (steps: {', '.join(self.names)})")

    def check_skip(self, skip: Iterable[str]) -> frozenset[str]:
        """The steps to leave out; ValueError naming the step for one that is not this flow's
        or not safe to skip."""
        chosen = frozenset(skip)
        for name in sorted(chosen):
            self._known(name)
            if name not in self.skippable:
                allowed = ", ".join(self.skippable) or "none"
                raise ValueError(
                    f"{self.name}: step {name} cannot be skipped (skippable: {allowed})"
                )
        return chosen

    def check_only(self, only: str | None, skip: Iterable[str] = ()) -> str | None:
        """The one step to run alone (None: every step); ValueError naming the step for one
        that is not this flow's or needs the steps before it, or beside a --skip."""
        if only is None:
            return None
        self._known(only)
        if only not in self.alone:
            allowed = ", ".join(self.alone) or "none"
            raise ValueError(f"{self.name}: step {only} cannot run alone (alone: {allowed})")
        if any(True for _ in skip):
            raise ValueError(f"{self.name}: --only runs one step; it takes no --skip")
        return only


def run_flow(
    flow: Flow,
    context: object,
    *,
    error: type[Exception],
    skip: Iterable[str] = (),
    only: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[StepReport]:
    """Run the flow's steps in order on `context`, or with `only` that one step alone. A step
    that raises `error` (or a subclass) stops the flow: its `left` runs, and the same kind of
    error is raised again, saying "step NAME: what failed; the state left". Any other
    exception is a bug and goes up as it is. `progress` hears "[NAME] description" as each
    step starts, is skipped or was done already."""
    skip = list(skip)
    leave_out = flow.check_skip(skip)
    alone = flow.check_only(only, skip)
    reports: list[StepReport] = []
    for step in flow.steps:
        if step.name in leave_out or (alone is not None and step.name != alone):
            if alone is None:
                reports.append(StepReport(step.name, "skipped"))
                if progress:
                    progress(f"[{step.name}] skipped: {step.description}")
            continue
        if step.done is not None and _resolve(step.done)(context):
            reports.append(StepReport(step.name, "already done"))
            if progress:
                progress(f"[{step.name}] already done: {step.description}")
            continue
        if progress:
            progress(f"[{step.name}] {step.description}")
        started = time.monotonic()
        try:
            _resolve(step.run)(context)
        except error as exc:
            state = _resolve(step.left)(context) if step.left is not None else ""
            message = f"step {step.name}: {exc}" + (f"; {state}" if state else "")
            raise type(exc)(message) from None
        reports.append(StepReport(step.name, "done", time.monotonic() - started))
    return reports
