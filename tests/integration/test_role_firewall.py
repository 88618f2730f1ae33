"""The firewall role on the lab: gpuinfra's table goes live and survives reboots, peers reach
only their ports, other tables are never touched, and a rule added by hand is drift."""

from __future__ import annotations

import json
import subprocess

import pytest

from cli.exitcodes import ExitCode
from tests.integration.roles_helpers import GPUINFRA, apply_roles, gpuinfra, pending, probe_tcp

pytestmark = pytest.mark.integration
ROLES = "base,firewall,dns"


def test_plan_after_apply_has_no_changes(converged):
    result = gpuinfra("plan", str(converged.inventory_path), "--roles", ROLES, "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    assert pending(json.loads(result.stdout)) == {}


@pytest.mark.parametrize("host", ["etcd-1", "cpu-1", "dns-1"])
def test_table_is_live_with_a_drop_policy_and_enabled_for_boot(converged, host):
    table = converged.ssh(host, "nft list table inet gpuinfra").stdout
    assert "policy drop;" in table
    assert 'comment "SSH from admin networks"' in table
    assert converged.ssh(host, "systemctl is-enabled nftables").stdout.strip() == "enabled"
    conf = converged.ssh(host, "grep -v '^#' /etc/nftables.conf").stdout
    assert "flush" not in conf


def test_etcd_ports_are_dropped_from_a_worker(converged):
    """Each negative probe follows a positive control: the same target answers SSH from the
    same source, so a "timeout" cannot come from a host that is down."""
    etcd = converged.address("etcd-1")
    ssh_port = converged.loaded.cluster.ssh.port
    for port in (2379, 2380):
        assert probe_tcp(converged, "cpu-1", etcd, ssh_port) == "open"
        assert probe_tcp(converged, "cpu-1", etcd, port) == "timeout"


def test_etcd_client_port_reaches_etcd_from_the_control_plane(converged):
    """Nothing may listen yet (etcd is another role): "refused" proves the packet got through,
    as an RST only comes from the etcd host's kernel; "open" once etcd runs."""
    assert probe_tcp(converged, "cp-1", converged.address("etcd-1"), 2379) in ("open", "refused")
    ssh_port = converged.loaded.cluster.ssh.port
    assert probe_tcp(converged, "cp-1", converged.address("etcd-1"), ssh_port) == "open"
    assert probe_tcp(converged, "cp-1", converged.address("etcd-1"), 2380) == "timeout"
    assert probe_tcp(converged, "etcd-2", converged.address("etcd-1"), 2380) in ("open", "refused")


def test_ssh_still_reaches_every_host_from_the_controller(converged):
    for host in converged.hosts:
        assert converged.ssh(host, "true").returncode == 0


def test_a_reload_leaves_other_tables_alone(converged):
    """Loading the boot configuration (what `systemctl reload nftables` runs) and our table's
    file replaces only gpuinfra's table. The files are loaded with nft itself: one CI run saw
    systemd in a lab host fail to spawn the reload job, which says nothing about the ruleset."""
    host = "lb-1"
    converged.ssh(host, "nft add table inet someone_else && nft add chain inet someone_else c")
    try:
        converged.ssh(host, "nft -f /etc/nftables.conf && nft -f /etc/nftables.d/gpuinfra.nft")
        tables = converged.ssh(host, "nft list tables").stdout
        assert "table inet someone_else" in tables and "table inet gpuinfra" in tables
    finally:
        converged.ssh(host, "nft delete table inet someone_else")


def test_drift_reports_a_rule_added_by_hand_and_apply_removes_it(converged, tmp_path):
    lab, host = converged, "cpu-1"
    lab.ssh(host, "nft add rule inet gpuinfra input tcp dport 4444 accept")
    report_path = tmp_path / "drift.json"
    result = gpuinfra("drift", str(lab.inventory_path), "--roles", ROLES,
                      "--report", str(report_path))  # fmt: skip
    assert result.returncode == ExitCode.DRIFT, result.stdout[-3000:]
    report = json.loads(report_path.read_text())
    assert pending(report) == {host: ["Firewall | Load the gpuinfra table"]}
    assert report["hosts"][host]["status"] == "drift"
    assert "4444" in lab.ssh(host, "nft list table inet gpuinfra").stdout  # drift changed nothing

    apply_roles(lab.inventory_path, "firewall", "--limit", host)
    assert "4444" not in lab.ssh(host, "nft list table inet gpuinfra").stdout
    again = gpuinfra("drift", str(lab.inventory_path), "--roles", "firewall", "--limit", host)
    assert again.returncode == ExitCode.OK, again.stdout[-2000:]


def test_the_table_comes_back_after_a_reboot(converged):
    lab, host = converged, "gpu-1"
    subprocess.run(
        [GPUINFRA, "lab", "stop", host, "--name", lab.name], check=True, capture_output=True
    )
    subprocess.run(
        [GPUINFRA, "lab", "start", host, "--name", lab.name], check=True, capture_output=True
    )
    assert "policy drop;" in lab.ssh(host, "nft list table inet gpuinfra").stdout
    result = gpuinfra("plan", str(lab.inventory_path), "--roles", "firewall", "--limit", host,
                      "--format", "json")  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout[-2000:]
    assert pending(json.loads(result.stdout)) == {}
