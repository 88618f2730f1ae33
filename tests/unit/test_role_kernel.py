"""The kernel role offline: rendered files, settings merged per group and host, and its
operations run against fake facts (a fake host object stands in for pyinfra's)."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from engine.context import load
from roles.kernel import operations as kernel_ops
from roles.kernel.config import DEFAULT_SYSCTLS, KernelConfig
from roles.kernel.facts import (
    ActiveSwap,
    KernelModules,
    PackageVersion,
    SwapInFstab,
    SysctlState,
    SysfsValues,
    chosen_value,
    is_swap_entry,
    swaps_command,
    sysctl_path,
)
from tests.helpers import files_of as shared_files_of
from tests.unit.conftest import SAMPLE
from toolkit import record
from toolkit.facts import (
    REBOOT_FLAGS,
    Container,
    RebootReasons,
    RebootRequired,
    reboot_required_command,
)

runner = CliRunner()
FABRIC_PORT = {"device": "mlx5_0", "interface": "ib0", "address": "10.1.0.61/24"}


files_of = functools.partial(shared_files_of, role="kernel")


def sysctl_lines(text: str) -> dict[str, str]:
    pairs = [line.split(" = ", 1) for line in text.splitlines() if " = " in line]
    return {name: value for name, value in pairs if not name.startswith("#")}


def test_sample_hosts_get_openai_arp_thresholds_and_every_default():
    sysctls = sysctl_lines(files_of(load(SAMPLE), "etcd-1")["/etc/sysctl.d/90-gpuinfra.conf"])
    assert sysctls["net.ipv4.neigh.default.gc_thresh1"] == "80000"
    assert sysctls["net.ipv4.neigh.default.gc_thresh2"] == "90000"
    assert sysctls["net.ipv4.neigh.default.gc_thresh3"] == "100000"
    assert sysctls == {name: value for name, (value, _) in DEFAULT_SYSCTLS.items()}


def test_every_default_sysctl_says_why():
    assert all(why.strip() for _, why in DEFAULT_SYSCTLS.values())


def test_sysctls_merge_over_defaults_per_group_and_host(small_cluster, load_small):
    small_cluster["group_vars"] = {
        "all": {"kernel": {"sysctls": {"net.core.somaxconn": 4096, "vm.swappiness": None}}},
    }
    small_cluster["hosts"]["cpu-1"]["vars"] = {"kernel": {"sysctls": {"vm.max_map_count": 1}}}
    loaded = load_small()
    etcd = sysctl_lines(files_of(loaded, "etcd-1")["/etc/sysctl.d/90-gpuinfra.conf"])
    assert etcd["net.core.somaxconn"] == "4096"
    assert "vm.swappiness" not in etcd
    assert etcd["net.ipv4.ip_forward"] == "1"  # the defaults stay
    cpu = sysctl_lines(files_of(loaded, "cpu-1")["/etc/sysctl.d/90-gpuinfra.conf"])
    assert cpu["vm.max_map_count"] == "1"


def test_nvidia_peermem_loads_on_gpu_workers_only(small_cluster, load_small):
    # The fabric settings decide GPUDirect RDMA (tests/unit/test_role_fabric.py has the cases
    # without ports and with it switched off): ports on gpu-1 want it, and cpu-1 never gets it.
    small_cluster["hosts"]["gpu-1"]["vars"] = {"fabric": {"ports": [FABRIC_PORT]}}
    small_cluster["hosts"]["cpu-1"]["vars"] = {"fabric": {"gpudirect_rdma": True}}
    loaded = load_small()
    gpu = files_of(loaded, "gpu-1")["/etc/modules-load.d/gpuinfra.conf"].splitlines()
    cpu = files_of(loaded, "cpu-1")["/etc/modules-load.d/gpuinfra.conf"].splitlines()
    assert {"overlay", "br_netfilter", "nvidia-peermem"} <= set(gpu)
    assert {"overlay", "br_netfilter"} <= set(cpu)
    assert "nvidia-peermem" not in cpu


def test_grub_drop_in_appends_the_configured_arguments(small_cluster, load_small):
    small_cluster["hosts"]["cpu-1"]["vars"] = {
        "kernel": {"grub_cmdline": ["iommu=pt", "pci=realloc=off"]}
    }
    loaded = load_small()
    grub = files_of(loaded, "cpu-1")["/etc/default/grub.d/90-gpuinfra.cfg"]
    assert (
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt pci=realloc=off"' in grub
    )
    default = files_of(loaded, "etcd-1")["/etc/default/grub.d/90-gpuinfra.cfg"]
    assert '$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"' in default


def test_limits_for_sessions_and_systemd_services(loaded):
    files = files_of(loaded, "cpu-1")
    limits = files["/etc/security/limits.d/90-gpuinfra.conf"]
    for who in ("*", "root"):
        assert f"{who} hard memlock unlimited" in limits
        assert f"{who} soft nofile 1048576" in limits
    systemd = files["/etc/systemd/system.conf.d/90-gpuinfra.conf"]
    assert "DefaultLimitMEMLOCK=infinity" in systemd
    assert "DefaultLimitNOFILE=1048576" in systemd


def test_boot_units_carry_the_configured_governor_and_thp(small_cluster, load_small):
    small_cluster["group_vars"] = {"all": {"kernel": {"transparent_hugepages": "never"}}}
    files = files_of(load_small(), "cpu-1")
    thp = files["/etc/systemd/system/gpuinfra-thp.service"]
    assert "echo never > /sys/kernel/mm/transparent_hugepage/enabled" in thp
    assert "ConditionPathIsReadWrite=" in thp  # skipped, not failed, in a container
    governor = files["/etc/systemd/system/gpuinfra-cpu-governor.service"]
    assert "echo performance >" in governor


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ({"sysctl": {}}, "group_vars.all.kernel.sysctl: unknown key"),
        ({"transparent_hugepages": "sometimes"}, "group_vars.all.kernel.transparent_hugepages"),
    ],
)
def test_bad_kernel_settings_name_the_key(small_cluster, write_cluster, setting, key):
    small_cluster["group_vars"] = {"all": {"kernel": setting}}
    result = runner.invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert key in result.stderr


# Facts: how each reads its command's output.


def test_sysctl_state_reads_access_and_folds_whitespace():
    """The command run by this machine's sh on its own /proc/sys: several words (the port
    range's tab), a key no module provides, and what Python reads from the same files."""
    names = ["net.ipv4.ip_local_port_range", "kernel.printk", "vm.swappiness", "no.such.key"]
    done = subprocess.run(
        ["sh", "-c", SysctlState().command(names)], capture_output=True, text=True, check=True
    )
    state = SysctlState().process(done.stdout.splitlines())
    expected = {"no.such.key": ("absent", "")}
    for name in names[:3]:
        path = Path(sysctl_path(name))
        access = "rw" if os.access(path, os.W_OK) else "ro"
        expected[name] = (access, " ".join(path.read_text().split()))
    assert state == expected
    assert len(state["net.ipv4.ip_local_port_range"][1].split(" ")) == 2
    assert SysctlState().command([]) == "true"


def test_module_and_swap_facts():
    assert KernelModules().process(["overlay loaded", "nvidia-peermem missing"]) == {
        "overlay": "loaded",
        "nvidia-peermem": "missing",
    }
    assert "/sys/module/nvidia_peermem" in KernelModules().command(["nvidia-peermem"])
    assert ActiveSwap().process(["/dev/sda2", ""]) == ["/dev/sda2"]
    fstab = ["UUID=1 / ext4 defaults 0 1", "/swap.img none swap sw 0 0", "#/dev/x none swap sw"]
    assert SwapInFstab().process(fstab) == ["/swap.img none swap sw 0 0"]
    assert not is_swap_entry("# /swapfile none swap sw 0 0")


def test_active_swap_reads_the_first_field_with_this_machines_sh(tmp_path):
    """The builtins-only command against the two processes it replaced (`sed 1d | cut`), both
    run by this machine's sh on a /proc/swaps-shaped file: the kernel's padding and tabs, a
    name with an escaped space (dash's echo would turn `\\040` into a space) and a backslash."""
    swaps = tmp_path / "swaps"
    swaps.write_text(
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        "/dev/sda2                               partition\t2097148\t\t0\t\t-2\n"
        "/swap\\040file.img                        file\t\t1048572\t\t0\t\t-3\n"
        "/var/a\\134b                             file\t\t1024\t\t0\t\t-4\n"
    )

    def run(command: str) -> str:
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout

    found = run(swaps_command(str(swaps)))
    assert found == run(f"sed 1d {swaps} | cut -d' ' -f1")
    assert ActiveSwap().process(found.splitlines()) == [
        "/dev/sda2",
        "/swap\\040file.img",
        "/var/a\\134b",
    ]
    missing = subprocess.run(["sh", "-c", swaps_command(str(tmp_path / "none"))], text=True)
    assert missing.returncode == 0  # a kernel without swap support: no swap, not a failure


def test_sysfs_values_read_the_bracketed_choice():
    assert chosen_value("always [madvise] never") == "madvise"
    assert chosen_value("performance") == "performance"


def test_sysfs_values_read_every_matching_file_with_this_machines_sh(tmp_path):
    """The command run by this machine's sh on files shaped like sysfs ones (a ":" in a path,
    a bracketed choice, an empty file, a glob matching nothing), against Python's reading."""
    files = {
        "cpu0/governor": "performance\n",
        "0000:00:01.0/governor": "always [madvise] never\n",
        "cpu2/governor": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True)
        (tmp_path / name).write_text(text)
    pattern = f"{tmp_path}/*/governor"
    done = subprocess.run(
        ["sh", "-c", SysfsValues().command(pattern)], capture_output=True, text=True, check=True
    )
    found = SysfsValues().process(done.stdout.splitlines())
    assert found == {
        str(tmp_path / name): ("rw" if os.access(tmp_path / name, os.W_OK) else "ro", value)
        for name, value in zip(files, ["performance", "madvise", ""], strict=True)
    }
    empty = subprocess.run(
        ["sh", "-c", SysfsValues().command(f"{tmp_path}/none*/x")], capture_output=True, text=True
    )
    assert empty.returncode == 0 and SysfsValues().process(empty.stdout.splitlines()) == {}


def test_package_version_and_hold():
    assert PackageVersion().process(["ii  6.8.0-49.49", "held=linux-image-generic"]) == {
        "version": "6.8.0-49.49",
        "held": True,
    }
    assert PackageVersion().process(["held="]) is None
    assert RebootReasons().process(["linux-image-x", ""]) == ["linux-image-x"]


# Operations against fake facts.


class FakeHost:
    name = "fake-host"

    def __init__(self, facts: dict[type, object]):
        self.facts = facts
        self.noops: list[str] = []

    def get_fact(self, fact, **kwargs):
        return self.facts.get(fact)

    def noop(self, message: str) -> None:
        self.noops.append(message)


@pytest.fixture
def fake_host(monkeypatch):
    def make(facts: dict[type, object]) -> FakeHost:
        fake = FakeHost(facts)
        monkeypatch.setattr(kernel_ops, "host", fake)
        monkeypatch.setattr("toolkit.operations.host", fake)
        return fake

    return make


def run(op, **kwargs) -> list[str]:
    return [str(command) for command in op._inner(**kwargs)]


def test_sysctls_set_what_is_writable_and_report_the_rest(fake_host):
    host = fake_host(
        {
            SysctlState: {
                "net.core.somaxconn": ("rw", "4096"),
                "net.ipv4.ip_forward": ("rw", "1"),
                "vm.swappiness": ("ro", "60"),
                "net.bridge.bridge-nf-call-iptables": ("absent", ""),
            }
        }
    )
    values = {
        "net.core.somaxconn": "32768",
        "net.ipv4.ip_forward": "1",
        "vm.swappiness": "0",
        "net.bridge.bridge-nf-call-iptables": "1",
    }
    commands = run(kernel_ops.sysctls_live, values=values, persisted_in="persisted in F")
    assert commands == ["sysctl -q -w net.core.somaxconn=32768"]
    assert any(n.startswith("vm.swappiness: read-only here (is 60, wants 0)") for n in host.noops)
    assert any(n.startswith("net.bridge.bridge-nf-call-iptables: not here") for n in host.noops)
    assert list(record.host(host.name).notes) == host.noops


def test_modules_load_outside_containers_and_are_reported_inside(fake_host):
    state = {"overlay": "loaded", "br_netfilter": "available", "nvidia-peermem": "missing"}
    modules = list(state)
    fake_host({KernelModules: state, Container: None})
    assert run(kernel_ops.modules_loaded, modules=modules, persisted_in="F") == [
        "modprobe br_netfilter"
    ]
    host = fake_host({KernelModules: state, Container: "systemd-nspawn"})
    assert run(kernel_ops.modules_loaded, modules=modules, persisted_in="F") == []
    assert len(host.noops) == 2


def test_swap_goes_off_once(fake_host):
    fake_host({ActiveSwap: ["/swap.img"], Container: None})
    assert run(kernel_ops.swap_off) == ["swapoff -a"]
    fake_host({ActiveSwap: [], Container: None})
    assert run(kernel_ops.swap_off) == []
    fake_host({SwapInFstab: ["/swap.img none swap sw 0 0"]})
    assert "swap" in run(kernel_ops.swap_out_of_fstab)[0]
    fake_host({SwapInFstab: []})
    assert run(kernel_ops.swap_out_of_fstab) == []


def test_sysfs_setting_writes_differing_files_or_reports_read_only(fake_host):
    pattern = "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"
    gov = "/sys/devices/system/cpu/cpu{}/cpufreq/scaling_governor"
    fake_host(
        {SysfsValues: {gov.format(0): ("rw", "powersave"), gov.format(1): ("rw", "performance")}}
    )
    kwargs = dict(pattern=pattern, value="performance", what="CPU governor", persisted_by="u")
    assert run(kernel_ops.sysfs_setting, **kwargs) == [f"echo performance > {gov.format(0)}"]
    host = fake_host({SysfsValues: {gov.format(0): ("ro", "powersave")}})
    assert run(kernel_ops.sysfs_setting, **kwargs) == []
    assert "read-only" in host.noops[0]
    host = fake_host({SysfsValues: {}})
    assert run(kernel_ops.sysfs_setting, **kwargs) == []
    assert host.noops


def test_pinned_kernel_is_installed_held_and_marks_a_reboot(fake_host):
    fake_host({PackageVersion: None})
    commands = run(kernel_ops.kernel_package_held, package="linux-image-x", version="6.8.0-1")
    assert "linux-image-x=6.8.0-1" in commands[0]
    assert any("/run/reboot-required" in c for c in commands)
    assert any("linux-image-x" in c and "reboot-required.pkgs" in c for c in commands)
    assert commands[-1] == "apt-mark hold linux-image-x"
    fake_host({PackageVersion: {"version": "6.8.0-1", "held": True}})
    assert run(kernel_ops.kernel_package_held, package="linux-image-x", version="6.8.0-1") == []
    fake_host({PackageVersion: {"version": "6.8.0-1", "held": False}})
    assert run(kernel_ops.kernel_package_held, package="linux-image-x", version="6.8.0-1") == [
        "apt-mark hold linux-image-x"
    ]
    assert run(kernel_ops.kernel_package_held, package=None, version=None) == []


def test_reboot_flag_is_written_once_per_reason(fake_host):
    from toolkit import operations

    fake_host({RebootReasons: []})
    commands = run(operations.reboot_required, reason="gpuinfra-kernel-cmdline")
    assert commands[0].endswith("> /run/reboot-required")
    fake_host({RebootReasons: ["gpuinfra-kernel-cmdline"]})
    assert run(operations.reboot_required, reason="gpuinfra-kernel-cmdline") == []


def test_default_config_is_valid_and_frozen():
    cfg = KernelConfig()
    assert cfg.effective_sysctls()["net.ipv4.ip_forward"] == "1"
    with pytest.raises(Exception):  # noqa: B017 (pydantic's frozen error)
        cfg.nofile = 1  # type: ignore[misc]


@pytest.mark.parametrize("present", [(), ("reboot-required",), ("reboot-required.pkgs",)])
def test_reboot_required_is_either_flag_file_with_this_machines_sh(tmp_path, present):
    for name in present:
        (tmp_path / name).touch()
    flags = (str(tmp_path / "reboot-required"), str(tmp_path / "reboot-required.pkgs"))
    done = subprocess.run(["sh", "-c", reboot_required_command(flags)], capture_output=True)
    assert RebootRequired().process(done.stdout.decode().splitlines()) is bool(present)
    assert RebootRequired().command() == reboot_required_command(REBOOT_FLAGS)
