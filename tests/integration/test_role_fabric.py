"""The fabric role on a lab of its own (one Debian 13 GPU worker, a declared stand-in for the
reference server's two HDR ports): what can run here runs for real. Debian's rdma-core,
ibverbs-utils, infiniband-diags and perftest at their pins; the locked-memory limit asked for
SSH sessions and given to containerd's unit (read before and after, so the change is the
role's: the lab's root cannot raise a hard limit, so PAM's refused request is what proves the
session side here); /etc/nccl.conf, the networkd files and the fabric rule in the live nftables
table;
a second plan changes nothing; verify passes (its port checks skip, saying the host is a
stand-in); drift exits 3 when nccl.conf is edited and perftest removed by hand, and an apply
restores both.

Not here: any RDMA device (the lab kernel has no RDMA and no soft-RoCE), so no port is Active,
no IPoIB address comes up, ibstat has nothing to report and ib_write_bw cannot run."""

from __future__ import annotations

import json
import os

import pytest

from cli.exitcodes import ExitCode
from lab import lifecycle
from lab.topology import HostSpec, Topology
from roles.fabric.config import PACKAGES
from tests.integration.conftest import KEEP_ENV, boot_lab
from tests.integration.roles_helpers import apply_roles, gpuinfra, pending

pytestmark = pytest.mark.integration

# Two helpers' sessions on one machine each set their own name.
LAB_NAME = os.environ.get("GPUINFRA_FABRIC_LAB_NAME", "fabric")
HOST = "gpu-1"
RUNTIME = "base,container_runtime"
ROLES = "base,container_runtime,fabric,firewall"
TOPOLOGY = Topology((HostSpec(HOST, ("gpu_worker",), gpu=True),), "fabric")
LOCKED = "grep '^Max locked memory' /proc/$(systemctl show -p MainPID --value containerd)/limits"
UNIT_LIMIT = "systemctl show -p LimitMEMLOCK --value containerd"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("fabric-lab") / "cluster.yml"
    cluster = boot_lab(LAB_NAME, TOPOLOGY, inventory)
    yield cluster
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(LAB_NAME)


@pytest.fixture(scope="module")
def applied(lab):
    """The runtime first, its limits read (the control), then the fabric role and firewall."""
    apply_roles(lab.inventory_path, RUNTIME)
    before = {
        "session": lab.ssh(HOST, "ulimit -l").stdout.strip(),
        "containerd": lab.ssh(HOST, UNIT_LIMIT).stdout.strip(),
    }
    report = apply_roles(lab.inventory_path, ROLES)
    return lab, report, before


def test_packages_are_debians_at_their_pins(applied):
    lab, _, _ = applied
    for package, version in PACKAGES["debian-13"].items():
        found = lab.ssh(HOST, f"dpkg-query -W -f='${{Version}}' {package}").stdout
        assert found == version, package
    # The tools run (with no device they say so): installed, not only unpacked.
    assert "ib_write_bw" in lab.ssh(HOST, "ib_write_bw --help", check=False).stdout


def test_locked_memory_is_asked_for_sessions_and_containerd(applied):
    """The lab's root lacks CAP_SYS_RESOURCE (LAB.md), so no process in a lab host can raise
    its hard memlock limit above the machine's 8 MiB: the effective limit is measured where
    root has the capability (verify), and here what each side was asked and answered."""
    lab, _, before = applied
    # Control: systemd's default for containerd before the role (kernel role not applied).
    assert before["containerd"] != "infinity"
    assert lab.ssh(HOST, UNIT_LIMIT).stdout.strip() == "infinity"
    bounding = lab.ssh(HOST, "grep CapBnd /proc/self/status").stdout.split()[1]
    if int(bounding, 16) >> 24 & 1:  # a machine where root may raise limits: the real value
        assert lab.ssh(HOST, "ulimit -l").stdout.strip() == "unlimited"
        assert lab.ssh(HOST, LOCKED).stdout.split()[3:5] == ["unlimited", "unlimited"]
        return
    # PAM read the role's file and asked for unlimited on this very session; the kernel refused.
    since = lab.ssh(HOST, "date +%s").stdout.strip()
    assert lab.ssh(HOST, "ulimit -l").stdout.strip() == before["session"]
    journal = lab.ssh(HOST, f"journalctl --since @{since} --no-pager -q").stdout
    assert "pam_limits(sshd:session): Could not set limit for 'memlock' to soft=-1, hard=-1" in (
        journal
    )


def test_nccl_conf_networkd_files_and_the_firewall_rule_are_live(applied):
    lab, _, _ = applied
    nccl = lab.ssh(HOST, "cat /etc/nccl.conf").stdout
    assert "\nNCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n" in nccl and "\nNCCL_SOCKET_IFNAME==ib0\n" in nccl
    ib1 = lab.ssh(HOST, "cat /etc/systemd/network/60-gpuinfra-fabric1.network").stdout
    address = lab.loaded.settings[HOST]["fabric"].ports[1].address
    assert f"Address={address}" in ib1
    table = lab.ssh(HOST, "nft list table inet gpuinfra").stdout
    rule = next(line for line in table.splitlines() if "fabric peers" in line)
    assert str(lab.loaded.settings[HOST]["fabric"].ports[0].address.ip) in rule


def test_the_missing_ports_are_a_note_not_a_failure(applied):
    _, report, _ = applied
    notes = report["hosts"][HOST]["notes"]
    assert any("mlx5_0 port 1, mlx5_1 port 1 not found" in n and "stand-in" in n for n in notes)


def test_plan_after_apply_has_no_changes(applied):
    lab, _, _ = applied
    result = gpuinfra("plan", str(lab.inventory_path), "--roles", ROLES, "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    assert pending(json.loads(result.stdout)) == {}


def test_verify_passes_and_skips_the_ports_saying_why(applied):
    lab, _, _ = applied
    result = gpuinfra("verify", str(lab.inventory_path), "--roles", "fabric", "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    text = result.stdout
    assert "test_session_memlock" in text and "stand-in host" in text


def test_drift_sees_a_hand_edit_and_a_removed_package_then_apply_restores(applied, tmp_path):
    lab, _, _ = applied
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
