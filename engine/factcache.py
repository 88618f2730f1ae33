"""Fewer SSH round trips while preparing: fact commands batched into one, outputs reused.

pyinfra 3.10 runs one command per fact request and keeps no cache, so preparing a role that
writes seven files costs about 30 round trips per host (a stat, a directory check and a
checksum per file, several of them twice). While operations are being prepared nothing runs
on the host, so a fact command gives the same output every time it is asked: this module
remembers each command's output for the prepare stage only, and fetches the facts the shared
operations are known to ask for (`toolkit.operations.prefetch_requests`) in one batched command
per host before the roles' deploys run.

Only the SSH round trip is replaced: pyinfra still builds each fact's command, parses its output
with the fact's own `process` and applies its own error handling. A command that failed is
never remembered (the next request runs it again and reports it as pyinfra always does), the
cache is keyed by the exact command text and connector arguments (sudo, env ...), and it is
off during execution, when operations do change hosts.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from inspect import getcallargs
from typing import Any

from pyinfra.api import FactBase, ShortFactBase, StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput, OutputLine

from toolkit.pyinfra_api import MISSING_COMMAND_MARKER, commands_routed, replayable_command

FactRequest = tuple[type[FactBase], dict[str, Any]]


def _command_text(command: Any) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def _key(command: Any, arguments: dict[str, Any]) -> str:
    return repr((_command_text(command), sorted(arguments.items(), key=lambda item: item[0])))


@dataclass(frozen=True)
class AskedCommand:
    """A command whose output a deploy read while preparing, as the SSH channel carried it."""

    text: str  # what pyinfra's connector sends (sudo, env and shell wrapping included)
    success_codes: tuple[int, ...]
    stdout: tuple[str, ...]


class PrepareCache:
    """Outputs of successful commands on one host during the prepare stage.

    With `recording`, it also keeps every command the host's deploys asked for, in order, with
    the output they were given (engine/fingerprint/ replays them to tell that nothing changed);
    `replayable` turns False when one of them failed or cannot be replayed from its text."""

    def __init__(self, state, host, recording: bool = False):
        self.state = state
        self.host = host
        self.outputs: dict[str, list[str]] = {}
        self.run_for_real = host.run_shell_command
        self.hits = 0
        self.misses = 0
        self.asked: dict[str, AskedCommand] | None = {} if recording else None
        self.replayable = recording

    def _remember(self, key: str, command, arguments, stdout: list[str] | None) -> None:
        if self.asked is None or key in self.asked:
            return
        text = replayable_command(self.state, self.host, command, arguments)
        if stdout is None or text is None:
            self.replayable = False
            return
        codes = tuple(arguments.get("_success_exit_codes") or (0,))
        self.asked[key] = AskedCommand(text, codes, tuple(stdout))

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        if self.state.current_stage is not StateStage.Prepare:
            return self.run_for_real(command, print_output, print_input, **arguments)
        key = _key(command, arguments)
        if key in self.outputs:
            self.hits += 1
            self._remember(key, command, arguments, self.outputs[key])
            return True, CommandOutput([OutputLine("stdout", line) for line in self.outputs[key]])
        self.misses += 1
        status, output = self.run_for_real(command, print_output, print_input, **arguments)
        if status:
            self.outputs[key] = output.stdout_lines
        self._remember(key, command, arguments, output.stdout_lines if status else None)
        return status, output

    def recorded_run(self, command, print_output=False, print_input=False, **arguments):
        """Run for real in any stage, and keep the command with what it printed (a fact read
        after the operations, such as whether a reboot is required, belongs to the record)."""
        status, output = self.run_for_real(command, print_output, print_input, **arguments)
        self._remember(
            _key(command, arguments), command, arguments, output.stdout_lines if status else None
        )
        return status, output

    def prefetch(self, requests: Iterable[FactRequest]) -> None:
        """Run every requested fact's command in one shell command and remember each output.
        The commands are built as pyinfra builds them, so a later request for the same fact
        finds its output here; a command that exits non-zero is left for pyinfra to run."""
        arguments = _default_connector_arguments(self.state, self.host)
        commands: dict[str, Any] = {}
        for cls, kwargs in requests:
            command = _fact_command(cls, kwargs)
            if command is not None:
                commands.setdefault(_key(command, arguments), command)
        if not commands:
            return
        marker = f"gpuinfra-prefetch-{secrets.token_hex(8)}"
        keys = list(commands)
        script = "".join(
            f"(\n{_command_text(commands[key])}\n) </dev/null 2>/dev/null\n"
            f"printf '\\n{marker} {index} %d\\n' $?\n"
            for index, key in enumerate(keys)
        )
        status, output = self.run_for_real(StringCommand(script), **arguments)
        if not status:
            return
        section: list[str] = []
        for line in output.stdout_lines:
            if not line.startswith(marker + " "):
                section.append(line)
                continue
            _, index, code = line.split(" ")
            # The marker starts on a line of its own: drop the newline printed before it.
            if section and section[-1] == "":
                section.pop()
            if code == "0":
                self.outputs[keys[int(index)]] = section
            section = []


def _default_connector_arguments(state, host) -> dict[str, Any]:
    """The connector arguments pyinfra passes to a fact requested outside any operation
    override (no sudo, no env): the ones the shared operations' facts run with."""
    arguments, _ = pop_global_arguments(state, host, {})
    return {key: value for key, value in arguments.items() if key in CONNECTOR_ARGUMENT_KEYS}


def _fact_command(cls: type[FactBase], kwargs: dict[str, Any]) -> Any:
    """The command pyinfra's `_get_fact` runs for this fact (pyinfra/api/facts.py), or None
    for facts it treats differently (short facts, preconditions)."""
    if (
        issubclass(cls, ShortFactBase)
        or cls.check_preconditions is not FactBase.check_preconditions
    ):
        return None
    fact = cls()
    fact_kwargs = getcallargs(fact.command, **kwargs) if kwargs else {}
    fact_kwargs.pop("self", None)
    command = fact.command(**fact_kwargs) if callable(fact.command) else fact.command
    required = fact.requires_command
    required = required(**fact_kwargs) if callable(required) else required
    if required:
        # The same guard pyinfra wraps around a fact whose binary may be missing.
        command = StringCommand(
            "if", "command", "-v", required, ">/dev/null", "2>&1;", "then", "(", command, ");",
            "else", "echo", f"'{MISSING_COMMAND_MARKER}';", "fi",
        )  # fmt: skip
    return command


@contextlib.contextmanager
def prepare_cache(
    state, hosts: Iterable, recording: bool = False
) -> Iterator[dict[Any, PrepareCache]]:
    """Route the hosts' commands through a PrepareCache while the block runs."""
    caches = {host: PrepareCache(state, host, recording) for host in hosts}
    with contextlib.ExitStack() as routes:
        for host, cache in caches.items():
            routes.enter_context(commands_routed(host, cache.run_shell_command))
        yield caches
