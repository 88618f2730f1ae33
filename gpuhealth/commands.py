"""Running a local command as a small injectable callable, so tests can stand in for the host."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandResult:
    rc: int  # 127 when the program is missing, 124 when it ran past its timeout
    stdout: str
    stderr: str = ""


CommandRunner = Callable[[list[str], float], CommandResult]


def run_command(argv: list[str], timeout: float) -> CommandResult:
    """Run argv with no shell and a deadline; a missing program or a timeout is a result."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return CommandResult(127, "", f"{argv[0]}: not found")
    except subprocess.TimeoutExpired:
        return CommandResult(124, "", f"{argv[0]}: no answer within {timeout:.0f} s")
    return CommandResult(done.returncode, done.stdout, done.stderr)
