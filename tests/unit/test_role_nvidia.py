"""The nvidia role without hosts: one test per compatibility rule through `inventory validate`
(exit 2, file:line:key), the package sets per source and OS, the files `render` writes, the
live-fact parsers, and the operations against facts.

Facts come from tests/unit/recordings/nvidia/: `debian13-lab-gpu.json` was captured on a lab
host (Debian 13 container, no GPU); the Ubuntu 22.04/24.04 HGX H100 ones are hand-written
recordings (their `provenance` says so): no GPU machine was lent to this task."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import app
from engine.context import host_context, load
from engine.render import render_cluster
from roles.nvidia import operations as nvidia_ops
from roles.nvidia.compat import CUDA_MINIMUM_DRIVER, gpu_family, has_nvswitch
from roles.nvidia.config import NvidiaConfig
from roles.nvidia.facts import STACK_PROBE, DriverLoaded, NvidiaStack, NvswitchDevices
from roles.nvidia.packages import package_plan
from roles.nvidia.role import ROLE
from tests.unit.conftest import SAMPLE
from toolkit.facts import Container, HeldPackages, UnitState

runner = CliRunner()
RECORDINGS = Path(__file__).parent / "recordings" / "nvidia"


def recording(name: str) -> dict[str, Any]:
    return json.loads((RECORDINGS / name).read_text())


def validate(path: Path) -> tuple[int, str]:
    result = runner.invoke(app, ["inventory", "validate", str(path)])
    return result.exit_code, result.stderr


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.fixture
def gpu_cluster(small_cluster) -> dict[str, Any]:
    """The small cluster on Ubuntu 22.04 with the sample's stack pins (all valid)."""
    small_cluster["os"] = "ubuntu-22.04"
    small_cluster["versions"] = {
        "nvidia_driver": "550.163.01",
        "cuda": "12.4",
        "cudnn": "9.1.0",
        "nccl": "2.22.3",
    }
    return small_cluster


def nvidia_vars(cluster: dict[str, Any], **settings: Any) -> None:
    cluster["group_vars"] = {"gpu_worker": {"nvidia": settings}}


# Compatibility rules: a positive control, then one refusal per rule.


def test_the_pins_of_the_sample_and_a_debian_13_cluster_are_valid(gpu_cluster, write_cluster):
    assert validate(SAMPLE)[0] == 0
    assert validate(write_cluster(gpu_cluster)) == (0, "")
    gpu_cluster["os"] = "debian-13"  # source defaults to distribution there
    assert validate(write_cluster(gpu_cluster)) == (0, "")


def test_cuda_needs_its_minimum_driver(gpu_cluster, write_cluster):
    gpu_cluster["versions"]["cuda"] = "12.8"
    path = write_cluster(gpu_cluster)
    code, err = validate(path)
    assert code == 2
    line = line_of(path, "nvidia_driver:")
    assert f"cluster.yml:{line}: versions.nvidia_driver: driver 550.163.01 is older than " in err
    assert "CUDA 12.8 needs (>= 570.26; NVIDIA CUDA Toolkit release notes" in err


def test_a_cuda_version_without_a_table_row_is_refused(gpu_cluster, write_cluster):
    gpu_cluster["versions"]["cuda"] = "12.1"
    path = write_cluster(gpu_cluster)
    code, err = validate(path)
    assert code == 2
    assert f"cluster.yml:{line_of(path, 'cuda:')}: versions.cuda: CUDA 12.1 has no " in err


def test_cudnn_build_must_exist_for_the_cuda_major(gpu_cluster, write_cluster):
    gpu_cluster["versions"].update(cuda="13.0", nvidia_driver="580.65.06")
    path = write_cluster(gpu_cluster)
    code, err = validate(path)
    assert code == 2
    assert (
        f"cluster.yml:{line_of(path, 'cudnn:')}: versions.cudnn: no cuDNN 9 build for CUDA " in err
    )
    assert "libcudnn9-cuda-13" in err


def test_nccl_build_newer_than_the_toolkit_is_refused(gpu_cluster, write_cluster):
    nvidia_vars(gpu_cluster, nccl_cuda="12.6")
    path = write_cluster(gpu_cluster)
    code, err = validate(path)
    assert code == 2
    assert f":{line_of(path, 'nccl_cuda:')}: group_vars.gpu_worker.nvidia.nccl_cuda: NCCL " in err
    assert "built for CUDA 12.6 is newer than the CUDA toolkit pin 12.4" in err


def test_nccl_build_for_another_cuda_major_is_refused(gpu_cluster, write_cluster):
    nvidia_vars(gpu_cluster, nccl_cuda="11.8")
    code, err = validate(write_cluster(gpu_cluster))
    assert code == 2
    assert "NCCL built for CUDA 11.8 does not fit CUDA 12.4 (major differs)" in err


def test_fabric_manager_must_equal_the_driver(gpu_cluster, write_cluster):
    gpu_cluster["hosts"]["gpu-1"]["vars"] = {"nvidia": {"fabricmanager_version": "550.144.03"}}
    path = write_cluster(gpu_cluster)
    code, err = validate(path)
    assert code == 2
    assert (
        f":{line_of(path, 'fabricmanager_version:')}: hosts.gpu-1.vars.nvidia."
        "fabricmanager_version: fabric manager 550.144.03 must equal the driver version "
        "550.163.01 exactly"
    ) in err


def test_blackwell_needs_open_modules(gpu_cluster, write_cluster):
    gpu_cluster["hosts"]["gpu-1"]["gpu"]["model"] = "B200"
    path = write_cluster(gpu_cluster)
    code, err = validate(path)
    assert code == 2  # driver 550: NVIDIA's default for the branch is proprietary
    assert f":{line_of(path, 'model:')}: hosts.gpu-1.gpu.model: B200 (Blackwell) needs open " in err
    nvidia_vars(gpu_cluster, kernel_modules="open")
    assert validate(write_cluster(gpu_cluster))[0] == 0  # positive control


def test_gpus_before_turing_need_proprietary_modules(gpu_cluster, write_cluster):
    gpu_cluster["hosts"]["gpu-1"]["gpu"]["model"] = "V100-SXM2-32GB"
    nvidia_vars(gpu_cluster, kernel_modules="open")
    code, err = validate(write_cluster(gpu_cluster))
    assert code == 2
    assert "group_vars.gpu_worker.nvidia.kernel_modules: V100-SXM2-32GB (Volta/Pascal)" in err


def test_nvidia_repository_has_no_debian_13_tree(gpu_cluster, write_cluster):
    gpu_cluster["os"] = "debian-13"
    nvidia_vars(gpu_cluster, source="nvidia")
    code, err = validate(write_cluster(gpu_cluster))
    assert code == 2
    assert "group_vars.gpu_worker.nvidia.source: NVIDIA's CUDA repository has no debian-13" in err


def test_mirror_source_needs_a_mirror_url(gpu_cluster, write_cluster):
    nvidia_vars(gpu_cluster, source="mirror")
    code, err = validate(write_cluster(gpu_cluster))
    assert code == 2
    assert "group_vars.gpu_worker.nvidia.source: source: mirror needs nvidia.mirror_url" in err


def test_a_stack_version_that_is_not_a_version_is_refused(gpu_cluster, write_cluster):
    gpu_cluster["versions"]["nccl"] = "latest"
    code, err = validate(write_cluster(gpu_cluster))
    assert code == 2
    assert "versions.nccl: 'latest' is not a version" in err


def test_the_role_record_carries_the_check_and_the_table_cites_sources():
    assert ROLE.checks is not None and ROLE.config is NvidiaConfig
    assert ROLE.groups == ("gpu_worker",)
    assert all("release notes" in row.source for row in CUDA_MINIMUM_DRIVER.values())
    assert CUDA_MINIMUM_DRIVER["12.4"].driver == "550.54.14"


def test_gpu_models_map_to_families_and_nvswitch_boards():
    from inventory.model import GPUSpec

    assert gpu_family("H100-SXM5-80GB").name == "Hopper"
    assert gpu_family("B200").name == "Blackwell"
    assert gpu_family("A100-SXM4-80GB").name == "Ampere"
    assert has_nvswitch(GPUSpec(model="H100-SXM5-80GB", count=8))
    assert not has_nvswitch(GPUSpec(model="H100-PCIe-80GB", count=8))
    assert not has_nvswitch(GPUSpec(model="H100-SXM5-80GB", count=4))
    assert not has_nvswitch(GPUSpec(model="L40S", count=8))


# Package sets per source and OS.


def plan_for(cluster_data, write_cluster, **settings):
    nvidia_vars(cluster_data, **settings)
    loaded = load(write_cluster(cluster_data))
    ctx = host_context(loaded, "gpu-1")
    return package_plan(loaded.cluster, ctx.host, ctx.config(NvidiaConfig))


@pytest.mark.parametrize("os_name", ["ubuntu-22.04", "ubuntu-24.04"])
@pytest.mark.parametrize("source", ["nvidia", "mirror"])
def test_nvidia_and_mirror_sources_pin_the_whole_stack_on_ubuntu(
    gpu_cluster, write_cluster, os_name, source
):
    gpu_cluster["os"] = os_name
    extra = {"mirror_url": "http://apt.example.test/cuda"} if source == "mirror" else {}
    plan = plan_for(gpu_cluster, write_cluster, source=source, **extra)
    pins = {p.name: p.version for p in plan.all}
    assert pins["nvidia-headless-no-dkms-550-server"] == "550.163.01-*"
    assert pins["nvidia-dkms-550-server"] == "550.163.01-*"
    assert pins["libnccl2"] == "2.22.3-*+cuda12.4"
    assert pins["libcudnn9-cuda-12"] == "9.1.0.*"
    # 8x H100 SXM is an NVSwitch board: fabric manager and NSCQ at the driver's version.
    assert pins["nvidia-fabricmanager-550"] == pins["libnvidia-nscq-550"] == "550.163.01-*"
    assert pins["datacenter-gpu-manager-4-cuda12"] == "1:4.2.3-*"
    assert pins["nvidia-container-toolkit"] == "1.17.8-*"
    assert plan.missing == ()


def test_debian_distribution_names_what_it_cannot_provide(gpu_cluster, write_cluster):
    gpu_cluster["os"] = "debian-13"
    plan = plan_for(gpu_cluster, write_cluster)
    assert {p.name for p in plan.userspace} == {
        "nvidia-smi", "libnvidia-ml1", "libcuda1", "nvidia-persistenced", "libnccl2"
    }  # fmt: skip
    assert [p.name for p in plan.modules] == ["nvidia-kernel-dkms"]
    missing = {m.package: m.part for m in plan.missing}
    assert missing == {
        "libcudnn9-cuda-12": "cuDNN",
        "nvidia-fabricmanager-550": "fabric manager",
        "libnvidia-nscq-550": "fabric manager",
        "datacenter-gpu-manager-4-core": "DCGM",
        "datacenter-gpu-manager-4-cuda12": "DCGM",
        "nvidia-container-toolkit": "container toolkit",
    }
    note = plan.missing[0].note("distribution", "debian-13")
    assert note.startswith("cuDNN (libcudnn9-cuda-12): not provided by source distribution on ")


def test_ubuntu_distribution_uses_precompiled_modules(gpu_cluster, write_cluster):
    gpu_cluster["versions"].update(nvidia_driver="570.172.08", cuda="12.8")
    plan = plan_for(gpu_cluster, write_cluster, source="distribution")
    assert [p.name for p in plan.modules] == ["linux-modules-nvidia-570-server-open-generic"]


def test_fabric_manager_only_on_nvswitch_boards(gpu_cluster, write_cluster):
    gpu_cluster["hosts"]["gpu-1"]["gpu"] = {"model": "L40S", "count": 8}
    assert not plan_for(gpu_cluster, write_cluster).has("fabricmanager")


# Files `render` writes.


def test_render_writes_the_nvidia_files_for_every_gpu_worker_of_the_sample(tmp_path):
    loaded = load(SAMPLE)
    result = render_cluster(loaded, tmp_path)
    gpu_workers = loaded.cluster.in_group("gpu_worker")
    assert len(gpu_workers) == 8
    for name in gpu_workers:
        base = tmp_path / name / "etc"
        sources = (base / "apt/sources.list.d/nvidia-cuda.sources").read_text()
        repo = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"
        assert f"URIs: {repo}" in sources
        assert "Enabled: yes" in sources
        prefs = (base / "apt/preferences.d/gpuinfra-nvidia").read_text()
        assert "Package: libnccl2\nPin: version 2.22.3-*+cuda12.4\nPin-Priority: 1001" in prefs
        assert (base / "modprobe.d/gpuinfra-nouveau.conf").exists()
        assert '"libnccl";' in (base / "apt/apt.conf.d/51gpuinfra-nvidia-unattended").read_text()
    assert not any("nvidia" in path for path in result.per_host["cpu-1"])


def test_containerd_drop_in_repeats_the_cri_section_and_adds_the_runtime(tmp_path):
    """containerd 1.7 replaces a plugin section with an imported one (seen on a lab host):
    the drop-in must hold every CRI setting of config.toml, plus the nvidia runtime."""
    render_cluster(load(SAMPLE), tmp_path)
    main = tomllib.loads((tmp_path / "gpu-1/etc/containerd/config.toml").read_text())
    drop_in = tomllib.loads((tmp_path / "gpu-1/etc/containerd/conf.d/90-nvidia.toml").read_text())
    assert main["imports"] == ["/etc/containerd/conf.d/*.toml"]
    cri, cri_main = (c["plugins"]["io.containerd.grpc.v1.cri"] for c in (drop_in, main))
    assert cri["sandbox_image"] == cri_main["sandbox_image"]
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["runc"] == cri_main["containerd"]["runtimes"]["runc"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    daemon = json.loads((tmp_path / "gpu-1/etc/docker/daemon.json").read_text())
    assert daemon["runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"
    cpu = json.loads((tmp_path / "cpu-1/etc/docker/daemon.json").read_text())
    assert "runtimes" not in cpu


def test_runtime_class_mode_keeps_runc_the_default(gpu_cluster, write_cluster, tmp_path):
    nvidia_vars(gpu_cluster, containerd_runtime="runtime_class")
    render_cluster(load(write_cluster(gpu_cluster)), tmp_path)
    drop_in = tomllib.loads((tmp_path / "gpu-1/etc/containerd/conf.d/90-nvidia.toml").read_text())
    containerd = drop_in["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert containerd["default_runtime_name"] == "runc"
    assert "nvidia" in containerd["runtimes"]
    daemon = json.loads((tmp_path / "gpu-1/etc/docker/daemon.json").read_text())
    assert "default-runtime" not in daemon and "nvidia" in daemon["runtimes"]


def test_no_runtime_where_the_source_has_no_container_toolkit(loaded, tmp_path):
    render_cluster(loaded, tmp_path)  # Debian 13: distribution
    text = (tmp_path / "gpu-1/etc/containerd/conf.d/90-nvidia.toml").read_text()
    assert "runtimes.nvidia]" not in text and "installs no container toolkit" in text
    assert "runtimes" not in json.loads((tmp_path / "gpu-1/etc/docker/daemon.json").read_text())


# Live facts: parsers and operations against recorded facts.


@pytest.mark.parametrize(
    "name", ["debian13-lab-gpu.json", "ubuntu2204-h100-hgx.json", "ubuntu2404-h100-hgx.json"]
)
def test_stack_fact_reads_the_recorded_probe(name):
    recorded = recording(name)
    assert recorded["provenance"]
    facts = NvidiaStack().process(recorded["stack_probe"])
    assert facts["nccl"] == "2.22.3" and facts["cuda_driver_api"] == "12.4"
    if recorded["container"]:
        assert facts["driver_loaded"] == "no" and "nvml_error" in facts
    else:
        assert facts["driver_version"] == "550.163.01" and facts["persistence"] == "Enabled"


def test_stack_fact_reads_a_probe_recorded_on_a_real_gpu():
    """Captured on a lent H200 machine: the driver answers through nvidia-smi, libcuda and the
    PyTorch wheels' NCCL and cuDNN through ctypes; no systemd there, so fabric manager is
    unknown rather than a traceback."""
    facts = NvidiaStack().process(recording("h200-lent-machine-probe.json")["stack_probe"])
    assert facts["driver_loaded"] == "yes" and facts["driver_version"] == "580.159.04"
    assert facts["gpus"] == "1" and facts["persistence"] == "Enabled"
    assert (facts["cuda_driver_api"], facts["nccl"], facts["cudnn"]) == ("13.0", "2.28.3", "9.14.0")
    assert facts["fabricmanager"] == "unknown"


def test_stack_probe_runs_where_there_is_no_systemctl(tmp_path):
    """Seen on the lent GPU machine: the probe died on FileNotFoundError('systemctl')."""
    bare = tmp_path / "bin"
    bare.mkdir()
    probe = [sys.executable, "-c", STACK_PROBE]
    without = subprocess.run(probe, capture_output=True, text=True, env={"PATH": str(bare)})
    assert without.returncode == 0, without.stderr
    facts = NvidiaStack().process(without.stdout.splitlines())
    assert facts["fabricmanager"] == "unknown" and facts["driver_loaded"] in ("yes", "no")
    # Positive control: with a systemctl on the PATH, its answer is what the fact reports.
    (bare / "systemctl").write_text("#!/bin/sh\necho inactive\n")
    (bare / "systemctl").chmod(0o755)
    (bare / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (bare / "nvidia-smi").chmod(0o755)
    with_it = subprocess.run(probe, capture_output=True, text=True, env={"PATH": str(bare)})
    assert NvidiaStack().process(with_it.stdout.splitlines())["fabricmanager"] == "inactive"


class FakeHost:
    """Facts keyed by their arguments: a lookup with the wrong arguments finds nothing."""

    name = "fake-host"

    def __init__(self, facts: dict[tuple, object]):
        self.facts = facts
        self.noops: list[str] = []

    def get_fact(self, fact, **kwargs):
        return self.facts.get((fact, *sorted(kwargs.items())))

    def noop(self, message: str) -> None:
        self.noops.append(message)


@pytest.fixture
def fake_host(monkeypatch):
    def make(recorded: dict[str, Any], **extra: object) -> FakeHost:
        from pyinfra.facts.deb import DebPackages

        facts: dict[tuple, object] = {
            (DebPackages,): recorded["packages"],
            (HeldPackages,): recorded["held"],
            (Container,): recorded["container"],
            (NvswitchDevices,): recorded["nvswitch_devices"],
            (DriverLoaded,): recorded["container"] is None,
        }
        facts.update({(k,): v for k, v in extra.items() if isinstance(k, type)})
        fake = FakeHost(facts)
        monkeypatch.setattr(nvidia_ops, "host", fake)
        monkeypatch.setattr("toolkit.operations.host", fake)
        return fake

    return make


def run(op, **kwargs) -> list[str]:
    return [str(command) for command in op._inner(**kwargs)]


def sample_plan(os_name: str, source: str, write_cluster, gpu_cluster):
    gpu_cluster["os"] = os_name
    extra = {"mirror_url": "http://apt.example.test/cuda"} if source == "mirror" else {}
    return plan_for(gpu_cluster, write_cluster, source=source, **extra)


@pytest.mark.parametrize(
    ("name", "os_name"),
    [("ubuntu2204-h100-hgx.json", "ubuntu-22.04"), ("ubuntu2404-h100-hgx.json", "ubuntu-24.04")],
)
@pytest.mark.parametrize("source", ["nvidia", "mirror"])
def test_a_converged_ubuntu_node_needs_nothing(
    fake_host, gpu_cluster, write_cluster, name, os_name, source
):
    plan = sample_plan(os_name, source, write_cluster, gpu_cluster)
    host = fake_host(recording(name))
    assert run(nvidia_ops.packages_pinned, packages=list(plan.userspace)) == []
    assert run(nvidia_ops.module_packages_pinned, packages=list(plan.modules)) == []
    assert host.noops == []


def test_a_moved_nccl_is_reinstalled_at_its_pin_and_named(fake_host, gpu_cluster, write_cluster):
    plan = sample_plan("ubuntu-22.04", "nvidia", write_cluster, gpu_cluster)
    recorded = recording("ubuntu2204-h100-hgx.json")
    recorded["packages"]["libnccl2"] = ["2.23.4-1+cuda12.6"]
    host = fake_host(recorded)
    assert run(nvidia_ops.packages_pinned, packages=list(plan.userspace)) == [
        f"{nvidia_ops.APT_INSTALL} libnccl2"
    ]
    assert host.noops == ["libnccl2: installed 2.23.4-1+cuda12.6, pinned 2.22.3-*+cuda12.4"]


def test_an_unheld_package_is_held_again_and_named(fake_host, gpu_cluster, write_cluster):
    plan = sample_plan("ubuntu-24.04", "mirror", write_cluster, gpu_cluster)
    recorded = recording("ubuntu2404-h100-hgx.json")
    recorded["held"].remove("libnccl2")
    host = fake_host(recorded)
    assert run(nvidia_ops.packages_pinned, packages=list(plan.userspace)) == [
        "apt-mark hold libnccl2"
    ]
    assert host.noops == ["libnccl2: not held (apt-mark hold)"]


def test_a_driver_change_marks_the_host_reboot_required(fake_host, gpu_cluster, write_cluster):
    plan = sample_plan("ubuntu-22.04", "nvidia", write_cluster, gpu_cluster)
    recorded = recording("ubuntu2204-h100-hgx.json")
    recorded["packages"]["nvidia-headless-no-dkms-550-server"] = ["550.144.03-0ubuntu1"]
    fake_host(recorded)
    commands = run(nvidia_ops.packages_pinned, packages=list(plan.userspace))
    assert commands[0] == f"{nvidia_ops.APT_INSTALL} nvidia-headless-no-dkms-550-server"
    assert any("/run/reboot-required" in c for c in commands[1:])


def test_the_lab_recording_is_converged_and_its_module_reported(
    fake_host, small_cluster, write_cluster
):
    plan = plan_for(small_cluster, write_cluster)  # Debian 13, distribution
    host = fake_host(recording("debian13-lab-gpu.json"))
    assert run(nvidia_ops.packages_pinned, packages=list(plan.userspace)) == []
    assert run(nvidia_ops.module_packages_pinned, packages=list(plan.modules)) == []
    assert host.noops[0].startswith("NVIDIA kernel module (nvidia-kernel-dkms): not installed in")


def test_fabric_manager_starts_where_nvswitch_is_seen_and_is_reported_elsewhere(fake_host):
    unit = (UnitState, ("unit", "nvidia-fabricmanager.service"))
    recorded = recording("ubuntu2204-h100-hgx.json")
    host = fake_host(recorded)
    host.facts[unit] = {"UnitFileState": "enabled", "ActiveState": "inactive"}
    assert run(nvidia_ops.fabricmanager_running, expected=True, why="H100 x8") == [
        "systemctl restart nvidia-fabricmanager"
    ]
    host.facts[unit] = {"UnitFileState": "enabled", "ActiveState": "active"}
    assert run(nvidia_ops.fabricmanager_running, expected=True, why="H100 x8") == []
    host.facts[(NvswitchDevices,)] = []
    host.facts[unit] = {"UnitFileState": "enabled", "ActiveState": "inactive"}
    assert run(nvidia_ops.fabricmanager_running, expected=True, why="H100 x8") == []
    assert "lists no NVSwitch" in host.noops[-1]
    assert run(nvidia_ops.fabricmanager_running, expected=False, why="") == []


def test_persistenced_waits_for_a_loaded_driver(fake_host):
    unit = (UnitState, ("unit", "nvidia-persistenced.service"))
    host = fake_host(recording("debian13-lab-gpu.json"))
    host.facts[unit] = {"UnitFileState": "disabled", "ActiveState": "failed"}
    assert run(nvidia_ops.driver_service_running, unit="nvidia-persistenced.service") == [
        "systemctl enable nvidia-persistenced.service"
    ]
    assert "no NVIDIA driver is loaded" in host.noops[-1]
    host = fake_host(recording("ubuntu2204-h100-hgx.json"))
    host.facts[unit] = {"UnitFileState": "enabled", "ActiveState": "inactive"}
    assert run(nvidia_ops.driver_service_running, unit="nvidia-persistenced.service") == [
        "systemctl restart nvidia-persistenced.service"
    ]


def test_an_unknown_nvidia_setting_is_named_and_the_pins_check_does_not_crash(
    gpu_cluster, write_cluster
):
    nvidia_vars(gpu_cluster, soruce="mirror")
    code, err = validate(write_cluster(gpu_cluster))
    assert code == 2
    assert "group_vars.gpu_worker.nvidia.soruce: unknown key" in err
    assert "Traceback" not in err


def test_the_stack_probe_runs_with_a_plain_python_and_no_nvidia_stack():
    """The probe itself, run here (this machine has no NVIDIA libraries or nvidia-smi)."""
    import subprocess
    import sys

    from roles.nvidia.facts import STACK_PROBE

    done = subprocess.run([sys.executable, "-c", STACK_PROBE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    facts = NvidiaStack().process(done.stdout.splitlines())
    assert facts["driver_loaded"] == "no"
    assert facts["nvml_error"] == "nvidia-smi not installed"
    assert "nccl" not in facts and facts["nvswitch_devices"] == "0"
