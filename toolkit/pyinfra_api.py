"""The one seam to pyinfra's private API: everything gpuinfra relies on beyond pyinfra's public
operations, facts and State calls is here, pinned to the version it was written against.

tests/unit/test_pyinfra_contract.py checks each of these against the installed pyinfra and
fails loudly, naming the function, when an upgrade changes what it relies on.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import version
from typing import Any

from paramiko import SSHException
from pyinfra.api import FunctionCommand, StringCommand
from pyinfra.api import arguments as _arguments
from pyinfra.api import facts as _facts
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.operation import OperationMeta

PYINFRA_VERSION = "3.10.0"  # pyproject.toml pins the same; the contract tests check both

# The marker pyinfra prints when a fact's required binary is missing (pyinfra/api/facts.py):
# a batched fact command must print the same for pyinfra's own parsing to apply.
MISSING_COMMAND_MARKER: str = _facts._MISSING_COMMAND_MARKER


def installed_version() -> str:
    return version("pyinfra")


def op_hash(meta: OperationMeta) -> str:
    """The hash that keys an operation in `state.ops[host]` (OperationMeta has no public one)."""
    return meta._hash


def will_change(meta: OperationMeta) -> bool:
    """What prepare decided: the operation has commands to run. Read without re-running its
    body (OperationMeta.will_change would generate the commands when it is unset)."""
    return bool(meta._maybe_is_change)


def found_unchanged(meta: OperationMeta) -> bool:
    """Prepare decided the operation has nothing to do (False, not merely unknown)."""
    return meta._maybe_is_change is False


def stderr_tail(meta: OperationMeta, lines: int = 3) -> list[str] | None:
    """The last stderr lines of an executed operation's commands; None when it has none."""
    output = meta._combined_output
    if output is None:
        return None
    return [line.strip() for line in output.stderr_lines[-lines:] if line.strip()]


def output_lines(meta: OperationMeta) -> list[str]:
    """Every line an executed operation's commands wrote, stdout and stderr in order."""
    output = meta._combined_output
    return [line.strip() for line in output.output_lines] if output is not None else []


def ssh_transport(host) -> Any:
    """The paramiko transport of a host's pyinfra SSH connection, or None (not connected)."""
    client = getattr(host.connector, "client", None)
    return client.get_transport() if client is not None else None


def conditions_hold(conditions: Any) -> bool:
    """Evaluate an operation's `_if` conditions before execution: pyinfra only checks them while
    executing, so a plan would count every handler ("restart if the file changed") as a change.
    Each `did_change()` a condition asks about is answered with what that operation will do."""
    if not conditions:
        return True
    conditions = conditions if isinstance(conditions, list) else [conditions]
    original = OperationMeta.did_change

    def planned(meta: OperationMeta) -> bool:
        return original(meta) if meta.is_complete() else will_change(meta)

    def holds(condition: Callable[[], bool]) -> bool:
        # `_if=meta.did_change` is a method bound before the patch below: answer it directly.
        if getattr(condition, "__func__", None) is original:
            return planned(condition.__self__)
        return bool(condition())

    OperationMeta.did_change = planned  # type: ignore[method-assign]
    try:
        return all(holds(condition) for condition in conditions)
    finally:
        OperationMeta.did_change = original  # type: ignore[method-assign]


def guard_commands(
    state,
    hosts: Iterable,
    skip: Callable[[Any, OperationMeta, dict], bool],
    lost: Callable[[Any, OperationMeta, BaseException], None] | None = None,
) -> None:
    """Wrap each operation's command generator: while `skip(host, meta, global arguments)` is
    true when it runs,
    the operation yields nothing. (pyinfra 3.10 runs every operation's body again while
    executing; the generator is the only place to intercept that.) A body that asks for a fact
    over a broken connection (EOFError, OSError, SSHException) would end the whole run for
    every host; with `lost`, it is told and that host's operation fails alone."""

    def guarded(host, meta, arguments, generate):
        def commands():
            if skip(host, meta, arguments):
                return
            try:
                for command in generate():
                    yield command if lost is None else _losing(command, host, meta, lost)
            except (EOFError, OSError, SSHException) as exc:
                if lost is None:
                    raise
                lost(host, meta, exc)
                yield StringCommand("false")  # fails the operation on this host only

        return commands

    for host in hosts:
        for op_data in state.ops[host].values():
            op_data.command_generator = guarded(
                host, op_data.operation_meta, op_data.global_arguments, op_data.command_generator
            )


def _losing(command, host, meta, lost: Callable[[Any, OperationMeta, BaseException], None]):
    """A command whose run over a broken connection fails its operation on this host only.
    pyinfra 3.10 fails the operation on OSError or SSHException while a command runs, but
    paramiko raises EOFError when the transport died before the channel opened, and pyinfra
    then ended the whole run for every host ("aborted", no report: test_faults.py's partition
    of lb-1 mid-apply, 2026-11-29). Here it is told, and raised again as the OSError pyinfra
    expects. A FunctionCommand's errors pyinfra catches whole; anything else is passed on as
    it is (pyinfra refuses it, or a test reads it)."""
    if not isinstance(command, PyinfraCommand) or isinstance(command, FunctionCommand):
        return command
    run = command.execute

    def execute(*args, **kwargs):
        try:
            return run(*args, **kwargs)
        except EOFError as exc:
            lost(host, meta, exc)
            raise OSError(f"connection lost ({type(exc).__name__})") from exc

    command.execute = execute
    return command


@contextlib.contextmanager
def phase_position(host, index: int) -> Iterator[None]:
    """pyinfra 3.10 hashes API-mode operations by their position on the host plus the host's
    loop position; a phase index there keeps two roles' operations at the same position apart."""
    host.loop_position = [index]
    try:
        yield
    finally:
        host.loop_position = []


def phases_in_order(state) -> None:
    """Run every host's operations of one phase before any host's operations of the next.

    pyinfra 3.10 (api/state.py get_op_order) orders operations in levels of each host's own
    chain: a host's n-th operation runs with every other host's n-th. Hosts with fewer
    operations therefore reach a later role early: a CPU worker (no nvidia role) asked the
    first control-plane node for a join token before `kubeadm init` had run there. The phase
    index is the second element of each operation's order (phase_position); sorting by it first
    keeps each host's own sequence, since both numbers only grow along it."""
    levels = state.get_op_order

    def by_phase(op_hash: str) -> tuple[int, ...]:
        order = state.op_meta[op_hash].op_order
        return (order[1], order[0], *order[2:]) if len(order) > 1 else (-1, *order)

    def ordered() -> list[str]:
        return sorted(levels(), key=by_phase)  # levels() still refuses a cycle

    state.get_op_order = ordered


@contextlib.contextmanager
def commands_routed(host, run_shell_command: Callable) -> Iterator[None]:
    """Send the host's shell commands through `run_shell_command` while the block runs (an
    instance attribute shadows Host.run_shell_command, which facts and operations call)."""
    host.run_shell_command = run_shell_command
    try:
        yield
    finally:
        del host.run_shell_command


def inner(operation: Callable) -> Callable:
    """The undecorated body of an @operation, to yield its commands from another operation."""
    return operation._inner


_memoised = False


def memoise_global_arguments() -> None:
    """pyinfra 3.10 calls typing.get_type_hints on its fixed global-arguments TypedDict for every
    operation and fact request: a third of a no-op drift's CPU time. The answer never changes."""
    global _memoised
    if not _memoised:
        _arguments.all_global_arguments = functools.cache(_arguments.all_global_arguments)
        _memoised = True


_name_keeper: list[Callable[[str, str, str], None]] = []


def keep_operation_names(keep: Callable[[str, str, str], None]) -> None:
    """Have `keep(host name, operation hash, name)` called for every operation a host's deploy
    adds from now on: pyinfra 3.10 (api/operation.py) gets the hash from
    solve_operation_consistency and merges the names of every host's operation with that hash
    into one set, which cannot say which name was whose."""
    module = importlib.import_module("pyinfra.api.operation")
    if not _name_keeper:
        solve = module.solve_operation_consistency

        def solve_and_keep(names, state, host):
            op_order, op_hash = solve(names, state, host)
            _name_keeper[0](host.name, op_hash, sorted(names)[0])
            return op_order, op_hash

        module.solve_operation_consistency = solve_and_keep
        _name_keeper.append(keep)
    _name_keeper[0] = keep


# Arguments that make a command's run more than its text on the SSH channel: a pseudo-terminal,
# input written to it, or a password handed to sudo/su through an askpass helper.
_NOT_REPLAYABLE = ("_get_pty", "_stdin", "_sudo_password", "_su_password")


def replayable_command(state, host, command: Any, arguments: dict[str, Any]) -> str | None:
    """The exact text pyinfra's SSH connector sends for `command` with these connector
    arguments (pyinfra/connectors/ssh.py: run_shell_command builds it with
    make_unix_command_for_host after taking out pty, timeout, stdin and the success codes), or
    None when the command's run depends on more than that text and cannot be replayed."""
    if any(arguments.get(name) for name in _NOT_REPLAYABLE):
        return None
    from pyinfra.connectors.util import make_unix_command_for_host

    rest = {
        key: value
        for key, value in arguments.items()
        if key not in ("_get_pty", "_timeout", "_stdin", "_success_exit_codes")
    }
    if not isinstance(command, StringCommand):
        command = StringCommand(command)
    return make_unix_command_for_host(state, host, command, **rest).get_raw_value()
