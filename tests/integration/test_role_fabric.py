"""The fabric role on the default lab's gpu-1 (a declared stand-in for the reference server's
two HDR ports): what can run here runs for real. Debian's rdma-core, ibverbs-utils,
infiniband-diags and perftest at their pins; the locked-memory limit given to containerd's unit
and asked for SSH sessions; /etc/nccl.conf, the networkd files and the fabric rule in the live
nftables table; a second plan changes nothing; verify passes (its port checks skip, saying the
host is a stand-in); drift exits 3 when nccl.conf is edited and perftest removed by hand, and an
apply restores both.

Not here: any RDMA device (the lab kernel has no RDMA and no soft-RoCE), so no port is Active,
no IPoIB address comes up, ibstat has nothing to report and ib_write_bw cannot run."""

from __future__ import annotations

import json

import pytest
import yaml

from cli.exitcodes import ExitCode
from roles.fabric.config import PACKAGES
from tests.integration.roles_helpers import apply_roles, gpuinfra, pending

pytestmark = pytest.mark.integration

HOST = "gpu-1"
ROLES = "base,container_runtime,fabric,firewall"
UNIT_LIMIT = "systemctl show -p LimitMEMLOCK --value containerd"
# A locked-memory size no other role asks for (the kernel role, converged on this host too,
# asks for unlimited): where it shows up, the fabric role put it there.
TRIAL_KIB = 65536


@pytest.fixture(scope="module")
def applied(lab):
    """The shared lab is converged already; this apply's report carries the role's notes."""
    return lab, apply_roles(lab.inventory_path, ROLES)


def test_packages_are_debians_at_their_pins(applied):
    lab, _ = applied
    for package, version in PACKAGES["debian-13"].items():
        found = lab.ssh(HOST, f"dpkg-query -W -f='${{Version}}' {package}").stdout
        assert found == version, package
    # The tools run (with no device they say so): installed, not only unpacked.
    assert "ib_write_bw" in lab.ssh(HOST, "ib_write_bw --help", check=False).stdout


def test_locked_memory_is_asked_for_sessions_and_containerd(applied):
    """The role's value reaches containerd's unit and a new SSH session's request, and the
    default comes back with the next apply. The lab's root lacks CAP_SYS_RESOURCE (LAB.md) and
    cannot raise its hard limit past the machine's 8 MiB, so on the session side what PAM asked
    for is the proof here; verify measures the effective value where root may raise it."""
    lab, _ = applied
    path = lab.inventory_path
    original = path.read_text()
    data = yaml.safe_load(original)
    data["hosts"][HOST]["vars"]["fabric"]["memlock"] = str(TRIAL_KIB)
    try:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        apply_roles(path, "fabric", "--limit", HOST)
        assert lab.ssh(HOST, UNIT_LIMIT).stdout.strip() == str(TRIAL_KIB * 1024)
        since = lab.ssh(HOST, "date +%s").stdout.strip()
        session = lab.ssh(HOST, "ulimit -l").stdout.strip()
        if session != str(TRIAL_KIB):  # the kernel refused what PAM read from the role's file
            # --sync: journald has taken in what the ended session's process sent.
            journal = lab.ssh(HOST, f"journalctl --sync; journalctl --since @{since} -q").stdout
            # pam_limits logs the value in KiB or bytes depending on its version.
            asked = {f"soft={n}, hard={n}" for n in (TRIAL_KIB, TRIAL_KIB * 1024)}
            refused = [line for line in journal.splitlines() if "limit for 'memlock'" in line]
            assert any(a in line for a in asked for line in refused), journal[-2000:]
    finally:
        path.write_text(original)
        apply_roles(path, "fabric", "--limit", HOST)
    assert lab.ssh(HOST, UNIT_LIMIT).stdout.strip() == "infinity"


def test_nccl_conf_networkd_files_and_the_firewall_rule_are_live(applied):
    lab, _ = applied
    nccl = lab.ssh(HOST, "cat /etc/nccl.conf").stdout
    assert "\nNCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n" in nccl and "\nNCCL_SOCKET_IFNAME==ib0\n" in nccl
    ib1 = lab.ssh(HOST, "cat /etc/systemd/network/60-gpuinfra-fabric1.network").stdout
    address = lab.loaded.settings[HOST]["fabric"].ports[1].address
    assert f"Address={address}" in ib1
    table = lab.ssh(HOST, "nft list table inet gpuinfra").stdout
    rule = next(line for line in table.splitlines() if "fabric peers" in line)
    assert str(lab.loaded.settings[HOST]["fabric"].ports[0].address.ip) in rule


def test_the_missing_ports_are_a_note_not_a_failure(applied):
    _, report = applied
    notes = report["hosts"][HOST]["notes"]
    assert any("mlx5_0 port 1, mlx5_1 port 1 not found" in n and "stand-in" in n for n in notes)


def test_plan_after_apply_has_no_changes(applied):
    lab, _ = applied
    result = gpuinfra("plan", str(lab.inventory_path), "--roles", ROLES, "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    assert pending(json.loads(result.stdout)) == {}


def test_verify_passes_and_skips_the_ports_saying_why(applied):
    lab, _ = applied
    result = gpuinfra("verify", str(lab.inventory_path), "--roles", "fabric", "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    text = result.stdout
    assert "test_session_memlock" in text and "stand-in host" in text


def test_drift_sees_a_hand_edit_and_a_removed_package_then_apply_restores(applied, tmp_path):
    lab, _ = applied
    try:
        lab.ssh(HOST, "echo NCCL_IB_HCA=mlx5_9 >> /etc/nccl.conf")
        lab.ssh(HOST, "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q perftest")
        path = tmp_path / "drift.json"
        result = gpuinfra("drift", str(lab.inventory_path), "--roles", "fabric",
                          "--report", str(path))  # fmt: skip
        assert result.returncode == ExitCode.DRIFT, result.stdout[-3000:]
        assert pending(json.loads(path.read_text())) == {
            HOST: [
                "Fabric | Install the RDMA stack and diagnostics",
                "Fabric | Write /etc/nccl.conf",
            ]
        }
    finally:
        apply_roles(lab.inventory_path, "fabric")
    assert "mlx5_9" not in lab.ssh(HOST, "cat /etc/nccl.conf").stdout
    again = gpuinfra("drift", str(lab.inventory_path), "--roles", "fabric")
    assert again.returncode == ExitCode.OK, again.stdout[-2000:]
