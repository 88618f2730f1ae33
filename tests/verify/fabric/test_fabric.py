"""The fabric role, checked on the running GPU worker: the RDMA stack at its pins, NCCL's
settings, locked memory for sessions and container runtimes, the firewall rule, and every
port Active at the expected rate and link layer with its address.

The port checks read `ibstat` and `ibv_devinfo` (roles/fabric/ibtools.py). The lab has no RDMA
device: a host declared a stand-in (`fabric.device_standin`) skips them, saying so; their
parsing is tested on outputs written from the tools' documentation (tests/unit/recordings/
fabric/)."""

from __future__ import annotations

import shlex

import pytest

from roles.fabric.config import PACKAGES, FabricConfig
from roles.fabric.files import NCCL_CONF, RUNTIME_UNITS
from roles.fabric.ibtools import parse_ibstat, parse_ibv_devinfo, port_problems


def settings(ctx) -> FabricConfig:
    return ctx.config(FabricConfig)


def real_ports(ctx) -> FabricConfig:
    cfg = settings(ctx)
    if not cfg.ports:
        pytest.skip("no fabric ports declared for this host")
    if cfg.device_standin:
        pytest.skip("stand-in host (fabric.device_standin): no RDMA device here to check")
    return cfg


@pytest.mark.parametrize("package", sorted(PACKAGES["debian-13"]))
def test_package_at_its_pin(host, ctx, package: str) -> None:
    wanted = settings(ctx).package_pins(ctx.cluster.os)[package]
    found = host.run(f"dpkg-query -W -f='${{db:Status-Abbrev}} ${{Version}}' {package}")
    assert found.rc == 0, f"{package} is not installed"
    status, version = found.stdout.split()  # "ii " and the version
    assert status == "ii" and version == wanted


def test_nccl_conf(host, ctx) -> None:
    lines = host.file(NCCL_CONF).content_string.splitlines()
    found = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert found == settings(ctx).nccl_settings()


CAP_SYS_RESOURCE = 24  # capability(7): raising a hard resource limit needs it


def can_raise_limits(host) -> bool:
    """Whether root here may raise a hard limit: not in a container whose bounding set lacks
    CAP_SYS_RESOURCE (the lab's hosts), where PAM and systemd are refused and say so."""
    status = host.file("/proc/self/status").content_string
    bounding = next(line for line in status.splitlines() if line.startswith("CapBnd:"))
    return bool(int(bounding.split()[1], 16) >> CAP_SYS_RESOURCE & 1)


def wanted_bytes(memlock: str) -> str:
    return "unlimited" if memlock == "unlimited" else str(int(memlock) * 1024)


def test_session_memlock(host, ctx) -> None:
    # A session opened by sshd through PAM, as an operator's or a job launcher's would be.
    if not can_raise_limits(host):
        pytest.skip("root here lacks CAP_SYS_RESOURCE: pam_limits cannot raise memlock")
    assert host.check_output("ulimit -l") == settings(ctx).memlock


@pytest.mark.parametrize("unit", sorted(RUNTIME_UNITS))
def test_container_runtime_memlock_configured(host, ctx, unit: str) -> None:
    """What systemd gives the runtime's unit from the role's drop-in."""
    load = host.check_output(f"systemctl show --property=LoadState --value {unit}.service")
    if load != "loaded":
        pytest.skip(f"{unit} is not installed here")
    value = host.check_output(f"systemctl show --property=LimitMEMLOCK --value {unit}.service")
    memlock = settings(ctx).memlock
    assert value == ("infinity" if memlock == "unlimited" else wanted_bytes(memlock))


@pytest.mark.parametrize("unit", sorted(RUNTIME_UNITS))
def test_container_runtime_memlock_effective(host, ctx, unit: str) -> None:
    """What the running runtime holds: its containers inherit it."""
    pid = host.check_output(f"systemctl show --property=MainPID --value {unit}.service")
    if not pid or pid == "0":
        pytest.skip(f"{unit} does not run here")
    if not can_raise_limits(host):
        pytest.skip("root here lacks CAP_SYS_RESOURCE: systemd cannot raise memlock")
    limits = host.file(f"/proc/{pid}/limits").content_string
    line = next(line for line in limits.splitlines() if line.startswith("Max locked memory"))
    wanted = wanted_bytes(settings(ctx).memlock)
    assert line.split()[3:5] == [wanted, wanted], line


def test_firewall_admits_fabric_peers(host, ctx, topology) -> None:
    rules = [
        rule for rule in topology.rules_for(list(ctx.host.groups)) if "fabric" in rule.description
    ]
    if not rules:
        pytest.skip("no fabric ports declared in the cluster: no rule to hold")
    table = host.check_output("nft list table inet gpuinfra")
    line = next((line for line in table.splitlines() if "fabric peers" in line), "")
    assert line, "gpuinfra's table has no fabric rule"
    for source in rules[0].sources:
        assert source in line


@pytest.mark.parametrize(
    ("tool", "parse"), [("ibstat", parse_ibstat), ("ibv_devinfo", parse_ibv_devinfo)]
)
def test_ports_active_at_rate_and_link_layer(host, ctx, tool, parse) -> None:
    """Each tool on its own: ibstat and ibv_devinfo read the port from different interfaces."""
    cfg = real_ports(ctx)
    found = parse(host.check_output(tool))
    problems = [
        problem
        for port in cfg.ports
        for problem in port_problems(
            found.get((port.device, port.port)), port.device, port.port, cfg.rate_gbps,
            cfg.link_layer,
        )
    ]  # fmt: skip
    assert not problems, "; ".join(problems)


def test_interfaces_hold_their_addresses(host, ctx) -> None:
    cfg = real_ports(ctx)
    for port in cfg.ports:
        shown = host.run(f"ip -o -4 addr show dev {shlex.quote(port.interface)}")
        assert shown.rc == 0, f"{port.interface}: no such interface"
        assert f" {port.address} " in f"{shown.stdout} ", f"{port.interface}: not {port.address}"
