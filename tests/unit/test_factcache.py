"""The prepare-stage fact cache: a batched prefetch gives each fact command exactly the output it
gives on its own, failures are left to pyinfra, and nothing is reused outside the prepare stage.
The host is a stand-in that runs commands with the local shell (as pyinfra's ssh connector
runs them with the remote one)."""

from __future__ import annotations

import subprocess

import pytest
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.facts.files import Directory, File, Sha1File

from engine import factcache
from engine.factcache import PrepareCache, _fact_command


class Printf(FactBase):
    def command(self, text: str) -> str:
        return f"printf {text!r}"


class Fails(FactBase):
    def command(self) -> str:
        return "echo partial; exit 3"


class LocalHost:
    def __init__(self):
        self.commands: list[str] = []

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        self.commands.append(text)
        result = subprocess.run(["sh", "-c", text], capture_output=True, text=True)
        lines = [OutputLine("stdout", line) for line in result.stdout.splitlines()]
        lines += [OutputLine("stderr", line) for line in result.stderr.splitlines()]
        return result.returncode == 0, CommandOutput(lines)


class FakeState:
    current_stage = StateStage.Prepare


@pytest.fixture
def cache(monkeypatch):
    monkeypatch.setattr(factcache, "_default_connector_arguments", lambda state, host: {})
    return PrepareCache(FakeState(), LocalHost())


def requests(tmp_path):
    (tmp_path / "f").write_text("one\ntwo\n")
    # Read once now: with relatime the first read after a write moves atime, which File shows.
    (tmp_path / "f").read_text()
    return [
        (File, {"path": str(tmp_path / "f")}),
        (Sha1File, {"path": str(tmp_path / "f")}),
        (File, {"path": str(tmp_path / "missing")}),
        (Directory, {"path": str(tmp_path)}),
        (Printf, {"text": "no newline\\nat the end"}),
        (Printf, {"text": "blank lines\\n\\n\\n"}),
        (Printf, {"text": ""}),
        (Fails, {}),
    ]


def test_prefetched_outputs_equal_the_commands_run_one_by_one(cache, tmp_path):
    wanted = requests(tmp_path)
    cache.prefetch(wanted)
    assert len(cache.host.commands) == 1
    for cls, kwargs in wanted:
        command = _fact_command(cls, kwargs)
        alone_status, alone = LocalHost().run_shell_command(command)
        status, output = cache.run_shell_command(command)
        assert status == alone_status
        assert output.stdout_lines == alone.stdout_lines, cls.__name__
    # Only the failing command ran again (and is never remembered).
    assert cache.host.commands[1:] == [str(_fact_command(Fails, {}))]
    cache.run_shell_command(_fact_command(Fails, {}))
    assert len(cache.host.commands) == 3


def test_a_command_asked_twice_runs_once_while_preparing(cache):
    assert cache.run_shell_command("echo hi")[1].stdout_lines == ["hi"]
    assert cache.run_shell_command("echo hi")[1].stdout_lines == ["hi"]
    assert cache.host.commands == ["echo hi"]
    # Other connector arguments (sudo, env ...) are another command.
    cache.run_shell_command("echo hi", _sudo=True)
    assert len(cache.host.commands) == 2


def test_nothing_is_reused_while_executing(cache):
    cache.run_shell_command("echo hi")
    cache.state.current_stage = StateStage.Execute
    cache.run_shell_command("echo hi")
    cache.run_shell_command("echo hi")
    assert cache.host.commands == ["echo hi"] * 3


def test_the_cache_uninstalls_itself():
    host = LocalHost()
    with factcache.prepare_cache(FakeState(), [host]):
        assert host.run_shell_command.__self__.__class__ is PrepareCache
    assert host.run_shell_command.__self__ is host
