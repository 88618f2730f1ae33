"""Day-2 etcd logic that needs no hosts: metrics, status parsing, quorum verdicts, the CLI."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from day2 import etcd as day2
from day2.etcd import common, replace_commands, restore_commands, restore_flow
from day2.etcd.health import wal_fsync_p99_ms
from tests.unit.test_etcd_hardening import Members, remote
from toolkit import remote as remote_module
from toolkit.remote import RemoteResult

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


def test_only_common_binds_the_remote_primitive():
    """Every module of day2/etcd/ reaches a member through `common.run_remote`, the one name
    these tests replace: a module binding `run_remote` itself would reach past the stand-in."""
    package = Path(day2.__file__).parent
    binding: dict[str, list[str]] = {}
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "toolkit.remote":
                names = [alias.name for alias in node.names if alias.name == "run_remote"]
                if names:
                    binding.setdefault(path.name, []).extend(names)
    assert binding == {"common.py": ["run_remote"]}
    calls = [path.name for path in package.glob("*.py") if "common.run_remote(" in path.read_text()]
    assert len(calls) >= 4  # health, snapshots, restore_flow, replace_flow


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


def fake_hosts(monkeypatch, answers: dict[str, RemoteResult]) -> None:
    def run_on(loaded, host, command, **kwargs):
        if "alarm list" in command:
            return remote(True, "", "")
        return answers[host]

    monkeypatch.setattr(common, "run_remote", run_on)


def test_status_with_every_member_healthy(monkeypatch, loaded):
    fake_hosts(monkeypatch, {
        "etcd-1": remote(True, status_output(1, 2, True), ""),
        "etcd-2": remote(True, status_output(2, 2, True), ""),
        "etcd-3": remote(True, status_output(3, 2, True), ""),
    })  # fmt: skip
    result = day2.status(loaded)
    assert result.health == "healthy" and result.leader == "etcd-2"
    assert result.healthy_members == 3 and result.quorum == 2
    assert {m.wal_fsync_p99_ms for m in result.members} == {4.0}
    assert result.members[0].db_size == 20480


def test_status_degraded_then_lost(monkeypatch, loaded):
    down = remote(
        True, "== status\nError: context deadline exceeded\n== health\n== metrics\n== end\n", ""
    )
    unreachable = remote(False, "", "ssh: connect to host 10.0.0.13 port 22: No route to host")
    fake_hosts(monkeypatch, {
        "etcd-1": remote(True, status_output(1, 1, True), ""),
        "etcd-2": remote(True, status_output(2, 1, True), ""),
        "etcd-3": unreachable,
    })  # fmt: skip
    result = day2.status(loaded)
    assert result.health == "degraded"
    states = {m.name: m.state for m in result.members}
    assert states == {"etcd-1": "healthy", "etcd-2": "healthy", "etcd-3": "unreachable"}
    assert "No route to host" in result.members[2].error
    fake_hosts(monkeypatch, {
        "etcd-1": remote(True, status_output(1, 0, False), ""),
        "etcd-2": down,
        "etcd-3": unreachable,
    })  # fmt: skip
    lost = day2.status(loaded)
    assert lost.health == "lost" and lost.leader is None
    assert [m.state for m in lost.members] == ["unhealthy", "down", "unreachable"]


def test_status_command_exit_codes_follow_health(monkeypatch, loaded):
    fake_hosts(monkeypatch, {
        "etcd-1": remote(True, status_output(1, 1, True), ""),
        "etcd-2": remote(True, status_output(2, 1, True), ""),
        "etcd-3": remote(False, "", "refused"),
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


# ---------------------------------------------------------------- issue 30: refusals and state


def test_a_refused_restore_names_the_snapshot_and_exits_2(loaded, tmp_path, monkeypatch):
    from roles.etcd import trust

    monkeypatch.setattr(trust, "read_live_ca", lambda loaded, host: trust.LiveCA(host))
    result = CliRunner().invoke(
        app, ["etcd", "restore", str(loaded.source), str(tmp_path / "nothing.db"), "--yes"]
    )
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nothing.db'}: no such snapshot file"
    ]


@pytest.fixture
def snapshot_file(tmp_path):
    path = tmp_path / "snap.db"
    path.write_bytes(b"snapshot")
    return path


def _to_members(members: Members) -> list[str]:
    return [c for h, c in members.commands if h.startswith("etcd-")]


@pytest.mark.parametrize(
    ("answer", "fail", "said"),
    [
        ("running\n", {}, "cp-1: kube-apiserver runs"),
        ("manifest\n", {}, "cp-1: kube-apiserver is set to run"),
        ("", {"pgrep -x kube-apiserver": "cp-2"}, "cp-2: cannot tell whether kube-apiserver"),
    ],
)
def test_restore_is_refused_while_an_api_server_runs(
    monkeypatch, loaded, snapshot_file, answer, fail, said
):
    members = Members(fail=fail, api_server=answer)
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdRefused, match=said) as refused:
        day2.restore(loaded, snapshot_file, stamp="S")
    assert "nothing was changed" in str(refused.value)
    assert _to_members(members) == []  # no member was sent anything
    # Control: with the API servers stopped, the same restore goes ahead and ends healthy.
    stopped = Members()
    monkeypatch.setattr(common, "run_remote", stopped)
    healthy = day2.ClusterStatus("small", "healthy", 2, 3, None, 0)
    monkeypatch.setattr(restore_flow, "status", lambda loaded: healthy)
    day2.restore(loaded, snapshot_file, stamp="S")
    assert stopped.sent("systemctl stop etcd") and stopped.sent("cat > ")


def test_restore_asks_again_before_stopping_the_members(monkeypatch, loaded, snapshot_file):
    """An API server started while the restore staged: the members are not stopped, the staged
    copies go, and the refusal says so."""

    class StartedLater(Members):
        def __call__(self, loaded, host, command, **kwargs):
            if command == restore_flow.API_SERVER_STATE and self.sent("etcdutl snapshot restore"):
                self.api_server = "running\n"
            return super().__call__(loaded, host, command, **kwargs)

    members = StartedLater()
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdRefused, match="cp-1: kube-apiserver runs"):
        day2.restore(loaded, snapshot_file, stamp="S")
    assert members.sent("etcdutl snapshot restore")  # it got as far as staging
    assert not members.sent("systemctl stop")
    cleaned = {h for h, c in members.commands if "rm -rf /var/lib/etcd/restore-S" in c}
    assert cleaned == {"etcd-1", "etcd-2", "etcd-3"}


@pytest.fixture
def with_disk(small_cluster, load_small):
    """etcd-2 has a dedicated data disk; the other members keep their data in a directory."""
    small_cluster["hosts"]["etcd-2"]["etcd"] = {"disk": "/dev/nvme1n1"}
    return load_small()


def test_restore_and_replace_are_refused_when_the_data_disk_is_not_mounted(
    monkeypatch, with_disk, snapshot_file
):
    members = Members(fail={"mountpoint -q": "etcd-2"})
    monkeypatch.setattr(common, "run_remote", members)
    unmounted = "etcd-2: its etcd data disk /dev/nvme1n1 is not mounted on /var/lib/etcd"
    with pytest.raises(day2.EtcdRefused, match=unmounted):
        day2.restore(with_disk, snapshot_file, stamp="S")
    assert _to_members(members) == ["mountpoint -q /var/lib/etcd"]  # only etcd-2 has a disk
    members.commands.clear()
    with pytest.raises(day2.EtcdRefused, match=unmounted):
        day2.replace(with_disk, "etcd-2", stamp="S")
    assert not members.sent("systemctl stop") and not members.sent("member remove")
    # Control: mounted, the replace goes through.
    mounted = Members()
    monkeypatch.setattr(common, "run_remote", mounted)
    day2.replace(with_disk, "etcd-2", stamp="S")
    assert mounted.first("mountpoint -q") < mounted.first("systemctl stop etcd")


def test_replace_fences_etcd_from_before_the_stop_until_the_new_member_is_added(
    monkeypatch, loaded
):
    members = Members()
    monkeypatch.setattr(common, "run_remote", members)
    day2.replace(loaded, "etcd-2", stamp="S")
    commands = [c for _, c in members.commands]
    stop = members.first("systemctl stop etcd")
    fence, unfence = replace_commands.fence(), replace_commands.unfence_command()
    assert commands[stop].index(fence) < commands[stop].index("systemctl stop etcd")
    lifted = [i for i, c in enumerate(commands) if c.startswith(unfence)]
    assert lifted == [members.first("systemctl start etcd")]
    assert members.first("member add") < lifted[0]
    assert members.first("member.before-replace-S") < lifted[0]


def _after_stop(members: Members) -> list[str]:
    return [c for _, c in members.commands[members.first("systemctl stop etcd") + 1 :]]


def test_discarded_data_and_a_failed_gate_leave_the_member_fenced_and_say_so(monkeypatch, loaded):
    members = Members(fail={"fio": "etcd-2"})
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdOperationError) as failed:
        day2.replace(loaded, "etcd-2", discard_old_data=True, stamp="S")
    message = str(failed.value)
    assert "stopped and fenced" in message and "still member 11 of the cluster" in message
    assert "DISCARDED" in message and "back in place" not in message
    assert not any(replace_commands.unfence_command() in c for c in _after_stop(members))
    assert not members.sent("member remove")
    # Control: with the data kept, it is put back and the fence lifted.
    kept = Members(fail={"fio": "etcd-2"})
    monkeypatch.setattr(common, "run_remote", kept)
    with pytest.raises(day2.EtcdOperationError) as failed:
        day2.replace(loaded, "etcd-2", stamp="S")
    assert "not fenced" in str(failed.value) and "old data back in place" in str(failed.value)
    assert any(replace_commands.unfence_command() in c for c in _after_stop(kept))


def test_a_failed_member_remove_after_a_discard_says_the_member_is_fenced(monkeypatch, loaded):
    members = Members(fail={"member remove": "*"})
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdOperationError, match="member remove failed") as failed:
        day2.replace(loaded, "etcd-2", discard_old_data=True, stamp="S")
    message = str(failed.value)
    assert "stopped and fenced" in message and "still member 11" in message
    assert "DISCARDED" in message
    assert not any(replace_commands.unfence_command() in c for c in _after_stop(members))
    assert not members.sent("member add")


def test_a_failed_member_add_says_the_old_member_is_gone_and_this_one_fenced(monkeypatch, loaded):
    members = Members(fail={"member add": "*"})
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdOperationError, match="member add failed") as failed:
        day2.replace(loaded, "etcd-2", discard_old_data=True, stamp="S")
    message = str(failed.value)
    assert "stopped and fenced, member 11 removed (the cluster has 2 members)" in message
    assert "etcd replace` again" in message
    assert not any(replace_commands.unfence_command() in c for c in _after_stop(members))


def test_snapshot_is_0600_from_its_creation_wherever_out_points(monkeypatch, loaded, tmp_path):
    """The copy is written into a file that is 0600 the moment it exists (umask 0 here, the
    widest; no chmod afterwards), and replaces an older, wider file at --out. Each snapshot
    has its own file on the member."""
    seen: list[int] = []

    def copy(argv, stdout, **kwargs):
        seen.append(os.fstat(stdout.fileno()).st_mode & 0o777)
        stdout.write(b"snapshot bytes")
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    def no_chmod(*args, **kwargs):
        raise AssertionError("a snapshot file must be created 0600, not chmod-ed after")

    older = tmp_path / "older.db"
    older.write_bytes(b"older")
    older.chmod(0o644)
    members = Members()

    def answer(loaded, host, command, **kwargs):  # the copy through the real primitive
        if "stdout" in kwargs:
            return remote_module.run_remote(loaded, host, command, **kwargs)
        return members(loaded, host, command, **kwargs)

    monkeypatch.setattr(common, "run_remote", answer)
    monkeypatch.setattr(remote_module.subprocess, "run", copy)
    monkeypatch.setattr(Path, "chmod", no_chmod)
    monkeypatch.setattr(os, "chmod", no_chmod)
    fresh = tmp_path / "elsewhere" / "new" / "snap.db"
    previous = os.umask(0)
    try:
        day2.snapshot(loaded, fresh)
        day2.snapshot(loaded, older)
    finally:
        os.umask(previous)
    assert seen == [0o600, 0o600]
    for out in (fresh, older):
        assert out.stat().st_mode & 0o777 == 0o600 and out.read_bytes() == b"snapshot bytes"
    assert fresh.parent.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in fresh.parent.iterdir()] == ["snap.db"]  # no partial left
    saved = [c.split("snapshot save ")[1].split()[0] for _, c in members.commands if "save" in c]
    assert len(set(saved)) == 2 and all(p.startswith("/var/tmp/gpuinfra-etcd-") for p in saved)
    assert restore_commands.RestorePaths("/var/lib/etcd", "S").snapshot not in saved
