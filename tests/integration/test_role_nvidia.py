"""The nvidia role on a lab of its own (two Debian 13 GPU workers): apply converges them with
Debian's real non-free packages (driver userspace 550, nvidia-smi, libnvidia-ml1, libcuda1,
libnccl2 2.22.3), held; a second plan changes nothing; verify passes; drift catches an unheld
NCCL and a moved pin; verify catches a GPU worker whose stack differs from the others.

Lab hosts are containers without a GPU: no kernel module can load, so nvidia-smi cannot reach a
driver; the run report says so, and says which parts Debian cannot provide (cuDNN, fabric
manager, DCGM, container toolkit). Debian has one NCCL build (trixie 2.22.3-1-1; bookworm has
none, checked with apt on a lab host), so "another NCCL version" is driven from the other side:
the pin moves and the installed package no longer matches it."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import yaml

from cli.exitcodes import ExitCode
from lab import lifecycle
from lab.topology import HostSpec, Topology
from roles.nvidia.facts import STACK_PROBE
from tests.integration.conftest import KEEP_ENV, boot_lab
from tests.integration.roles_helpers import apply_roles, gpuinfra, pending

pytestmark = pytest.mark.integration

LAB_NAME = "nvidia"
ROLES = "base,container_runtime,nvidia"
TOPOLOGY = Topology(
    tuple(HostSpec(f"gpu-{i}", ("gpu_worker",), gpu=True) for i in (1, 2)), "nvidia"
)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("nvidia-lab") / "cluster.yml"
    cluster = boot_lab(LAB_NAME, TOPOLOGY, inventory)
    yield cluster
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(LAB_NAME)


@pytest.fixture(scope="module")
def applied(lab):
    report = apply_roles(lab.inventory_path, ROLES)
    return lab, report


def drift_report(inventory: Path, tmp_path: Path) -> tuple[int, dict]:
    path = tmp_path / "drift.json"
    result = gpuinfra("drift", str(inventory), "--roles", "nvidia", "--report", str(path))
    return result.returncode, json.loads(path.read_text())


def verify_json(inventory: Path) -> tuple[int, dict]:
    result = gpuinfra("verify", str(inventory), "--roles", "nvidia", "--format", "json")
    return result.returncode, json.loads(result.stdout)


def test_apply_installs_debians_packages_held_and_reports_what_debian_lacks(applied):
    lab, report = applied
    for host in ("gpu-1", "gpu-2"):
        assert report["hosts"][host]["status"] in ("changed", "ok")
        held = set(lab.ssh(host, "apt-mark showhold").stdout.split())
        assert {
            "nvidia-smi",
            "libnvidia-ml1",
            "libcuda1",
            "nvidia-persistenced",
            "libnccl2",
        } <= held
        version = lab.ssh(host, "dpkg-query -W -f='${Version}' libnccl2").stdout
        assert version.startswith("2.22.3-")
        notes = report["hosts"][host]["notes"]
        for part in ("cuDNN (libcudnn9-cuda-12)", "fabric manager (nvidia-fabricmanager-550)",
                     "DCGM (datacenter-gpu-manager-4-cuda12)", "container toolkit"):  # fmt: skip
            assert any(n.startswith(f"{part}") and "source distribution on debian-13" in n
                       for n in notes), (part, notes)  # fmt: skip
        assert any(n.startswith("NVIDIA kernel module (nvidia-kernel-dkms)") for n in notes)


def test_the_libraries_answer_with_the_pinned_versions(applied):
    """Real libraries on a host without a GPU: libnccl and libcuda report their versions."""
    lab, _ = applied
    output = lab.ssh("gpu-1", f"python3 -c {shlex.quote(STACK_PROBE)}").stdout
    facts = dict(line.split("=", 1) for line in output.splitlines())
    assert facts["nccl"] == "2.22.3"
    assert facts["cuda_driver_api"] == "12.4"
    assert facts["driver_loaded"] == "no"
    assert "libnvidia-ml.so.550.163.01" in facts["nvml_library"]


def test_second_plan_changes_nothing(applied):
    lab, _ = applied
    result = gpuinfra("plan", str(lab.inventory_path), "--roles", ROLES, "-f", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    assert pending(json.loads(result.stdout)) == {}


def test_verify_passes(applied):
    lab, _ = applied
    code, report = verify_json(lab.inventory_path)
    assert code == ExitCode.OK, [r for r in report["results"] if r["outcome"] == "failed"]
    assert report["counts"]["passed"] >= 20


def test_drift_names_an_unheld_nccl_on_its_host_only(applied, tmp_path):
    lab, _ = applied
    lab.ssh("gpu-1", "apt-mark unhold libnccl2")
    try:
        code, report = drift_report(lab.inventory_path, tmp_path)
        assert code == ExitCode.DRIFT
        gpu1, gpu2 = report["hosts"]["gpu-1"], report["hosts"]["gpu-2"]
        assert gpu1["status"] == "drift" and gpu2["status"] == "ok"
        changed = [op["name"] for op in gpu1["operations"] if op["changed"]]
        assert "Nvidia | Install and hold the NVIDIA stack" in changed
        assert "libnccl2: not held (apt-mark hold)" in gpu1["notes"]
        code, verified = verify_json(lab.inventory_path)
        assert code == ExitCode.VERIFY_FAILED
        failed = {(r["host"], r["test"].split("[")[0]) for r in verified["results"]
                  if r["outcome"] == "failed"}  # fmt: skip
        assert failed == {("gpu-1", "test_packages_are_held")}
    finally:
        apply_roles(lab.inventory_path, "nvidia")
    assert drift_report(lab.inventory_path, tmp_path)[0] == ExitCode.OK


def test_drift_names_an_nccl_that_differs_from_its_pin(applied, tmp_path):
    lab, _ = applied
    data = yaml.safe_load(lab.inventory_path.read_text())
    data.setdefault("versions", {})["nccl"] = "2.21.5"
    moved = tmp_path / "cluster.yml"
    moved.write_text(yaml.safe_dump(data, sort_keys=False))
    code, report = drift_report(moved, tmp_path)
    assert code == ExitCode.DRIFT
    for host in ("gpu-1", "gpu-2"):
        assert "libnccl2: installed 2.22.3-1-1, pinned 2.21.5-*" in report["hosts"][host]["notes"]


def test_verify_names_a_gpu_worker_whose_stack_differs_from_the_others(applied):
    lab, _ = applied
    lab.ssh("gpu-2", "apt-mark unhold libnccl2 && dpkg -r libnccl2 >/dev/null")
    try:
        code, report = verify_json(lab.inventory_path)
        assert code == ExitCode.VERIFY_FAILED
        same = {r["host"]: r for r in report["results"]
                if r["test"].startswith("test_same_stack_as_the_other_gpu_workers")}  # fmt: skip
        assert same["gpu-1"]["outcome"] == same["gpu-2"]["outcome"] == "failed"
        assert "gpu-2" in same["gpu-1"]["message"] and "nccl" in same["gpu-1"]["message"]
    finally:
        apply_roles(lab.inventory_path, "nvidia")
    assert verify_json(lab.inventory_path)[0] == ExitCode.OK


@pytest.mark.cuda
def test_cuda_toolkit_installs_at_its_pin(applied, tmp_path):
    """Opt in (-m cuda): Debian's nvidia-cuda-toolkit 12.4.131, about 1.9 GB, on gpu-1 only."""
    lab, _ = applied
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["hosts"]["gpu-1"]["vars"] = {"nvidia": {"cuda_toolkit": True}}
    with_toolkit = tmp_path / "cluster.yml"
    with_toolkit.write_text(yaml.safe_dump(data, sort_keys=False))
    report = apply_roles(with_toolkit, "nvidia", "--limit", "gpu-1")
    seconds = report["phase_seconds"].get("execute:nvidia")
    version = lab.ssh("gpu-1", "dpkg-query -W -f='${Version}' nvidia-cuda-toolkit").stdout
    assert version.startswith("12.4."), version
    assert "nvidia-cuda-toolkit" in lab.ssh("gpu-1", "apt-mark showhold").stdout.split()
    nvcc = lab.ssh("gpu-1", "nvcc --version").stdout
    assert "release 12.4" in nvcc
    print(f"CUDA toolkit apply: {seconds:.0f} s")
    result = gpuinfra(
        "plan", str(with_toolkit), "--roles", "nvidia", "--limit", "gpu-1", "-f", "json"
    )
    assert pending(json.loads(result.stdout)) == {}
