"""The rollout Job's lock fails closed: a ledger that cp-1 cannot read stops a local apply (exit
8, one line saying why); no Kubernetes on cp-1 yet, or no ledger, is no rollout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from engine import rolloutlock
from engine.applylock import LockHeld
from engine.context import load
from toolkit.remote import SSH_FAILED, RemoteResult

NOT_FOUND = 'Error from server (NotFound): configmaps "gpuinfra-rollout-small" not found'
REFUSED = "The connection to the server 10.0.0.10:6443 was refused - did you specify the right host"


def enabled(small_cluster, write_cluster, tmp_path: Path) -> Path:
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.61 ssh-ed25519 AAAA\n")
    small_cluster["ssh"] = {"known_hosts": str(known)}
    small_cluster["group_vars"] = {"all": {"rollout_job": {"enabled": True, "nodes": ["cpu-1"]}}}
    return write_cluster(small_cluster)


def cp1(get: RemoteResult, admin_conf: bool = True):
    """cp-1 as the lock sees it: `get` answers the ledger's read; admin.conf there or not."""

    def run(loaded, host, command, *, timeout, stdin=None):
        if command.startswith("test -e "):
            return RemoteResult(host, 0 if admin_conf else 1, "")
        assert " get configmap " in command, command
        return get

    return run


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (RemoteResult("cp-1", SSH_FAILED, "", "ssh: connect to host cp-1: No route"), "No route"),
        (RemoteResult("cp-1", 1, "", REFUSED), "was refused"),
        (RemoteResult("cp-1", 0, "not json"), "printed no JSON"),
        (RemoteResult("cp-1", 0, json.dumps({"data": {"ledger.json": "{"}})), "unreadable"),
    ],
)
def test_an_unreadable_ledger_stops_a_local_apply(
    small_cluster, write_cluster, tmp_path, answer, why
):
    loaded = load(enabled(small_cluster, write_cluster, tmp_path))
    with pytest.raises(LockHeld) as raised:
        rolloutlock.check_rollout(loaded, tmp_path / "apply.lock", runner=cp1(answer))
    message = str(raised.value)
    assert "\n" not in message and why in message
    assert "cannot read the rollout Job's ledger gpuinfra/gpuinfra-rollout-small" in message


def test_the_cli_exits_8_when_the_ledger_cannot_be_read(
    small_cluster, write_cluster, tmp_path, monkeypatch
):
    path = enabled(small_cluster, write_cluster, tmp_path)
    monkeypatch.setattr(rolloutlock, "run_remote", cp1(RemoteResult("cp-1", 1, "", REFUSED)))
    result = CliRunner().invoke(app, ["apply", str(path), "--yes"])
    assert result.exit_code == 8
    assert "cannot read the rollout Job's ledger" in result.stderr


def test_no_ledger_or_no_kubernetes_yet_is_no_rollout(small_cluster, write_cluster, tmp_path):
    """The controls: a cluster whose ledger is absent, and cp-1 before Kubernetes is there."""
    loaded = load(enabled(small_cluster, write_cluster, tmp_path))
    lock = tmp_path / "apply.lock"
    absent = RemoteResult("cp-1", 1, "", NOT_FOUND)
    assert rolloutlock.check_rollout(loaded, lock, runner=cp1(absent)) is None
    fresh = RemoteResult("cp-1", 1, "", "stat /etc/kubernetes/admin.conf: no such file")
    assert rolloutlock.check_rollout(loaded, lock, runner=cp1(fresh, admin_conf=False)) is None
