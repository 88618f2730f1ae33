"""Contract tests for toolkit/pyinfra_api.py, the one seam to pyinfra's private API.

Each test exercises one thing gpuinfra relies on against the installed pyinfra, offline (a
State with one host that is never connected). A pyinfra upgrade that changes any of them fails
here, naming the function, before it can fail a run on real hosts.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pyinfra.api.facts
import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api import arguments as pyinfra_arguments
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_host, ctx_state
from pyinfra.operations import server

from toolkit import pyinfra_api

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def offline():
    """A State in its prepare stage with one host, never connected."""
    inventory = Inventory((["node-1"], {}))
    state = State(inventory, Config())
    state.set_stage(StateStage.Prepare)
    host = inventory.get_host("node-1")
    with ctx_state.use(state), ctx_host.use(host):
        yield state, host


def test_the_installed_pyinfra_is_the_one_the_seam_was_written_for():
    assert pyinfra_api.installed_version() == pyinfra_api.PYINFRA_VERSION
    pin = re.search(r'"pyinfra==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert pin and pin[1] == pyinfra_api.PYINFRA_VERSION


def test_missing_command_marker_is_what_pyinfra_guards_facts_with():
    source = inspect.getsource(pyinfra.api.facts)
    assert pyinfra_api.MISSING_COMMAND_MARKER
    assert "stdout_lines == [_MISSING_COMMAND_MARKER]" in source  # how pyinfra parses it
    assert '"command",' in source and '"-v",' in source  # the guard factcache copies


def test_an_operation_is_keyed_by_its_hash_and_knows_its_planned_change(offline):
    state, host = offline
    changes = server.shell(name="Change", commands=["true"])
    assert list(state.ops[host]) == [pyinfra_api.op_hash(changes)]
    assert pyinfra_api.will_change(changes) is True
    assert pyinfra_api.found_unchanged(changes) is False
    quiet = OperationMeta("h", False)
    assert pyinfra_api.found_unchanged(quiet) and not pyinfra_api.will_change(quiet)
    assert not pyinfra_api.found_unchanged(OperationMeta("h", None))  # unknown is not unchanged


def test_stderr_tail_reads_an_executed_operation_output():
    meta = OperationMeta("h", True)
    assert pyinfra_api.stderr_tail(meta) is None
    output = CommandOutput(
        [OutputLine("stdout", "fine"), OutputLine("stderr", "sshd: Bad argument")]
    )
    meta.set_complete(False, ["cmd"], output)
    assert pyinfra_api.stderr_tail(meta) == ["sshd: Bad argument"]


def test_conditions_are_answered_with_the_planned_change_and_the_patch_is_undone():
    original = OperationMeta.did_change
    changing, unchanged = OperationMeta("a", True), OperationMeta("b", False)
    assert pyinfra_api.conditions_hold(changing.did_change)
    assert not pyinfra_api.conditions_hold(unchanged.did_change)
    assert not pyinfra_api.conditions_hold([changing.did_change, lambda: unchanged.did_change()])
    assert pyinfra_api.conditions_hold(lambda: changing.did_change() or unchanged.did_change())
    assert OperationMeta.did_change is original
    with pytest.raises(RuntimeError):  # pyinfra's own answer before execution
        changing.did_change()


def test_guarded_commands_yield_nothing_while_skipped(offline):
    state, host = offline
    meta = server.shell(name="Change", commands=["echo one"])
    skipping = {"on": True}
    pyinfra_api.guard_commands(state, [host], lambda h, m, a: skipping["on"])
    generate = state.ops[host][pyinfra_api.op_hash(meta)].command_generator
    assert list(generate()) == []
    skipping["on"] = False
    assert [str(c) for c in generate()] == ["echo one"]


def test_the_phase_position_keeps_operations_at_the_same_position_apart():
    """pyinfra 3.10 hashes API-mode operations by position plus the host's loop position."""

    def first_hash(position: int) -> str:
        inventory = Inventory((["node-1"], {}))
        state = State(inventory, Config())
        state.set_stage(StateStage.Prepare)
        host = inventory.get_host("node-1")
        with (
            ctx_state.use(state),
            ctx_host.use(host),
            pyinfra_api.phase_position(host, position),
        ):
            meta = server.shell(name="Same", commands=["true"])
        assert host.loop_position == []
        return pyinfra_api.op_hash(meta)

    assert first_hash(0) != first_hash(1)
    assert first_hash(3) == first_hash(3)


def test_a_later_phase_never_runs_before_an_earlier_phase_of_another_host():
    """A worker with fewer operations than the control plane reached the workers' join before
    `kubeadm init` ran on cp-1: pyinfra orders by each host's operation count first."""
    inventory = Inventory((["cp-1", "cpu-1"], {}))
    state = State(inventory, Config())
    state.set_stage(StateStage.Prepare)
    cp, worker = inventory.get_host("cp-1"), inventory.get_host("cpu-1")
    names: dict[str, str] = {}

    def add(host, phase: int, name: str) -> None:
        with ctx_state.use(state), ctx_host.use(host), pyinfra_api.phase_position(host, phase):
            names[pyinfra_api.op_hash(server.shell(name=name, commands=["true"]))] = name

    cp_steps, worker_steps = ["base", "kernel", "runtime", "kubeadm init"], ["base", "join"]
    for name in cp_steps:
        add(cp, 0, name)
    add(worker, 0, "base")  # the same position in the same phase: one operation for both
    add(worker, 1, "join")

    def run_order() -> list[str]:
        return [names[op] for op in state.get_op_order()]

    # pyinfra alone: the worker's second operation runs beside cp-1's second (the control).
    assert run_order().index("join") < run_order().index("kubeadm init")
    pyinfra_api.phases_in_order(state)
    order = run_order()
    assert order.index("join") > order.index("kubeadm init")
    for steps in (cp_steps, worker_steps):  # each host's own sequence is kept
        assert [name for name in order if name in steps] == steps


def test_commands_are_routed_and_then_the_class_method_is_back(offline):
    _, host = offline
    seen = []
    with pyinfra_api.commands_routed(host, lambda command, **kw: seen.append(command)):
        host.run_shell_command("uptime")
    assert seen == ["uptime"]
    assert "run_shell_command" not in vars(host)


def test_inner_is_the_undecorated_body_of_an_operation(offline):
    commands = list(pyinfra_api.inner(server.shell)(commands=["a", "b"]))
    assert [str(c) for c in commands] == ["a", "b"]


def test_global_arguments_are_memoised_and_unchanged():
    before = pyinfra_arguments.all_global_arguments()
    pyinfra_api.memoise_global_arguments()
    assert pyinfra_arguments.all_global_arguments() == before
    assert hasattr(pyinfra_arguments.all_global_arguments, "cache_info")


def test_no_other_module_uses_pyinfra_private_names():
    """Everything private to pyinfra goes through the seam: no `._name` of a pyinfra object and
    no import of an underscored pyinfra name anywhere else."""
    private_import = re.compile(r"from pyinfra[.\w]* import .*\b_[a-z]")
    private_attr = re.compile(r"\._(maybe_is_change|hash|combined_output|inner|MISSING)\b")
    offenders = []
    for path in [*REPO.glob("roles/**/*.py"), *REPO.glob("cli/**/*.py"), *REPO.glob("day2/*.py")]:
        if path.name == "pyinfra_api.py":
            continue
        text = path.read_text()
        if private_import.search(text) or private_attr.search(text) or "loop_position" in text:
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_a_replayable_command_is_the_text_the_ssh_connector_sends(offline, monkeypatch):
    """What the drift fast path records: the exact string pyinfra's SSH connector hands to
    exec_command, caught here at the paramiko client it would use."""
    from pyinfra.connectors.ssh import SSHConnector

    state, host = offline
    sent = []

    class Channel:
        def recv_exit_status(self):
            return 0

    class Stream(list):
        channel = Channel()

        def close(self):
            pass

    class Client:
        def exec_command(self, command, get_pty=False):
            sent.append(command)
            return Stream(), Stream(), Stream()

    connector = SSHConnector(state, host)
    connector.client = Client()
    arguments = {"_sudo": True, "_sudo_user": "etcd", "_env": {"A": "1"}, "_timeout": 5}
    connector.run_shell_command(pyinfra_api.StringCommand("echo", "'a b'"), **arguments)
    assert sent == [pyinfra_api.replayable_command(state, host, "echo 'a b'", arguments)]
    assert "sudo" in sent[0] and "A=1" in sent[0]
    for unreplayable in ({"_get_pty": True}, {"_stdin": "x"}, {"_sudo_password": "p"}):
        assert pyinfra_api.replayable_command(state, host, "true", unreplayable) is None


def test_each_host_keeps_its_own_operation_name():
    """Two hosts add different operations at the same position (so with the same hash): pyinfra
    merges their names into one set; the kept names tell them apart."""
    operation_module = importlib.import_module("pyinfra.api.operation")  # `operation` is shadowed

    inventory = Inventory((["node-1", "node-2"], {}))
    state = State(inventory, Config())
    state.set_stage(StateStage.Prepare)
    kept = {}
    pyinfra_api.keep_operation_names(lambda host, h, name: kept.update({host: (h, name)}))

    def add(host):  # both hosts add at this same line: the same hash
        with ctx_state.use(state), ctx_host.use(host):
            return operation_module.solve_operation_consistency({f"Op of {host.name}"}, state, host)

    hashes = {add(host)[1] for host in inventory}
    assert len(hashes) == 1
    op_hash = hashes.pop()
    assert kept == {"node-1": (op_hash, "Op of node-1"), "node-2": (op_hash, "Op of node-2")}


def test_a_command_over_a_dead_transport_fails_its_operation_not_the_run(offline):
    """paramiko raises EOFError when the transport died before a command's channel opened;
    pyinfra 3.10's op runner catches OSError and SSHException there, not EOFError, and the
    run ended for every host ("aborted", no report: test_faults.py's partition of lb-1,
    2026-11-29). Through pyinfra's own runner: the guarded operation fails on this host,
    told as lost. The control: unguarded, the EOFError still escapes pyinfra."""
    from pyinfra.api.operations import run_host_op

    state, host = offline
    meta = server.shell(name="Change", commands=["echo one"])
    op = pyinfra_api.op_hash(meta)

    def dead(*args, **kwargs):
        raise EOFError()

    host.connector.run_shell_command = dead
    host.connected = True
    state.set_stage(StateStage.Execute)
    with pytest.raises(EOFError):  # the control: pyinfra alone lets it through
        run_host_op(state, host, op)
    told: list[str] = []
    pyinfra_api.guard_commands(
        state, [host], lambda h, m, a: False, lambda h, m, exc: told.append(type(exc).__name__)
    )
    assert run_host_op(state, host, op) is False
    assert told == ["EOFError"]
