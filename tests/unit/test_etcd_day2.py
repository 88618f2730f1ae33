"""Day-2 etcd logic that needs no hosts: metrics, status parsing, quorum verdicts, the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from day2 import etcd as day2
from day2.etcd import Remote, wal_fsync_p99_ms
from engine.context import load

METRICS = "\n".join(
    [
        "# HELP etcd_disk_wal_fsync_duration_seconds ...",
        'etcd_disk_wal_fsync_duration_seconds_bucket{le="0.001"} 50',
        'etcd_disk_wal_fsync_duration_seconds_bucket{le="0.002"} 90',
        'etcd_disk_wal_fsync_duration_seconds_bucket{le="0.004"} 99',
        'etcd_disk_wal_fsync_duration_seconds_bucket{le="0.008"} 100',
        'etcd_disk_wal_fsync_duration_seconds_bucket{le="+Inf"} 100',
    ]
)


def test_wal_fsync_p99_is_the_bucket_holding_the_99th_percentile():
    assert wal_fsync_p99_ms(METRICS) == pytest.approx(4.0)
    assert wal_fsync_p99_ms("") is None
    assert wal_fsync_p99_ms('etcd_disk_wal_fsync_duration_seconds_bucket{le="+Inf"} 0') is None


def status_output(member_id: int, leader: int, healthy: bool) -> str:
    status = [{"Endpoint": "https://127.0.0.1:2379", "Status": {
        "header": {"member_id": member_id}, "version": "3.5.16", "dbSize": 20480,
        "dbSizeInUse": 16384, "leader": leader, "raftTerm": 5, "raftIndex": 86}}]  # fmt: skip
    health = [{"endpoint": "https://127.0.0.1:2379", "health": healthy}]
    if not healthy:
        health[0]["error"] = "context deadline exceeded"
    return (
        f"== status\n{json.dumps(status)}\n== health\n{json.dumps(health)}\n"
        f"== metrics\n{METRICS}\n== end\n"
    )


@pytest.fixture
def loaded(small_cluster, write_cluster):
    return load(write_cluster(small_cluster))


def fake_hosts(monkeypatch, answers: dict[str, Remote]) -> None:
    def run_on(loaded, host, command, **kwargs):
        if "alarm list" in command:
            return Remote(True, "", "")
        return answers[host]

    monkeypatch.setattr(day2, "run_on", run_on)


def test_status_with_every_member_healthy(monkeypatch, loaded):
    fake_hosts(monkeypatch, {
        "etcd-1": Remote(True, status_output(1, 2, True), ""),
        "etcd-2": Remote(True, status_output(2, 2, True), ""),
        "etcd-3": Remote(True, status_output(3, 2, True), ""),
    })  # fmt: skip
    result = day2.status(loaded)
    assert result.health == "healthy" and result.leader == "etcd-2"
    assert result.healthy_members == 3 and result.quorum == 2
    assert {m.wal_fsync_p99_ms for m in result.members} == {4.0}
    assert result.members[0].db_size == 20480


def test_status_degraded_then_lost(monkeypatch, loaded):
    down = Remote(
        True, "== status\nError: context deadline exceeded\n== health\n== metrics\n== end\n", ""
    )
    unreachable = Remote(False, "", "ssh: connect to host 10.0.0.13 port 22: No route to host")
    fake_hosts(monkeypatch, {
        "etcd-1": Remote(True, status_output(1, 1, True), ""),
        "etcd-2": Remote(True, status_output(2, 1, True), ""),
        "etcd-3": unreachable,
    })  # fmt: skip
    result = day2.status(loaded)
    assert result.health == "degraded"
    states = {m.name: m.state for m in result.members}
    assert states == {"etcd-1": "healthy", "etcd-2": "healthy", "etcd-3": "unreachable"}
    assert "No route to host" in result.members[2].error
    fake_hosts(monkeypatch, {
        "etcd-1": Remote(True, status_output(1, 0, False), ""),
        "etcd-2": down,
        "etcd-3": unreachable,
    })  # fmt: skip
    lost = day2.status(loaded)
    assert lost.health == "lost" and lost.leader is None
    assert [m.state for m in lost.members] == ["unhealthy", "down", "unreachable"]


def test_status_command_exit_codes_follow_health(monkeypatch, loaded):
    fake_hosts(monkeypatch, {
        "etcd-1": Remote(True, status_output(1, 1, True), ""),
        "etcd-2": Remote(True, status_output(2, 1, True), ""),
        "etcd-3": Remote(False, "", "refused"),
    })  # fmt: skip
    result = CliRunner().invoke(app, ["etcd", "status", str(loaded.source), "--format", "json"])
    assert result.exit_code == ExitCode.DEGRADED, result.output
    assert json.loads(result.output)["health"] == "degraded"


def test_certs_command_reports_expiry(loaded):
    from roles.etcd.pki import ensure_pki

    runner = CliRunner()
    missing = runner.invoke(app, ["etcd", "certs", str(loaded.source)])
    assert missing.exit_code == ExitCode.BAD_INPUT
    ensure_pki(loaded, cert_days=10)
    result = runner.invoke(app, ["etcd", "certs", str(loaded.source), "--format", "json"])
    assert result.exit_code == ExitCode.DEGRADED, result.output
    report = json.loads(result.output)
    assert {e["status"] for e in report if e["name"] != "ca"} == {"expiring"}


def test_replace_refuses_a_host_that_is_not_a_member(loaded):
    with pytest.raises(day2.EtcdOperationError, match="not an etcd member"):
        day2.replace(loaded, "cp-1")


def test_restore_refuses_a_missing_snapshot(loaded, tmp_path):
    with pytest.raises(day2.EtcdOperationError, match="no such snapshot"):
        day2.restore(loaded, tmp_path / "nothing.db")
