"""The nvidia role, checked on the running GPU worker: packages at their pins and held, what the
libraries themselves report (NCCL, CUDA driver API, cuDNN, the driver through NVML), services,
module settings, the containerd drop-in, and the same stack as every other GPU worker.

Without a loaded driver (lab hosts are containers: no kernel module, no GPU) the checks that
need one are skipped with the reason; the libraries answer without one."""

from __future__ import annotations

import shlex
from fnmatch import fnmatchcase

import pytest

from engine.context import host_context
from roles.container_runtime.config import ContainerRuntimeConfig
from roles.nvidia.compat import version_key
from roles.nvidia.facts import STACK_PROBE
from roles.nvidia.files import MODULES, NOUVEAU, UNATTENDED_BLACKLIST, host_packages, kernel_modules
from roles.nvidia.runtime import toolkit_installed
from tests.verify.conftest import connect


def stack(host) -> dict[str, str]:
    """What the host's stack says about itself (roles/nvidia/stack_probe.py)."""
    output = host.check_output(f"python3 -c {shlex.quote(STACK_PROBE)}")
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def installed_versions(host, names: list[str]) -> dict[str, str]:
    quoted = " ".join(shlex.quote(n) for n in names)
    output = host.run(
        f"dpkg-query -W -f='${{Package}} ${{db:Status-Abbrev}} ${{Version}}\\n' {quoted}"
    )
    versions = {}
    for line in output.stdout.splitlines():
        name, status, version = (line.split() + ["", "", ""])[:3]
        if status.startswith("ii") or status.startswith("hi"):
            versions[name.split(":")[0]] = version
    return versions


def driver_loaded(host) -> bool:
    return host.file("/proc/driver/nvidia/version").exists


def test_packages_are_at_their_pins(host, ctx) -> None:
    plan = host_packages(ctx)
    in_container = host.run("systemd-detect-virt --container").rc == 0
    wanted = list(plan.userspace) + ([] if in_container else list(plan.modules))
    versions = installed_versions(host, [p.name for p in wanted])
    wrong = {
        p.name: versions.get(p.name, "not installed")
        for p in wanted
        if not fnmatchcase(versions.get(p.name, ""), p.version)
    }
    assert not wrong, f"not at their pins: {wrong}"


def test_packages_are_held(host, ctx) -> None:
    held = set(host.check_output("apt-mark showhold").split())
    names = {p.name for p in host_packages(ctx).userspace}
    assert not names - held, f"not held: {sorted(names - held)}"


def test_nccl_library_reports_the_pinned_version(host, ctx) -> None:
    if not host_packages(ctx).has("nccl"):
        pytest.skip("this host's source provides no NCCL (reported in the plan)")
    assert stack(host).get("nccl") == ctx.cluster.versions.nccl


def test_cuda_driver_api_runs_the_pinned_cuda(host, ctx) -> None:
    api = stack(host).get("cuda_driver_api")
    assert api, "libcuda.so.1 did not answer cuDriverGetVersion"
    assert version_key(api) >= version_key(ctx.cluster.versions.cuda)


def test_cudnn_library_reports_the_pinned_version(host, ctx) -> None:
    if not host_packages(ctx).has("cudnn"):
        pytest.skip("this host's source provides no cuDNN (reported in the plan)")
    assert stack(host).get("cudnn") == ctx.cluster.versions.cudnn


def test_driver_is_the_pinned_version(host, ctx) -> None:
    """Through NVML with a loaded driver; without one, the NVML library's own file name."""
    facts = stack(host)
    pin = ctx.cluster.versions.nvidia_driver
    if driver_loaded(host):
        assert facts.get("driver_version") == pin
    else:
        assert f"libnvidia-ml.so.{pin}" in facts.get("nvml_library", "").split(",")


def test_persistence_mode_is_on(host) -> None:
    if not driver_loaded(host):
        pytest.skip("no NVIDIA driver loaded here (no GPU): persistence mode needs one")
    assert set(stack(host).get("persistence", "").split(",")) == {"Enabled"}
    assert host.service("nvidia-persistenced").is_running


def test_persistenced_starts_at_boot(host) -> None:
    assert host.service("nvidia-persistenced").is_enabled


def test_fabric_manager_runs_on_nvswitch_systems(host, ctx) -> None:
    if not host_packages(ctx).has("fabricmanager"):
        pytest.skip("no fabric manager for this host (not NVSwitch, or its source has none)")
    if stack(host).get("nvswitch_devices", "0") == "0":
        pytest.skip("the driver lists no NVSwitch (/proc/driver/nvidia-nvswitch/devices)")
    assert host.service("nvidia-fabricmanager").is_running


def test_nouveau_is_blacklisted(host) -> None:
    assert "blacklist nouveau" in host.file(NOUVEAU).content_string.splitlines()


def test_driver_modules_load_at_boot(host, ctx) -> None:
    listed = host.file(MODULES).content_string.split()
    assert set(kernel_modules(ctx)) <= set(listed)


def test_unattended_upgrades_leave_the_stack_alone(host) -> None:
    """apt's merged configuration, as unattended-upgrades reads it."""
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    for pattern in UNATTENDED_BLACKLIST:
        assert f'"{pattern}";' in dump, f"{pattern} missing from Package-Blacklist"


def test_containerd_keeps_its_cri_settings_with_the_nvidia_drop_in(host, ctx) -> None:
    dump = host.check_output("containerd config dump")
    systemd = ctx.config(ContainerRuntimeConfig).cgroup_driver == "systemd"
    assert f"SystemdCgroup = {'true' if systemd else 'false'}" in dump
    runtime = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]'
    assert (runtime in dump) is toolkit_installed(ctx)


_STACKS: dict[str, dict[str, str]] = {}


def _stack_of(cluster, name: str) -> dict[str, str]:
    """A GPU worker's stack versions and package versions, read once per verify process."""
    if name in _STACKS:
        return _STACKS[name]
    other = connect(cluster, name)
    try:
        facts = stack(other)
        names = [p.name for p in host_packages(host_context(cluster, name)).userspace]
        packages = installed_versions(other, names)
    finally:
        other.backend.client.close()
    keys = ("driver_version", "nvml_library", "cuda_driver_api", "nccl", "cudnn")
    _STACKS[name] = {**{k: facts.get(k, "") for k in keys}, **packages}
    return _STACKS[name]


def test_same_stack_as_the_other_gpu_workers(host, ctx, cluster, target) -> None:
    others = [n for n in cluster.cluster.in_group("gpu_worker") if n != target]
    if not others:
        pytest.skip("the only GPU worker: nothing to compare with")
    mine = _stack_of(cluster, target)
    differing = {}
    for other in others:
        theirs = _stack_of(cluster, other)
        diff = {k: (mine.get(k), theirs.get(k)) for k in mine.keys() | theirs.keys()
                if mine.get(k) != theirs.get(k)}  # fmt: skip
        if diff:
            differing[other] = diff
    assert not differing, f"differs from other GPU workers (mine, theirs): {differing}"
