"""A host lost mid-run fails its own operation with the reason; it does not end the run."""

from __future__ import annotations

from types import SimpleNamespace

from engine.runner import CONNECTION_LOST, _error_detail, _Recorder, _skip_unchanged_while_clean


class Host:
    def __init__(self, name: str):
        self.name = name


def op(generate, maybe_change=True, op_hash="op1"):
    meta = SimpleNamespace(_maybe_is_change=maybe_change, _hash=op_hash)
    return SimpleNamespace(operation_meta=meta, command_generator=generate, global_arguments={})


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


class Transport:
    def __init__(self, active: bool):
        self.active = active

    def is_active(self) -> bool:
        return self.active


def connected_host(name: str, active: bool) -> Host:
    host = Host(name)
    client = SimpleNamespace(get_transport=lambda: Transport(active))
    host.connector = SimpleNamespace(client=client)
    return host


def test_a_command_failing_on_a_dead_connection_is_reported_as_a_lost_connection():
    state = SimpleNamespace(get_results_for_host=lambda host: SimpleNamespace(error=None))
    recorder = _Recorder(None, 0)
    recorder.operation_host_error(state, connected_host("cpu-1", False), "op1")
    recorder.operation_host_error(state, connected_host("lb-1", True), "op1")
    assert recorder.op_errors[("cpu-1", "op1")].startswith("connection lost")
    assert recorder.op_errors[("lb-1", "op1")] == "failed"


def test_a_lost_connection_is_the_reported_cause_not_the_commands_last_words():
    said = ["Created symlink /etc/systemd/system/x.service."]
    output = SimpleNamespace(stderr_lines=said, output_lines=said)
    meta = SimpleNamespace(_combined_output=output)
    lost = _error_detail("Kernel | Enable units", CONNECTION_LOST, meta, None)
    assert lost == f"Kernel | Enable units: {CONNECTION_LOST}"
    failed = _error_detail("Kernel | Enable units", "failed", meta, None)
    assert failed == "Kernel | Enable units: Created symlink /etc/systemd/system/x.service."


def test_a_full_disk_far_above_the_last_lines_is_named_first():
    lines = [
        "dpkg: error processing archive prometheus.deb (--unpack):",
        " unable to create '/etc/prometheus/x.dpkg-new': No space left on device",
        "Errors were encountered while processing:",
        " prometheus.deb",
        "needrestart is being skipped",
        "E: Sub-process /usr/bin/dpkg returned an error code (1)",
    ]
    output = SimpleNamespace(stderr_lines=lines, output_lines=lines)
    meta = SimpleNamespace(_combined_output=output)
    detail = _error_detail("Prometheus | Install", "failed", meta, None)
    assert detail.startswith(
        "Prometheus | Install: unable to create '/etc/prometheus/x.dpkg-new': No space left"
    )
    assert detail.endswith("E: Sub-process /usr/bin/dpkg returned an error code (1)")


def test_a_full_disk_told_on_stdout_is_named_too():
    """apt relays dpkg's "No space left on device" on stdout, its own "E:" line on stderr."""
    stdout = ["unable to create '/etc/prometheus/x.dpkg-new': No space left on device"]
    stderr = ["E: Sub-process /usr/bin/dpkg returned an error code (1)"]
    output = SimpleNamespace(stderr_lines=stderr, output_lines=stdout + stderr)
    detail = _error_detail("Install", "failed", SimpleNamespace(_combined_output=output), None)
    assert detail == f"Install: {stdout[0]} | {stderr[0]}"
