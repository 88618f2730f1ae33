"""The engine on the lab: apply converges, plan then shows nothing, drift catches hand edits."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from cli.exitcodes import ExitCode
from tests.helpers import GPUINFRA
from tests.helpers import gpuinfra as run_gpuinfra

MANAGED = ["/etc/hosts", "/etc/hostname", "/etc/ssh/sshd_config.d/50-gpuinfra.conf"]

pytestmark = pytest.mark.integration


# The base role alone: a command that takes longer than this is stuck, not slow.
gpuinfra = functools.partial(run_gpuinfra, timeout=600)


def test_plan_after_apply_has_no_changes(converged):
    result = gpuinfra("plan", str(converged.inventory_path), "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    report = json.loads(result.stdout)
    pending = {
        name: [op["name"] for op in host["operations"] if op["changed"]]
        for name, host in report["hosts"].items()
    }
    assert all(not ops for ops in pending.values()), pending
    assert len(report["hosts"]) == len(converged.hosts)


def test_gpu_1_data_disk_is_formatted_and_mounted_by_uuid(converged):
    """The default lab's gpu-1 data disk (data_disks, one disk: no md in the lab's kernel)."""
    fstype, options = converged.ssh("gpu-1", "findmnt -rn -o FSTYPE,OPTIONS /data").stdout.split()
    assert fstype == "xfs" and {"rw", "noatime"} <= set(options.split(","))
    uuid = converged.ssh("gpu-1", "blkid -s UUID -o value /dev/vdb").stdout.strip()
    fstab = converged.ssh("gpu-1", "awk '$2 == \"/data\"' /etc/fstab").stdout.split()
    assert fstab[:4] == [f"UUID={uuid}", "/data", "xfs", "noatime,nofail"]


def checksums(lab, host: str) -> str:
    return lab.ssh(host, "sha256sum " + " ".join(MANAGED)).stdout


def test_drift_reports_a_hand_edit_and_changes_nothing(converged, tmp_path):
    lab = converged
    host = "cpu-1" if "cpu-1" in lab.hosts else lab.hosts[-1]
    lab.ssh(host, "echo '10.9.9.9 rogue' >> /etc/hosts")
    before = {h: checksums(lab, h) for h in lab.hosts}
    report_path, junit_path = tmp_path / "drift.json", tmp_path / "drift.xml"
    result = gpuinfra(
        "drift", str(lab.inventory_path), "--report", str(report_path), "--junit", str(junit_path)
    )
    after = {h: checksums(lab, h) for h in lab.hosts}
    assert before == after, "drift changed a managed file"
    assert result.returncode == ExitCode.DRIFT, result.stdout[-3000:]

    report = json.loads(report_path.read_text())
    drifted = {name for name, h in report["hosts"].items() if h["status"] == "drift"}
    assert drifted == {host}
    diffs = [op["diff"] for op in report["hosts"][host]["operations"] if op["changed"]]
    assert any("-10.9.9.9 rogue" in (d or "") for d in diffs)

    cases = ET.parse(junit_path).getroot().findall("testcase")
    failing = [(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None]
    assert failing == [(host, "base")]
    assert "10.9.9.9 rogue" in next(
        c.find("failure").text for c in cases if c.get("classname") == host
    )

    fixed = gpuinfra("apply", str(lab.inventory_path), "--limit", host, "--yes")
    assert fixed.returncode == ExitCode.OK, fixed.stdout[-2000:]
    assert "rogue" not in lab.ssh(host, "cat /etc/hosts").stdout


def test_drift_reports_a_renamed_running_host_and_apply_names_it_back(converged, tmp_path):
    """The running host name (the base role's live_hostname, read from /proc by the NodeName
    fact): a host renamed by hand is drift, whatever its /etc/hostname says, and the next apply
    names it back. The other hosts stay ok: the control."""
    lab = converged
    host = "cpu-1" if "cpu-1" in lab.hosts else lab.hosts[-1]
    lab.ssh(host, "hostname renamed-by-hand")
    try:
        report_path = tmp_path / "drift.json"
        result = gpuinfra("drift", str(lab.inventory_path), "--report", str(report_path))
        assert result.returncode == ExitCode.DRIFT, result.stdout[-3000:]
        report = json.loads(report_path.read_text())
        changed = [op["name"] for op in report["hosts"][host]["operations"] if op["changed"]]
        assert changed and all("hostname" in name.lower() for name in changed), changed
        assert {h["status"] for n, h in report["hosts"].items() if n != host} == {"ok"}
        fixed = gpuinfra("apply", str(lab.inventory_path), "--limit", host, "--yes")
        assert fixed.returncode == ExitCode.OK, fixed.stdout[-2000:]
        assert lab.ssh(host, "uname -n").stdout.strip() == host
    finally:
        lab.ssh(host, f"hostname {host}")


def test_drift_with_a_stopped_host_reports_it_and_checks_the_others(converged, tmp_path):
    lab = converged
    # A worker: without it every other host still serves (a storage host down leaves the others
    # rightly reporting the cluster short of HEALTH_OK), and its restart remounts a data disk.
    host = "gpu-1" if "gpu-1" in lab.hosts else lab.hosts[-1]
    down = subprocess.run(
        [GPUINFRA, "lab", "stop", host, "--name", lab.name], capture_output=True, text=True
    )
    assert down.returncode == 0, down.stderr
    try:
        report_path = tmp_path / "drift.json"
        result = gpuinfra("drift", str(lab.inventory_path), "--report", str(report_path))
        assert result.returncode == ExitCode.UNREACHABLE, result.stdout[-2000:]
        report = json.loads(report_path.read_text())
        assert report["hosts"][host]["status"] == "unreachable"
        others = {h["status"] for name, h in report["hosts"].items() if name != host}
        assert others == {"ok"}
    finally:
        subprocess.run([GPUINFRA, "lab", "start", host, "--name", lab.name], check=True)


def test_a_changed_host_key_is_refused(converged, tmp_path):
    """A known_hosts file naming another key for one host: that host is refused, not trusted;
    two hosts beside it, checked through the same file, are the control. (The changed
    inventory makes this the exact check, host by host: the whole lab took 465 s here.)"""
    lab = converged
    victim, *controls = lab.hosts[:3]
    data = yaml.safe_load(lab.inventory_path.read_text())
    known = Path(data["ssh"]["known_hosts"]).read_text().splitlines()
    other = next(line for line in known if not line.startswith(lab.address(victim) + " "))
    forged = [line for line in known if not line.startswith(lab.address(victim) + " ")]
    forged.append(lab.address(victim) + " " + other.split(" ", 1)[1])
    (tmp_path / "known_hosts").write_text("\n".join(forged) + "\n")
    data["ssh"]["known_hosts"] = str(tmp_path / "known_hosts")
    (tmp_path / "cluster.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    # The cluster's state (TSIG key, zone serials) lives beside its inventory: bring it along.
    shutil.copytree(lab.loaded.state_dir, tmp_path / ".state")
    limit = ",".join([victim, *controls])
    result = gpuinfra("drift", str(tmp_path), "--limit", limit, "--format", "json")
    assert result.returncode == ExitCode.UNREACHABLE
    report = json.loads(result.stdout)
    assert sorted(report["hosts"]) == sorted([victim, *controls])
    assert report["hosts"][victim]["status"] == "unreachable"
    assert "host key" in report["hosts"][victim]["error"].lower()
    others = {
        n: [op["name"] for op in h["operations"] if op["changed"]] or h["status"]
        for n, h in report["hosts"].items()
        if n != victim and h["status"] != "ok"
    }
    assert others == {}


def test_a_config_its_validator_rejects_never_goes_live(converged, tmp_path):
    """A host var that makes the sshd drop-in invalid: `sshd -t` refuses the staged file, the
    host's run fails, and the live drop-in is exactly what it was (no half-applied config)."""
    lab = converged
    host = lab.hosts[1]
    dropin = "/etc/ssh/sshd_config.d/50-gpuinfra.conf"
    staged = "/etc/ssh/sshd_config.d/.50-gpuinfra.conf.gpuinfra-new"
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["hosts"][host].setdefault("vars", {})["base"] = {"ssh_permit_root_login": "sometimes"}
    (tmp_path / "cluster.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    # The cluster's state goes with it: apply refuses a checkout without the etcd CA it runs on.
    shutil.copytree(lab.loaded.state_dir, tmp_path / ".state")
    before = lab.ssh(host, f"sha256sum {dropin}").stdout

    result = gpuinfra("apply", str(tmp_path), "--limit", host, "--yes", "--format", "json")
    assert result.returncode == ExitCode.ERROR, result.stdout[-2000:]
    report = json.loads(result.stdout)
    assert report["hosts"][host]["status"] == "failed"
    assert dropin in report["hosts"][host]["error"] or "sshd" in report["hosts"][host]["error"]
    assert lab.ssh(host, f"sha256sum {dropin}").stdout == before
    assert lab.ssh(host, f"test -e {staged}", check=False).returncode == 1
    assert lab.ssh(host, "sshd -t", check=False).returncode == 0


def test_drift_shards_split_the_hosts_and_together_check_all(converged, tmp_path):
    lab = converged
    seen: list[str] = []
    for index in range(3):
        result = gpuinfra(
            "drift", str(lab.inventory_path), "--shard", f"{index}/3", "--format", "json"
        )
        assert result.returncode == ExitCode.OK, result.stdout[-2000:]
        report = json.loads(result.stdout)
        assert {h["status"] for h in report["hosts"].values()} == {"ok"}
        assert f"shard {index}/3" in " ".join(report["notes"])
        seen += list(report["hosts"])
    assert sorted(seen) == sorted(lab.hosts)


def test_a_restart_systemd_refuses_fails_with_the_units_journal_and_is_not_retried(lab):
    """`restart_if_running`'s command against the host's real systemd: a running unit restarts
    (a new main process); a unit whose new configuration cannot start fails the command with
    the journal's reason, and only systemd's transient `resources` result would start it again
    (exit-code here: one start, not two). The failing restart runs with journald held back for
    a second, as on a busy host: the line that says why comes from systemd's executor, gone
    before journald reads it, and `journalctl -u` left it out (CI once)."""
    from toolkit.operations import restart_command

    host, unit = lab.hosts[0], "gpuinfra-restart-probe"
    path = f"/etc/systemd/system/{unit}.service"

    def write_unit(exec_start: str) -> None:
        text = f"[Service]\\nType=exec\\nExecStart={exec_start}\\n"
        lab.ssh(host, f"printf '{text}' > {path} && systemctl daemon-reload")

    def main_pid() -> str:
        return lab.ssh(host, f"systemctl show -p MainPID --value {unit}").stdout.strip()

    since = lab.ssh(host, "date +%s").stdout.strip()
    write_unit("/bin/sleep infinity")
    try:
        lab.ssh(host, f"systemctl start {unit}")
        before = main_pid()
        assert lab.ssh(host, f"( {restart_command(unit)} )", check=False).returncode == 0
        assert main_pid() not in ("0", before)

        write_unit("/nonexistent/daemon")
        held = "j=$(pidof systemd-journald); kill -STOP $j; (sleep 1; kill -CONT $j) &"
        failed = lab.ssh(host, f"{held} ( {restart_command(unit)} )", check=False)
        assert failed.returncode == 1
        assert "/nonexistent/daemon" in failed.stderr  # the journal's own words
        result = lab.ssh(host, f"systemctl show -p Result --value {unit}").stdout.strip()
        assert result == "exit-code"
        starts = lab.ssh(
            host, f"journalctl -u {unit} --since @{since} -o cat | grep -c '^Starting'"
        ).stdout
        assert int(starts) == 3  # start, good restart, refused restart: no second try
    finally:
        lab.ssh(host, f"systemctl stop {unit}; rm -f {path}; systemctl daemon-reload", check=False)
        lab.ssh(host, f"systemctl reset-failed {unit}", check=False)
