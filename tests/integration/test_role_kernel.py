"""The kernel and container_runtime roles on lab hosts: apply, a second plan with no changes,
then what the hosts really do (sysctls, modules, swap, limits, Docker and containerd), and a
real reboot of a host whose kernel command line changed.

Lab hosts are containers: global sysctls, modules and GRUB cannot change there, so those are
checked as persisted files plus a note in the run report (the behaviour a container gets)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from cli.exitcodes import ExitCode
from tests.helpers import gpuinfra

ROLES = "base,kernel,container_runtime"
KUBERNETES_NODES = ("cp-1", "cpu-1", "gpu-1")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def applied(lab):
    """The lab after base, kernel and container_runtime were applied, with the run report."""
    result = gpuinfra("apply", str(lab.inventory_path), "--roles", ROLES, "--yes", "-f", "json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert {h["status"] for h in report["hosts"].values()} <= {"changed", "ok"}
    return lab, report


def test_second_plan_has_no_changes(applied):
    lab, _ = applied
    result = gpuinfra("plan", str(lab.inventory_path), "--roles", ROLES, "-f", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    report = json.loads(result.stdout)
    pending = {
        name: [op["name"] for op in host["operations"] if op["changed"]]
        for name, host in report["hosts"].items()
    }
    assert all(not ops for ops in pending.values()), pending


def test_network_sysctls_are_live_and_global_ones_persisted_and_reported(applied):
    lab, report = applied
    for host in ("etcd-1", "cpu-1"):
        live = lab.ssh(host, "sysctl -n net.core.somaxconn net.ipv4.ip_forward").stdout.split()
        assert live == ["32768", "1"]
        persisted = lab.ssh(host, "cat /etc/sysctl.d/90-gpuinfra.conf").stdout
        assert "net.ipv4.neigh.default.gc_thresh3 = 100000" in persisted
        assert "vm.swappiness = 0" in persisted
        swappiness = lab.ssh(host, "sysctl -n vm.swappiness").stdout.strip()
        notes = report["hosts"][host]["notes"]
        if swappiness != "0":  # read-only in the container: said in the report, not failed
            assert any(n.startswith("vm.swappiness: read-only here") for n in notes), notes


def test_modules_file_lists_nvidia_peermem_on_gpu_workers_only(applied):
    lab, report = applied
    gpu = lab.ssh("gpu-1", "cat /etc/modules-load.d/gpuinfra.conf").stdout.split()
    cpu = lab.ssh("cpu-1", "cat /etc/modules-load.d/gpuinfra.conf").stdout.split()
    assert {"overlay", "br_netfilter", "nvidia-peermem"} <= set(gpu)
    assert "nvidia-peermem" not in cpu
    assert any("module nvidia-peermem" in n for n in report["hosts"]["gpu-1"]["notes"])


def test_swap_is_off_and_limits_are_raised(applied):
    lab, _ = applied
    for host in ("etcd-1", "gpu-1"):
        assert lab.ssh(host, "swapon --show --noheadings").stdout.strip() == ""
        limits = lab.ssh(host, "systemctl show -p DefaultLimitNOFILE -p DefaultLimitMEMLOCK")
        assert set(limits.stdout.split()) == {
            "DefaultLimitNOFILE=1048576",
            "DefaultLimitMEMLOCK=infinity",
        }
        assert (
            "root hard memlock unlimited"
            in lab.ssh(host, "cat /etc/security/limits.d/90-gpuinfra.conf").stdout
        )
        enabled = lab.ssh(host, "systemctl is-enabled gpuinfra-thp gpuinfra-cpu-governor")
        assert enabled.stdout.split() == ["enabled", "enabled"]


def test_report_says_which_hosts_wait_for_a_reboot(applied):
    lab, report = applied
    for host in ("etcd-1", "cpu-1"):
        flagged = lab.ssh(host, "test -e /run/reboot-required", check=False).returncode == 0
        assert report["hosts"][host]["reboot_required"] is flagged


@pytest.mark.parametrize("host", KUBERNETES_NODES)
def test_docker_and_containerd_run_with_systemd_cgroups(applied, host):
    lab, _ = applied
    assert lab.ssh(host, "systemctl is-active docker containerd").stdout.split() == [
        "active",
        "active",
    ]
    info = json.loads(lab.ssh(host, "docker info --format '{{json .}}'").stdout)
    assert info["CgroupDriver"] == "systemd"
    assert info["LiveRestoreEnabled"] is True
    assert info["LoggingDriver"] == "json-file"
    lab.ssh(host, "test -S /run/containerd/containerd.sock && ctr version")
    dump = lab.ssh(host, "containerd config dump").stdout
    assert "SystemdCgroup = true" in dump
    assert 'sandbox_image = "registry.k8s.io/pause:3.10.1"' in dump


def test_hosts_outside_kubernetes_get_no_runtime(applied):
    lab, _ = applied
    assert lab.ssh("etcd-1", "test -e /etc/docker/daemon.json", check=False).returncode != 0


def host_var_inventory(lab, tmp_path: Path, host: str, role: str, settings: dict) -> Path:
    """The lab's inventory with one host's settings changed, beside a copy of its controller
    state: an apply from a folder without the cluster's .state/ is refused (etcd's CA)."""
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["hosts"][host]["vars"] = {role: settings}
    path = tmp_path / "cluster.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    state = lab.inventory_path.parent / ".state"
    if state.is_dir() and not (tmp_path / ".state").exists():
        shutil.copytree(state, tmp_path / ".state", ignore=shutil.ignore_patterns("*.lock"))
    return path


def test_a_mirror_dockerd_would_choke_on_is_refused_before_anything_changes(applied, tmp_path):
    """`dockerd --validate` passes a bad mirror URL (then dockerd fails to start; seen on this
    lab), so the inventory refuses it: exit 2, no host touched."""
    lab, _ = applied
    host = "cpu-1"
    before = lab.ssh(host, "sha256sum /etc/docker/daemon.json").stdout
    broken = host_var_inventory(
        lab, tmp_path, host, "container_runtime", {"registry_mirrors": {"docker.io": ["::bad"]}}
    )
    result = gpuinfra("apply", str(broken), "--roles", "container_runtime", "--yes")
    assert result.returncode == ExitCode.BAD_INPUT, result.stdout[-2000:] + result.stderr
    assert "registry_mirrors" in result.stderr
    assert lab.ssh(host, "sha256sum /etc/docker/daemon.json").stdout == before
    assert lab.ssh(host, "systemctl is-active docker").stdout.strip() == "active"


def test_apply_reboot_reboots_a_host_whose_command_line_changed(applied, tmp_path):
    lab, _ = applied
    host = "cpu-1"
    changed = host_var_inventory(
        lab, tmp_path, host, "kernel", {"grub_cmdline": ["iommu=pt", "gpuinfra.itest=1"]}
    )
    lab.ssh(host, "rm -f /run/reboot-required /run/reboot-required.pkgs")
    lab.ssh(host, "touch /run/itest-before-reboot")
    try:
        result = gpuinfra(
            "apply", str(changed), "--roles", "kernel", "--limit", host, "--reboot", "--yes",
            "-f", "json",
        )  # fmt: skip
        assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
        report = json.loads(result.stdout)
        assert report["hosts"][host]["reboot_required"] is False
        assert any(note.startswith(f"{host}: rebooted") for note in report["notes"])
        # /run is a fresh tmpfs after a boot: the marker left before is gone.
        assert lab.ssh(host, "test -e /run/itest-before-reboot", check=False).returncode != 0
        assert lab.ssh(host, "test -e /run/reboot-required", check=False).returncode != 0
        state = lab.ssh(host, "systemctl is-system-running", check=False).stdout.strip()
        assert state in ("running", "degraded")
        grub = lab.ssh(host, "cat /etc/default/grub.d/90-gpuinfra.cfg").stdout
        assert "gpuinfra.itest=1" in grub
    finally:
        restore = gpuinfra(
            "apply", str(lab.inventory_path), "--roles", "kernel", "--limit", host, "--reboot",
            "--yes",
        )  # fmt: skip
        assert restore.returncode == ExitCode.OK, restore.stdout[-2000:]
