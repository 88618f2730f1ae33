"""GPU health's optional fabric check offline: ib_write_bw reports (written from perftest's
documentation: tests/unit/recordings/fabric/README.md) parsed and judged against the pair's
rate from the fabric settings, pairs covering every host, and the opt-in default."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from engine.context import load
from gpuhealth.fabric import (
    PortPlan,
    judge,
    pairs_of,
    parse_ib_write_bw,
    plans_for,
    run_fabric_check,
)
from gpuhealth.results import Verdict
from roles.gpu_health.config import GpuHealthConfig
from tests.unit.conftest import SAMPLE
from toolkit.remote import RemoteResult

RECORDINGS = Path(__file__).parent / "recordings" / "fabric"
PLAN = PortPlan("gpu-1", "gpu-2", "mlx5_0", 1, "10.50.10.11", "mlx5_0", 1, 200)


def report(name: str) -> str:
    return (RECORDINGS / name).read_text()


def test_parse_the_average_in_gbits_and_from_mb_per_second():
    assert parse_ib_write_bw(report("ib_write_bw-hdr-client.txt")) == 196.42
    assert parse_ib_write_bw(report("ib_write_bw-hdr-slow.txt")) == 96.17
    assert parse_ib_write_bw(report("ib_write_bw-mb-units.txt")) == pytest.approx(196.42)
    assert parse_ib_write_bw(" Couldn't connect to 10.50.10.11:18515\n") is None
    assert parse_ib_write_bw("") is None


@pytest.mark.parametrize(
    ("name", "verdict"),
    [
        ("ib_write_bw-hdr-client.txt", Verdict.ok),  # 196 of 200: above 90%
        ("ib_write_bw-hdr-slow.txt", Verdict.failed),  # 96 of 200: below half
    ],
)
def test_judged_against_the_ports_rate(name, verdict):
    check = judge(PLAN, RemoteResult("gpu-2", 0, report(name)), GpuHealthConfig())
    assert check.verdict is verdict
    assert check.threshold == ">= 180 Gb/s (90% of 200)"
    assert "gpu-2 -> gpu-1 mlx5_0:1" in check.detail


def test_between_the_thresholds_is_degraded():
    cfg = GpuHealthConfig(fabric_degraded_fraction=0.99, fabric_failed_fraction=0.5)
    result = RemoteResult("gpu-2", 0, report("ib_write_bw-hdr-client.txt"))
    assert judge(PLAN, result, cfg).verdict is Verdict.degraded


def test_no_report_fails_and_says_why():
    check = judge(PLAN, RemoteResult("gpu-2", 124, "", timed_out=True), GpuHealthConfig())
    assert check.verdict is Verdict.failed and "timed out" in check.detail


def test_pairs_cover_every_host_once_and_an_odd_one_too():
    hosts = [f"gpu-{i}" for i in range(1, 8)]
    pairs = pairs_of(hosts, random.Random(3))
    assert {h for pair in pairs for h in pair} == set(hosts)
    assert len(pairs) == 4 and all(server != client for server, client in pairs)
    assert pairs_of(["gpu-1"], random.Random(0)) == []


def test_plans_go_rail_to_rail_on_the_sample():
    plans = plans_for(load(SAMPLE), [("gpu-1", "gpu-2")])
    assert [(p.device, p.server_address, p.client_device, p.rate_gbps) for p in plans] == [
        ("mlx5_0", "10.50.10.11", "mlx5_0", 200),
        ("mlx5_1", "10.51.10.11", "mlx5_1", 200),
    ]


def test_off_by_default_runs_nothing():
    def never(*args, **kwargs):
        raise AssertionError("no host may be contacted")

    checks = run_fabric_check(load(SAMPLE), ["gpu-1", "gpu-2"], ssh=never)
    assert [c.verdict for c in checks] == [Verdict.skipped]
    assert "fabric_check is off" in checks[0].detail


def test_on_it_starts_each_server_before_its_client(small_cluster, load_small):
    small_cluster["group_vars"] = {"gpu_worker": {"gpu_health": {"fabric_check": True}}}
    for index in (1, 2):
        name = f"gpu-{index}"
        small_cluster["hosts"][name] = {
            "address": f"10.0.0.6{index}",
            "groups": ["gpu_worker"],
            "gpu": {"model": "H100-SXM5-80GB", "count": 8},
            "vars": {
                "fabric": {
                    "ports": [
                        {"device": "mlx5_0", "interface": "ib0", "address": f"10.9.0.{index}/24"}
                    ]
                }
            },
        }
    loaded = load_small()
    calls: list[tuple[str, str]] = []

    def ssh(loaded, host, command, timeout):
        calls.append((host, command))
        if command.split()[-1].count(".") == 3:  # the client dials an address
            return RemoteResult(host, 0, report("ib_write_bw-hdr-client.txt"))
        return RemoteResult(host, 0, "")

    checks = run_fabric_check(loaded, ["gpu-1", "gpu-2"], seed=1, ssh=ssh, sleep=lambda s: None)
    assert [c.verdict for c in checks] == [Verdict.ok]
    server, client = calls
    assert "--report_gbits" in server[1] and server[1].split()[-1] == "18515"
    assert client[1].endswith(f"10.9.0.{1 if server[0] == 'gpu-1' else 2}")
    assert server[0] != client[0]


def test_cli_refuses_when_the_check_is_off():
    result = CliRunner().invoke(app, ["health", "fabric", str(SAMPLE)])
    assert result.exit_code == 2
    assert "gpu_health.fabric_check is off" in result.output
