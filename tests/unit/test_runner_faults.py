"""A host lost mid-run fails its own operation with the reason; it does not end the run."""

from __future__ import annotations

from types import SimpleNamespace

from roles.runner import _Recorder, _skip_unchanged_while_clean


class Host:
    def __init__(self, name: str):
        self.name = name


def op(generate, maybe_change=True):
    return SimpleNamespace(
        operation_meta=SimpleNamespace(_maybe_is_change=maybe_change), command_generator=generate
    )


def test_a_fact_lost_with_the_connection_fails_only_that_operation():
    def lost():
        yield "echo before"
        raise EOFError()

    host = Host("cpu-1")
    state = SimpleNamespace(ops={host: {"op1": op(lost)}})
    recorder = _Recorder(None, 0)
    _skip_unchanged_while_clean(state, [host], recorder)
    commands = [str(c) for c in state.ops[host]["op1"].command_generator()]
    assert commands == ["echo before", "false"]
    assert recorder.op_errors == {("cpu-1", "op1"): "connection lost (EOFError)"}


def test_other_errors_still_propagate():
    """A bug in an operation is not a lost host: it stays loud."""

    def broken():
        raise KeyError("x")
        yield  # pragma: no cover

    host = Host("cpu-1")
    state = SimpleNamespace(ops={host: {"op1": op(broken)}})
    _skip_unchanged_while_clean(state, [host], _Recorder(None, 0))
    try:
        list(state.ops[host]["op1"].command_generator())
    except KeyError:
        pass
    else:
        raise AssertionError("a KeyError was swallowed")
