"""toolkit/remote.py, the one remote-command primitive.

No sshd runs on this machine (nor may a unit test start one), so two honest halves: the real
`ssh` binary against a loopback address where nothing listens (ssh's own failure, exit 255),
and a stand-in `ssh` program on PATH that records the command line it was given and runs the
remote command with sh here (exit status, stdout, stderr, stdin, the deadline)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from engine.context import load
from tests.unit.loopback import loopback_cluster
from toolkit.remote import NOT_FOUND, SSH_FAILED, TIMED_OUT, RemoteResult, run_remote

FAKE_SSH = """#!{python}
import json, os, sys
with open({log!r}, "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
os.execvp("bash", ["bash", "-c", sys.argv[-1]])  # bash execs a lone command: a kill reaches it
"""


@pytest.fixture
def loaded(tmp_path):
    return load(loopback_cluster(tmp_path / "loop"))


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch) -> Path:
    """`ssh` on PATH runs the remote command here; the log holds each argv it was given."""
    log = tmp_path / "ssh.log"
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "ssh").write_text(FAKE_SSH.format(python=sys.executable, log=str(log)))
    (folder / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return log


def test_the_command_goes_to_the_hosts_address_with_the_clusters_ssh_settings(loaded, fake_ssh):
    result = run_remote(loaded, "etcd-1", "echo hello", timeout=30)
    argv = json.loads(fake_ssh.read_text())
    assert argv[-2:] == ["127.0.0.11", "echo hello"]
    # No ssh_config is read, the host key is checked against the inventory's known_hosts.
    assert argv[argv.index("-F") + 1] == os.devnull
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    known = str(loaded.source.parent / "known_hosts")
    assert f"UserKnownHostsFile={known}" in argv
    assert result == RemoteResult("etcd-1", 0, "hello\n", "")
    assert result.ok


def test_exit_status_stdout_and_stderr_come_back_as_the_command_left_them(loaded, fake_ssh):
    result = run_remote(loaded, "lb-1", "echo out; echo err >&2; echo last >&2; exit 3", timeout=30)
    assert (result.host, result.exit_code, result.ok) == ("lb-1", 3, False)
    assert (result.stdout, result.stderr) == ("out\n", "err\nlast\n")
    assert result.last_line() == "last" and result.tail() == "err\nlast"
    quiet = run_remote(loaded, "lb-1", "exit 4", timeout=30)
    assert (quiet.last_line(), quiet.tail()) == ("exit 4", "failed")
    # Bytes that are not UTF-8 are replaced, never an exception.
    odd = run_remote(loaded, "lb-1", r"printf '\377ok'", timeout=30)
    assert odd.stdout == "\ufffdok"


def test_stdin_is_sent_and_otherwise_nothing_is_read(loaded, fake_ssh):
    sent = run_remote(loaded, "dns-1", "cat", timeout=30, stdin=b"snapshot bytes")
    assert sent.stdout == "snapshot bytes"
    # Without stdin, `cat` ends at once on an empty input: the caller's terminal is not read.
    assert run_remote(loaded, "dns-1", "cat", timeout=10).stdout == ""


def test_stdout_streams_into_a_file(loaded, fake_ssh, tmp_path):
    out = tmp_path / "copy"
    with out.open("wb") as handle:
        command = "printf data; echo done >&2"
        result = run_remote(loaded, "cpu-1", command, timeout=30, stdout=handle)
    assert out.read_bytes() == b"data"
    assert (result.ok, result.stdout, result.stderr) == (True, "", "done\n")


def test_a_command_past_its_deadline_is_a_timed_out_result(loaded, fake_ssh):
    result = run_remote(loaded, "etcd-1", "sleep 30", timeout=0.5)
    assert (result.exit_code, result.timed_out, result.ok) == (TIMED_OUT, True, False)
    assert result.stderr == "timed out after 0.5s"


def test_no_ssh_program_is_a_result_too(loaded, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = run_remote(loaded, "etcd-1", "true", timeout=10)
    assert (result.exit_code, result.stderr) == (NOT_FOUND, "ssh: not found")


def test_the_real_ssh_failing_to_connect_is_exit_255(loaded):
    """Nothing listens on 127.0.0.11:22 here: ssh itself fails, before any host key."""
    result = run_remote(loaded, "etcd-1", "true", timeout=30)
    assert (result.exit_code, result.ok, result.timed_out) == (SSH_FAILED, False, False)
    assert "127.0.0.11" in result.last_line()
