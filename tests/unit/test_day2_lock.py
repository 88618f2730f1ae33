"""Day-2 commands that change hosts hold the apply lock and run the pre-apply checks, as
`apply` does (issue 30, section 2); read-only commands take nothing and write nothing.

The flows themselves are stand-ins that record whether this process held the lock when they
ran and stop with their own error (exit 1): a command that reached one got through the lock and
the checks. The lock, the CA comparison, the state and the command line are real."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from day2 import etcd as etcd_day2
from day2 import kubernetes as kubernetes_day2
from engine.applylock import current_holder
from inventory.loader import load
from roles.etcd import trust
from roles.etcd.pki import ensure_pki, local_ca_fingerprint
from tests.unit.loopback import loopback_cluster
from tests.unit.test_apply_lock import contender

runner = CliRunner()

CHANGING = {
    "etcd rotate-certs": (etcd_day2, "rotate_certs", ["etcd", "rotate-certs", "{c}", "--yes"]),
    "etcd rotate-ca": (etcd_day2, "rotate_ca", ["etcd", "rotate-ca", "{c}", "--yes"]),
    "etcd restore": (etcd_day2, "restore", ["etcd", "restore", "{c}", "{snap}", "--yes"]),
    "etcd replace": (etcd_day2, "replace", ["etcd", "replace", "{c}", "etcd-1", "--yes"]),
    "kubernetes certs renew": (
        kubernetes_day2,
        "renew_certificates",
        ["kubernetes", "certs", "renew", "{c}", "--yes"],
    ),
    "kubernetes upgrade": (
        kubernetes_day2,
        "upgrade",
        ["kubernetes", "upgrade", "{c}", "{next}", "--yes"],
    ),
    "kubernetes node add": (
        kubernetes_day2,
        "add_nodes",
        ["kubernetes", "node", "add", "{c}", "cpu-1"],
    ),
    "kubernetes node remove": (
        kubernetes_day2,
        "remove_node",
        ["kubernetes", "node", "remove", "{c}", "cpu-1", "--yes"],
    ),
}

READ_ONLY = {
    "etcd status": (etcd_day2, "status", ["etcd", "status", "{c}"]),
    "etcd check-disk": (etcd_day2, "check_disk", ["etcd", "check-disk", "{c}"]),
    "kubernetes status": (kubernetes_day2, "status", ["kubernetes", "status", "{c}"]),
}


def _error_of(module):
    return getattr(module, "EtcdOperationError", None) or module.KubernetesOperationError


def stand_in(monkeypatch, module, name: str, state_dir: Path) -> list[int | None]:
    """Replace the flow: it records the pid holding the lock when it ran, then fails."""
    held_by: list[int | None] = []

    def flow(*args, **kwargs):
        holder = current_holder(state_dir)
        held_by.append(holder.pid if holder else None)
        raise _error_of(module)("stand-in flow ran")

    monkeypatch.setattr(module, name, flow)
    return held_by


def argv(template: list[str], cluster: Path, tmp_path: Path) -> list[str]:
    snap = tmp_path / "snap.db"
    snap.write_bytes(b"snapshot")
    version = load(cluster).cluster.versions.kubernetes
    major, minor, *_ = version.split(".")
    values = {"c": str(cluster), "snap": str(snap), "next": f"{major}.{int(minor) + 1}.0"}
    return [part.format(**values) for part in template]


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """The loopback cluster with its CA, whose one member trusts the same CA."""
    folder = loopback_cluster(tmp_path / "loop")
    ensure_pki(load(folder))
    fingerprint = local_ca_fingerprint(load(folder))
    monkeypatch.setattr(trust, "read_live_ca", lambda loaded, host: trust.LiveCA(host, fingerprint))
    return folder


@pytest.mark.parametrize("command", sorted(CHANGING))
def test_a_changing_day2_command_runs_under_the_lock(command, cluster, tmp_path, monkeypatch):
    """Positive control for the two refusals below: the flow runs, holding the lock."""
    module, name, template = CHANGING[command]
    held_by = stand_in(monkeypatch, module, name, cluster / ".state")
    result = runner.invoke(app, argv(template, cluster, tmp_path))
    assert result.exit_code == ExitCode.ERROR, result.output
    assert "stand-in flow ran" in result.stderr
    assert held_by == [os.getpid()]
    assert current_holder(cluster / ".state") is None  # released at the end


@pytest.mark.parametrize("command", sorted(CHANGING))
def test_a_changing_day2_command_is_refused_while_another_holds_the_lock(
    command, cluster, tmp_path, monkeypatch
):
    module, name, template = CHANGING[command]
    held_by = stand_in(monkeypatch, module, name, cluster / ".state")
    process = contender(cluster / ".state", "gpuinfra apply elsewhere")
    try:
        assert process.stdout.readline().strip() == "held"
        result = runner.invoke(app, argv(template, cluster, tmp_path))
    finally:
        process.stdin.close()
        process.wait()
    assert result.exit_code == ExitCode.LOCKED, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {process.pid}" in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert held_by == []


@pytest.mark.parametrize("command", sorted(CHANGING))
def test_a_changing_day2_command_runs_the_pre_apply_checks(command, cluster, tmp_path, monkeypatch):
    """The etcd CA check of `apply`: a member trusting another CA stops the command, exit 2."""
    module, name, template = CHANGING[command]
    held_by = stand_in(monkeypatch, module, name, cluster / ".state")
    other = load(loopback_cluster(tmp_path / "other"))
    ensure_pki(other)
    foreign = local_ca_fingerprint(other)
    monkeypatch.setattr(trust, "read_live_ca", lambda loaded, host: trust.LiveCA(host, foreign))
    result = runner.invoke(app, argv(template, cluster, tmp_path))
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: etcd-1: its etcd CA"), result.stderr
    assert "Traceback" not in result.output
    assert held_by == []


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


@pytest.mark.parametrize("command", sorted(READ_ONLY))
def test_a_read_only_day2_command_takes_no_lock_and_writes_nothing(command, tmp_path, monkeypatch):
    module, name, template = READ_ONLY[command]
    cluster = loopback_cluster(tmp_path / "loop")
    state = cluster / ".state"
    held_by = stand_in(monkeypatch, module, name, state)
    result = runner.invoke(app, argv(template, cluster, tmp_path))
    assert result.exit_code == ExitCode.ERROR and held_by == [None], result.output
    assert not state.exists()  # nothing written, not even the lock file
    # While an apply holds the lock, it still runs (it neither waits nor is refused) and the
    # holder keeps the lock and its record.
    process = contender(state, "gpuinfra apply elsewhere")
    try:
        assert process.stdout.readline().strip() == "held"
        before = _files(state)
        result = runner.invoke(app, argv(template, cluster, tmp_path))
        assert result.exit_code == ExitCode.ERROR, result.output
        assert held_by == [None, process.pid]
        assert _files(state) == before
        assert current_holder(state).pid == process.pid
    finally:
        process.stdin.close()
        process.wait()


def test_the_contender_helper_really_holds_the_lock(tmp_path):
    """The tests above lean on `contender`: a second one is refused while it holds."""
    first = contender(tmp_path / ".state", "first")
    try:
        assert first.stdout.readline().strip() == "held"
        refused = contender(tmp_path / ".state", "second")
        assert refused.stdout.readline().split()[0] == "refused"
        refused.stdin.close()
        refused.wait()
    finally:
        first.stdin.close()
        first.wait()


def test_rotate_ca_resumes_where_members_still_trust_the_old_bundle(tmp_path, monkeypatch):
    """Under the CA check, `etcd rotate-ca` must still resume a rotation stopped in its reissue
    step: the controller signs with the new CA while members it has not reached trust the old
    bundle (old CA first). A CA from no rotation of ours is still refused."""
    from roles.etcd import pki

    folder = loopback_cluster(tmp_path / "loop")
    loaded = load(folder)
    ensure_pki(loaded)
    old = local_ca_fingerprint(loaded)
    pki.begin_ca_rotation(loaded)
    old_bundle = pki.trusted_cas(loaded)  # what the trust-new step rolled out: old, then next
    assert [pki.ca_fingerprint(pem) for pem in trust._pem_blocks(old_bundle)][0] == old
    pki.promote_next_ca(loaded)  # the reissue step began; its roll-out stopped
    new = local_ca_fingerprint(loaded)
    bundle = tuple(pki.ca_fingerprint(pem) for pem in trust._pem_blocks(old_bundle))
    assert bundle == (old, new)
    monkeypatch.setattr(
        trust, "read_live_ca", lambda loaded, host: trust.LiveCA(host, old, bundle=bundle)
    )
    held_by = stand_in(monkeypatch, etcd_day2, "rotate_ca", folder / ".state")
    result = runner.invoke(app, ["etcd", "rotate-ca", str(folder), "--yes"])
    assert result.exit_code == ExitCode.ERROR and held_by == [os.getpid()], result.output
    # Control: a member trusting a CA that is none of ours is refused, rotation or not.
    other = load(loopback_cluster(tmp_path / "other"))
    ensure_pki(other)
    foreign = local_ca_fingerprint(other)
    monkeypatch.setattr(
        trust,
        "read_live_ca",
        lambda loaded, host: trust.LiveCA(host, foreign, bundle=(foreign,)),
    )
    result = runner.invoke(app, ["etcd", "rotate-ca", str(folder), "--yes"])
    assert result.exit_code == ExitCode.BAD_INPUT and len(held_by) == 1, result.output
    assert "etcd-1: its etcd CA" in result.stderr
