"""The kernel role, checked on the running host: sysctls, modules, swap, limits, boot settings.

In a container (lab hosts) global sysctls and modules belong to the machine: there the
persisted files are what the role can be held to, and the live value where the kernel lets
the container set it."""

from __future__ import annotations

import pytest

from roles.kernel.config import DEFAULT_SYSCTLS, KernelConfig
from roles.kernel.facts import sysctl_path
from roles.kernel.files import (
    GRUB_FILE,
    LIMITS_FILE,
    MODULES_FILE,
    SYSCTL_FILE,
    host_modules,
)


def settings(ctx) -> KernelConfig:
    return ctx.config(KernelConfig)


def in_container(host) -> bool:
    return host.run("systemd-detect-virt --container").rc == 0


@pytest.mark.parametrize("name", sorted(DEFAULT_SYSCTLS))
def test_sysctl(host, ctx, name: str) -> None:
    wanted = settings(ctx).effective_sysctls().get(name)
    if wanted is None:
        pytest.skip(f"{name} removed by this host's kernel.sysctls")
    persisted = host.file(SYSCTL_FILE).content_string
    assert f"\n{name} = {wanted}\n" in persisted, f"{name} not persisted in {SYSCTL_FILE}"
    path = sysctl_path(name)
    settable = host.run(f"test -w {path}").rc == 0
    if settable or not in_container(host):
        live = host.run(f"cat {path}")
        assert live.rc == 0, f"{name} does not exist here"
        assert live.stdout.split() == wanted.split()


def test_modules_load_at_boot(host, ctx) -> None:
    listed = host.file(MODULES_FILE).content_string.split()
    missing = [module for module in host_modules(ctx) if module not in listed]
    assert not missing, f"not in {MODULES_FILE}: {missing}"


def test_modules_are_loaded(host, ctx) -> None:
    if in_container(host):
        pytest.skip("a container cannot load kernel modules (they are persisted for boot)")
    # nvidia-peermem comes with the NVIDIA driver (a later role).
    wanted = [m for m in host_modules(ctx) if not m.startswith("nvidia")]
    absent = [m for m in wanted if not host.file(f"/sys/module/{m.replace('-', '_')}").exists]
    assert not absent, f"not loaded: {absent}"


def test_swap_is_off(host) -> None:
    assert host.check_output("swapon --show --noheadings") == ""


def test_swap_stays_off_after_reboot(host) -> None:
    fstab = host.run("cat /etc/fstab").stdout.splitlines()
    active = [line for line in fstab if line.split()[2:3] == ["swap"] and line[:1] != "#"]
    assert not active, f"swap in /etc/fstab: {active}"


@pytest.mark.parametrize("item", ["memlock", "nofile"])
def test_session_limits(host, ctx, item: str) -> None:
    cfg = settings(ctx)
    value = cfg.memlock if item == "memlock" else str(cfg.nofile)
    content = host.file(LIMITS_FILE).content_string
    for who in ("*", "root"):
        assert f"{who} hard {item} {value}" in content


@pytest.mark.parametrize("prop", ["DefaultLimitMEMLOCK", "DefaultLimitNOFILE"])
def test_systemd_default_limits(host, ctx, prop: str) -> None:
    cfg = settings(ctx)
    memlock = "infinity" if cfg.memlock == "unlimited" else cfg.memlock
    wanted = memlock if prop == "DefaultLimitMEMLOCK" else str(cfg.nofile)
    assert host.check_output(f"systemctl show --property={prop} --value") == wanted


def test_kernel_command_line_drop_in(host, ctx) -> None:
    content = host.file(GRUB_FILE).content_string
    for arg in settings(ctx).grub_cmdline:
        assert f" {arg}" in content


@pytest.mark.parametrize("unit", ["gpuinfra-cpu-governor.service", "gpuinfra-thp.service"])
def test_boot_units_are_enabled(host, unit: str) -> None:
    assert host.service(unit).is_enabled


def test_transparent_hugepages(host, ctx) -> None:
    text = host.file("/sys/kernel/mm/transparent_hugepage/enabled").content_string
    chosen = next((w[1:-1] for w in text.split() if w.startswith("[")), None)
    if chosen != settings(ctx).transparent_hugepages and in_container(host):
        pytest.skip("read-only /sys in a container: the boot unit sets it on the machine")
    assert chosen == settings(ctx).transparent_hugepages
