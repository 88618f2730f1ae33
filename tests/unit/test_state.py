"""The controller's state (`.state/`) is explicit per command: plan and drift never create it,
render shows placeholders without it, state files are atomic and private from creation, and
the keepalived password is a random secret kept there (issue 13, defects 3 and 7).

The inventory's hosts are loopback addresses (127.0.0.x) where nothing listens for SSH: no
test here reaches a host, and one that wrongly tried would only reach this machine."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from engine.render import render_cluster
from inventory.loader import load
from roles.dns.secrets import tsig_secret
from roles.etcd.pki import ensure_pki
from roles.loadbalancer.config import LoadBalancerConfig
from tests.unit.loopback import loopback_cluster

# What render writes in place of a secret apply has not made (toolkit.statefiles.PLACEHOLDER).
PLACEHOLDER = "PLACEHOLDER-run-gpuinfra-apply"

runner = CliRunner()


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    return loopback_cluster(tmp_path / "loop")


@pytest.mark.parametrize("command", ["plan", "drift"])
def test_read_only_commands_never_create_state(cluster_dir, command):
    result = runner.invoke(app, [command, str(cluster_dir)])
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(cluster_dir / ".state") in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert not (cluster_dir / ".state").exists()


def test_read_only_commands_name_the_missing_secret_in_partial_state(cluster_dir):
    """A state folder without the etcd CA (the DNS key alone): the error names the CA file."""
    tsig_secret(cluster_dir / ".state")
    before = sorted(p.name for p in (cluster_dir / ".state").rglob("*"))
    result = runner.invoke(app, ["plan", str(cluster_dir)])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "etcd-pki/ca.crt" in result.stderr
    assert sorted(p.name for p in (cluster_dir / ".state").rglob("*")) == before


def test_existing_access_raises_instead_of_minting_a_ca(cluster_dir):
    from inventory.model import StateAccess
    from toolkit.statefiles import StateMissing

    loaded = load(cluster_dir).with_state_access(StateAccess.existing)
    with pytest.raises(StateMissing):
        ensure_pki(loaded)
    assert not (cluster_dir / ".state").exists()


def test_render_without_state_writes_placeholders_and_no_state(cluster_dir, tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["render", str(cluster_dir), "--out", str(out)])
    assert result.exit_code == ExitCode.OK, result.output
    assert not (cluster_dir / ".state").exists()
    assert "placeholders" in result.stderr and str(cluster_dir / ".state") in result.stderr
    key = (out / "etcd-1/etc/etcd/pki/server.key").read_text()
    assert PLACEHOLDER in key and "PRIVATE KEY" not in key
    assert PLACEHOLDER in (out / "dns-1/etc/bind/gpuinfra-transfer.key").read_text()
    assert PLACEHOLDER in (out / "lb-1/etc/keepalived/keepalived.conf").read_text()


def test_render_with_state_uses_it_and_says_nothing(cluster_dir, tmp_path):
    """Positive control of the test above: after state exists, render shows real secrets."""
    from roles.loadbalancer.files import vrrp_password

    ensure_pki(load(cluster_dir))  # what apply makes (StateAccess.create)
    tsig_secret(cluster_dir / ".state")
    vrrp_password(load(cluster_dir), LoadBalancerConfig())
    out = tmp_path / "out"
    result = runner.invoke(app, ["render", str(cluster_dir), "--out", str(out)])
    assert result.exit_code == ExitCode.OK
    assert "placeholder" not in result.stderr
    assert "PRIVATE KEY" in (out / "etcd-1/etc/etcd/pki/server.key").read_text()
    assert PLACEHOLDER not in (out / "lb-1/etc/keepalived/keepalived.conf").read_text()


def test_render_creates_secret_files_private(cluster_dir, tmp_path, monkeypatch):
    """Every rendered secret is 0600 from its creation: with chmod disabled, whatever mode a
    file was created with is what stays (main wrote 0644, then chmod-ed)."""
    ensure_pki(load(cluster_dir))
    loaded = load(cluster_dir)
    if hasattr(loaded, "with_state_access"):
        from inventory.model import StateAccess

        loaded = loaded.with_state_access(StateAccess.placeholder)
    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)
    monkeypatch.setattr(Path, "chmod", lambda *args, **kwargs: None)
    old_umask = os.umask(0o022)
    try:
        render_cluster(loaded, tmp_path / "out")
    finally:
        os.umask(old_umask)
    key = tmp_path / "out/etcd-1/etc/etcd/pki/server.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    public = tmp_path / "out/etcd-1/etc/etcd/pki/ca.crt"
    assert stat.S_IMODE(public.stat().st_mode) == 0o644  # control: not everything is 0600


def test_state_secrets_are_0600_and_the_folder_0700(cluster_dir):
    from roles.loadbalancer.files import vrrp_password

    old_umask = os.umask(0)  # the widest umask: the modes must come from the code
    try:
        ensure_pki(load(cluster_dir))
        tsig_secret(cluster_dir / ".state")
        vrrp_password(load(cluster_dir), LoadBalancerConfig())
    finally:
        os.umask(old_umask)
    state = cluster_dir / ".state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    secrets = [*state.rglob("*.key"), *state.rglob("*.secret")]
    assert len(secrets) >= 5
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in secrets} == {"0o600"}
    assert not list(state.rglob("*.partial"))


def test_write_secret_atomically_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    from toolkit.statefiles import write_secret_atomically

    target = tmp_path / "secret"
    write_secret_atomically(target, b"old")

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        write_secret_atomically(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]  # no staged file left


def test_vrrp_password_is_random_kept_and_not_derived(tmp_path):
    from roles.loadbalancer.files import vrrp_password

    first = load(loopback_cluster(tmp_path / "a"))
    again = vrrp_password(first, LoadBalancerConfig())
    assert vrrp_password(first, LoadBalancerConfig()) == again  # kept in state
    assert len(again) == 8 and again.isalnum()
    # Same name and VIP, another checkout: another password (nothing derives it).
    twin = load(loopback_cluster(tmp_path / "b"))
    assert vrrp_password(twin, LoadBalancerConfig()) != again
    path = tmp_path / "a/.state/loadbalancer/vrrp-password.secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # An inventory's own password still wins.
    assert vrrp_password(first, LoadBalancerConfig(vrrp_password="s3cret")) == "s3cret"


def test_vrrp_password_placeholder_and_missing(tmp_path):
    from inventory.model import StateAccess
    from roles.loadbalancer.files import vrrp_password
    from toolkit.statefiles import StateMissing

    loaded = load(loopback_cluster(tmp_path / "a"))
    placeholder = loaded.with_state_access(StateAccess.placeholder)
    assert vrrp_password(placeholder, LoadBalancerConfig()) == PLACEHOLDER
    with pytest.raises(StateMissing):
        vrrp_password(loaded.with_state_access(StateAccess.existing), LoadBalancerConfig())
    assert not (tmp_path / "a/.state").exists()
