"""apply refuses, before anything changes, when the etcd members trust another CA than the
controller's state, and creates state only for members holding no CA (issue 13, defect 3).

Stand-ins: each member's live CA file (read over ssh by `roles.etcd.trust.read_live_ca`) is
given here, and the run itself (`engine.runner.run`) is replaced by a recorder; the lock, the
fingerprint comparison, the state and the command line are real."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from engine.reports import Mode, RunReport
from inventory.loader import load
from inventory.model import StateAccess
from roles.etcd import trust
from roles.etcd.pki import ensure_pki, local_ca_fingerprint
from tests.unit.loopback import loopback_cluster

runner = CliRunner()


@pytest.fixture
def runs(monkeypatch):
    """What reached the run: the cluster each apply ran with."""
    seen = []

    def record(loaded, options, progress=None, record=False):
        seen.append(loaded)
        return RunReport(cluster=loaded.cluster.name, mode=Mode.apply)

    monkeypatch.setattr("engine.runner.run", record)
    return seen


def live(monkeypatch, fingerprint=None, error=None):
    monkeypatch.setattr(
        trust, "read_live_ca", lambda loaded, host: trust.LiveCA(host, fingerprint, error)
    )


def other_ca_fingerprint(tmp_path) -> str:
    other = load(loopback_cluster(tmp_path / "other"))
    ensure_pki(other)
    return local_ca_fingerprint(other)


def test_differing_live_ca_refuses_and_changes_nothing(tmp_path, monkeypatch, runs):
    cluster = loopback_cluster(tmp_path / "loop")
    ensure_pki(load(cluster))
    before = {p: p.read_bytes() for p in (cluster / ".state").rglob("*") if p.is_file()}
    live(monkeypatch, fingerprint=other_ca_fingerprint(tmp_path))
    result = runner.invoke(app, ["apply", str(cluster), "--yes"])
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: etcd-1: its etcd CA")
    assert runs == []  # nothing ran on any host
    after = {p: p.read_bytes() for p in (cluster / ".state").rglob("*") if p.is_file()}
    assert {p: v for p, v in after.items() if p.name != "apply.lock"} == {
        p: v for p, v in before.items() if p.name != "apply.lock"
    }


def test_same_live_ca_goes_on(tmp_path, monkeypatch, runs):
    """Control of the test above: the members trust the controller's CA."""
    cluster = loopback_cluster(tmp_path / "loop")
    ensure_pki(load(cluster))
    live(monkeypatch, fingerprint=local_ca_fingerprint(load(cluster)))
    result = runner.invoke(app, ["apply", str(cluster), "--yes"])
    assert result.exit_code == ExitCode.OK, result.output
    assert len(runs) == 1 and runs[0].state_access is StateAccess.create


def test_no_local_state_and_a_live_ca_refuses_without_making_state(tmp_path, monkeypatch, runs):
    cluster = loopback_cluster(tmp_path / "loop")
    live(monkeypatch, fingerprint=other_ca_fingerprint(tmp_path))
    result = runner.invoke(app, ["apply", str(cluster), "--yes"])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "etcd-1: holds an etcd CA" in result.stderr
    assert runs == [] and not (cluster / ".state").exists()


def test_no_local_state_and_an_unreadable_member_refuses(tmp_path, monkeypatch, runs):
    cluster = loopback_cluster(tmp_path / "loop")
    live(monkeypatch, error="Connection refused")
    result = runner.invoke(app, ["apply", str(cluster), "--yes"])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "etcd-1: cannot read its etcd CA (Connection refused)" in result.stderr
    assert runs == [] and not (cluster / ".state").exists()


def test_fresh_cluster_may_create_state(tmp_path, monkeypatch, runs):
    cluster = loopback_cluster(tmp_path / "loop")
    live(monkeypatch)  # no member holds a CA file
    result = runner.invoke(app, ["apply", str(cluster), "--yes"])
    assert result.exit_code == ExitCode.OK, result.output
    assert len(runs) == 1 and runs[0].state_access is StateAccess.create
