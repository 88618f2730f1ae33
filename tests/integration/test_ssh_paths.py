"""Every SSH path through a bastion, and a non-default SSH port behind the firewall, on a lab
of its own (three hosts, `GPUINFRA_SSH_LAB_NAME`, default `ssh`).

host-001 is the bastion. The controller's direct traffic to the other hosts is dropped by an
nft rule on the machine (a table of this test's own, on the lab bridge, removed at the end):
only the hop through host-001 reaches them. apply, drift and verify go through it; a forged
bastion key in known_hosts is refused on every path (pyinfra, ssh command lines, paramiko).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
import yaml

from cli.exitcodes import ExitCode
from engine.context import load
from lab import lifecycle
from lab.state import read_state
from lab.topology import generic_topology
from tests.integration.conftest import KEEP_ENV, LabCluster, boot_lab
from tests.integration.roles_helpers import gpuinfra
from toolkit.operations import reload_sshd_command
from toolkit.ssh import SSHSettings

pytestmark = pytest.mark.integration
LAB_NAME = os.environ.get("GPUINFRA_SSH_LAB_NAME", "ssh")
BASTION, BEHIND, PORT_HOST = "host-001", "host-002", "host-003"
DROP_TABLE = "gpuinfra_test_ssh_paths"
PORT = 2222


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    inventory = tmp_path_factory.mktemp("ssh-lab") / "cluster.yml"
    cluster = boot_lab(LAB_NAME, generic_topology(3), inventory)
    yield cluster
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(LAB_NAME)


def write_inventory(
    lab: LabCluster, folder: Path, site_files: tuple[str, ...] = (), **ssh: object
) -> Path:
    """A copy of the lab's cluster.yml with other ssh settings (absolute key paths kept), and
    the files the test adds on purpose declared (base.site_files)."""
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["ssh"].update(ssh)
    if site_files:
        data["group_vars"]["all"].setdefault("base", {})["site_files"] = list(site_files)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cluster.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_ssh(argv: list[str], command: str = "hostname") -> subprocess.CompletedProcess[str]:
    return subprocess.run([*argv, command], capture_output=True, text=True, timeout=120)


@contextlib.contextmanager
def direct_traffic_dropped(lab: LabCluster, hosts: list[str]) -> Iterator[None]:
    """Drop the connections the controller itself opens to `hosts` through the lab bridge (the
    output hook: the bastion's own traffic to them is bridged, not sent by the machine). Replies
    to what the hosts opened stay allowed: they fetch packages from the lab's cache on the
    machine."""
    state = read_state(lab.name)
    addresses = ", ".join(lab.address(h) for h in hosts)
    ruleset = (
        f"table inet {DROP_TABLE} {{\n"
        "  chain output {\n"
        "    type filter hook output priority filter; policy accept;\n"
        f'    oifname "{state.names.bridge}" ip daddr {{ {addresses} }} ct state new drop\n'
        "  }\n"
        "}\n"
    )
    subprocess.run(["nft", "-f", "-"], input=ruleset, text=True, check=True)
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", DROP_TABLE], check=True)


def test_apply_drift_and_verify_through_the_bastion(lab: LabCluster, tmp_path: Path) -> None:
    direct = SSHSettings.from_cluster(lab.loaded)
    inventory = write_inventory(lab, tmp_path / "bastion", bastion=f"root@{lab.address(BASTION)}")
    jumped = SSHSettings.from_cluster(load(inventory))
    with direct_traffic_dropped(lab, [BEHIND, PORT_HOST]):
        # Controls: the bastion answers directly, the others only through it.
        assert run_ssh(direct.argv(lab.address(BASTION))).stdout.strip() == BASTION
        cut_off = run_ssh(direct.argv(lab.address(BEHIND)))
        assert cut_off.returncode == 255 and "timed out" in cut_off.stderr, cut_off.stderr
        through = run_ssh(jumped.argv(lab.address(BEHIND)))
        assert through.stdout.strip() == BEHIND, through.stderr

        applied = gpuinfra("apply", str(inventory), "--roles", "base", "--yes",
                           "--format", "json")  # fmt: skip
        assert applied.returncode == ExitCode.OK, applied.stdout[-3000:] + applied.stderr[-2000:]
        report = json.loads(applied.stdout)
        assert {h["status"] for h in report["hosts"].values()} <= {"ok", "changed"}
        assert set(report["hosts"]) == {BASTION, BEHIND, PORT_HOST}
        config = inventory.parent / ".state" / "ssh_config"
        assert config.stat().st_mode & 0o777 == 0o600

        drift = gpuinfra("drift", str(inventory), "--roles", "base")
        assert drift.returncode == ExitCode.OK, drift.stdout[-3000:] + drift.stderr[-2000:]

        verified = gpuinfra("verify", str(inventory), "--roles", "base", "--format", "json")
        assert verified.returncode == ExitCode.OK, verified.stdout[-3000:] + verified.stderr[-2000:]
        results = json.loads(verified.stdout)["results"]
        assert {r["host"] for r in results if r["outcome"] == "passed"} == {
            BASTION, BEHIND, PORT_HOST,
        }  # fmt: skip


def forge_key(known_hosts: Path, address: str, forged_dir: Path) -> Path:
    """A copy of known_hosts whose entry for `address` holds another machine's key."""
    forged_dir.mkdir(parents=True, exist_ok=True)
    key = forged_dir / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    other = " ".join(key.with_suffix(".pub").read_text().split()[:2])
    lines = []
    for line in known_hosts.read_text().splitlines():
        lines.append(f"{address} {other}" if line.split()[0] == address else line)
    assert lines != known_hosts.read_text().splitlines()
    forged = forged_dir / "known_hosts"
    forged.write_text("\n".join(lines) + "\n")
    return forged


def test_a_forged_bastion_key_is_refused_on_every_path(lab: LabCluster, tmp_path: Path) -> None:
    bastion = f"root@{lab.address(BASTION)}"
    honest = write_inventory(lab, tmp_path / "honest", bastion=bastion)
    # Positive control: the same host, through the same bastion, before the key is forged.
    control = run_ssh(SSHSettings.from_cluster(load(honest)).argv(lab.address(BEHIND)))
    assert control.stdout.strip() == BEHIND, control.stderr
    client = SSHSettings.from_cluster(load(honest)).connect(lab.address(BEHIND))
    client.close()

    forged_file = forge_key(
        Path(lab.loaded.cluster.ssh.known_hosts), lab.address(BASTION), tmp_path / "keys"
    )
    forged = write_inventory(lab, tmp_path / "forged", bastion=bastion,
                             known_hosts=str(forged_file))  # fmt: skip
    settings = SSHSettings.from_cluster(load(forged))
    with direct_traffic_dropped(lab, [BEHIND, PORT_HOST]):
        refused = run_ssh(settings.argv(lab.address(BEHIND)))
        assert refused.returncode == 255 and refused.stdout == ""
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr, refused.stderr

        with pytest.raises(paramiko.BadHostKeyException):
            settings.connect(lab.address(BEHIND))

        drift = gpuinfra("drift", str(forged), "--roles", "base", "--format", "json")
        assert drift.returncode == ExitCode.UNREACHABLE, drift.stdout[-3000:]
        hosts = json.loads(drift.stdout)["hosts"]
        for name in (BASTION, BEHIND, PORT_HOST):
            assert hosts[name]["status"] == "unreachable"
            assert "host key refused" in hosts[name]["error"], hosts[name]["error"]

        applied = gpuinfra("apply", str(forged), "--roles", "base", "--yes", "--format", "json")
        assert applied.returncode == ExitCode.UNREACHABLE, applied.stdout[-3000:]
        assert {h["status"] for h in json.loads(applied.stdout)["hosts"].values()} == {
            "unreachable"
        }


def test_a_non_default_ssh_port_converges_behind_the_firewall(
    lab: LabCluster, tmp_path: Path
) -> None:
    """ssh.port 2222: the base role's sshd drop-in moves sshd to 2222 and the firewall's drop
    policy admits 2222 (it admitted only 22, locking the controller out). New connections on
    2222 after the apply are the proof: a live connection survives a drop policy."""
    # Every reload waits until sshd listens again: a connection right after a bare `systemctl
    # reload ssh` is refused now and then (sshd closes its sockets and re-executes itself).
    lab.ssh(PORT_HOST, f"printf 'Port 22\\nPort {PORT}\\n' > /etc/ssh/sshd_config.d/10-test.conf"
            f" && sshd -t && {{ {reload_sshd_command()}; }}")  # fmt: skip
    known = Path(lab.loaded.cluster.ssh.known_hosts).read_text().splitlines()
    address = lab.address(PORT_HOST)
    entry = next(line for line in known if line.split()[0] == address)
    port_known = tmp_path / "known_hosts"
    port_known.write_text(f"[{address}]:{PORT} {' '.join(entry.split()[1:])}\n")
    # The test's own listener on 22 while sshd moves: a file of the site's, declared as such
    # (else drift names it as overriding gpuinfra's Port, and the apply stops there).
    scaffold = ("/etc/ssh/sshd_config.d/10-test.conf",)
    inventory = write_inventory(
        lab, tmp_path / "port", scaffold, port=PORT, known_hosts=str(port_known)
    )
    settings = SSHSettings.from_cluster(load(inventory))
    assert run_ssh(settings.argv(address)).stdout.strip() == PORT_HOST

    applied = gpuinfra("apply", str(inventory), "--roles", "base,firewall", "--limit", PORT_HOST,
                       "--yes", "--format", "json")  # fmt: skip
    assert applied.returncode == ExitCode.OK, applied.stdout[-3000:] + applied.stderr[-2000:]
    # The test's own listener on 22 goes: only gpuinfra's drop-in says where sshd listens.
    removed = run_ssh(settings.argv(address), "rm /etc/ssh/sshd_config.d/10-test.conf && "
                      f"sshd -t && {{ {reload_sshd_command()}; }}")  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    listening = run_ssh(settings.argv(address), "ss -Htln")
    assert f":{PORT} " in listening.stdout and ":22 " not in listening.stdout, listening.stdout
    table = run_ssh(settings.argv(address), "nft list table inet gpuinfra").stdout
    assert "policy drop;" in table and f"tcp dport {PORT}" in table, table

    drift = gpuinfra("drift", str(inventory), "--roles", "base,firewall", "--limit", PORT_HOST)
    assert drift.returncode == ExitCode.OK, drift.stdout[-3000:] + drift.stderr[-2000:]
    assert run_ssh(settings.argv(address)).stdout.strip() == PORT_HOST
