"""`etcd status` on what etcdctl really prints, per etcd version (tests/unit/data/etcdctl/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from day2 import etcd as day2
from tests.unit.test_etcd_day2 import METRICS, fake_hosts
from tests.unit.test_etcd_hardening import remote

CAPTURES = Path(__file__).parent / "data" / "etcdctl"
VERSIONS = sorted(path.name for path in CAPTURES.iterdir() if path.is_dir())


def member_output(version: str, state: str) -> str:
    """What the status script prints on a member whose etcd answered as captured."""
    folder = CAPTURES / version
    status = (folder / f"status-{state}.txt").read_text()
    health = (folder / f"health-{state}.txt").read_text()
    return f"== status\n{status}== health\n{health}== metrics\n{METRICS}\n== end\n"


def test_every_captured_version_is_here():
    assert {"3.5.16", "3.6.16"} <= set(VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_healthy_members_read_as_healthy(monkeypatch, loaded, version):
    answer = remote(True, member_output(version, "healthy"), "")
    fake_hosts(monkeypatch, {host: answer for host in ("etcd-1", "etcd-2", "etcd-3")})
    result = day2.status(loaded)
    assert result.health == "healthy" and result.healthy_members == 3
    member = result.members[0]
    assert (member.state, member.error, member.version) == ("healthy", None, version)
    assert member.leader and member.db_size == 20480 and member.raft_term == 2


@pytest.mark.parametrize("version", VERSIONS)
def test_a_stopped_member_is_down_with_etcdctls_reason(monkeypatch, loaded, version):
    healthy = remote(True, member_output(version, "healthy"), "")
    down = remote(True, member_output(version, "down"), "")
    fake_hosts(monkeypatch, {"etcd-1": healthy, "etcd-2": healthy, "etcd-3": down})
    result = day2.status(loaded)
    assert result.health == "degraded"
    stopped = result.members[2]
    assert stopped.state == "down" and stopped.member_id is None
    # etcdctl's own line, not its JSON log records nor the `null` it prints for no answer.
    assert "context deadline exceeded" in stopped.error
    assert "level" not in stopped.error and stopped.error != "null"
