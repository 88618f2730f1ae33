"""`gpuinfra health run` through the CLI: exit codes, JSON and textfile output, input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app

RECORDINGS = Path(__file__).parent / "recordings" / "gpu"
runner = CliRunner()


def run_health(*args: str):
    return runner.invoke(app, ["health", "run", *args])


@pytest.mark.parametrize(
    ("recording", "code"),
    [
        ("h100-healthy.json", ExitCode.OK),
        ("h100-throttled.json", ExitCode.DEGRADED),
        ("h100-pcie-x8.json", ExitCode.DEGRADED),
        ("h100-ecc-xid79.json", ExitCode.UNHEALTHY),
    ],
)
def test_exit_codes(recording, code):
    """Recordings (hand-written): each of the four recorded H100 nodes."""
    result = run_health("--replay", str(RECORDINGS / recording), "--host", "gpu-1")
    assert result.exit_code == code, result.output
    assert "gpu-1" in result.output  # the table's title


def test_json_output_and_textfile(tmp_path):
    """Recording (hand-written): the Xid 79 node, as JSON on stdout and a textfile on disk."""
    textfile = tmp_path / "textfile" / "gpu_health.prom"
    result = run_health(
        "--replay", str(RECORDINGS / "h100-ecc-xid79.json"), "--host", "gpu-1",
        "--expect-count", "8", "--format", "json", "--textfile", str(textfile),
    )  # fmt: skip
    assert result.exit_code == ExitCode.UNHEALTHY
    data = json.loads(result.stdout)
    assert data["verdict"] == "failed"
    failed = {(c["check"], c["gpu"]) for c in data["checks"] if c["verdict"] == "failed"}
    assert {("gpu", 3), ("ecc", 5), ("xid", None)} <= failed
    assert "gpuinfra_gpu_health_verdict" in textfile.read_text()


def test_expectations_from_the_cluster_file(tmp_path):
    """Recording (hand-written): the healthy node held to an inventory that wants 4 A100s."""
    cluster = {
        "name": "tiny",
        "domain": "tiny.test",
        "networks": {"node": "10.0.0.0/24", "admin": ["192.0.2.0/24"]},
        "hosts": {
            "gpu-1": {
                "address": "10.0.0.10",
                "groups": ["gpu_worker"],
                "gpu": {"model": "A100-SXM4-80GB", "count": 4},
            }
        },
    }
    path = tmp_path / "cluster.yml"
    path.write_text(yaml.safe_dump(cluster))
    replay = str(RECORDINGS / "h100-healthy.json")
    args = ["--replay", replay, "--cluster", str(path), "--format", "json"]
    result = run_health(*args, "--host", "gpu-1")
    assert result.exit_code == ExitCode.UNHEALTHY
    data = json.loads(result.stdout)
    verdicts = {(c["check"], c["gpu"]): c["verdict"] for c in data["checks"]}
    assert verdicts[("gpu_count", None)] == "degraded"  # 8 present, 4 expected
    assert verdicts[("model", 0)] == "failed"
    # Explicit flags win over the inventory.
    fixed = run_health(*args, "--host", "gpu-1", "--expect-count", "8", "--expect-model", "H100")
    assert fixed.exit_code == ExitCode.OK, fixed.output
    unknown = run_health(*args, "--host", "gpu-9")
    assert unknown.exit_code == ExitCode.BAD_INPUT
    assert "gpu-9 is not a gpu_worker" in unknown.stderr


def test_conflicting_inputs_are_refused(tmp_path):
    result = run_health("--cluster", "a.yml", "--expect-file", "b.json")
    assert result.exit_code == ExitCode.BAD_INPUT
    missing = run_health("--replay", str(tmp_path / "nope.json"))
    assert missing.exit_code == ExitCode.BAD_INPUT
    assert "cannot read input" in missing.stderr


def test_passive_only_runs_no_active_tests():
    """Recording (hand-written): the healthy node, passive checks only."""
    result = run_health(
        "--replay", str(RECORDINGS / "h100-healthy.json"), "--passive-only", "--format", "json"
    )
    assert result.exit_code == ExitCode.OK
    checks = {c["check"] for c in json.loads(result.stdout)["checks"]}
    assert checks.isdisjoint({"matmul", "membw", "allreduce", "dcgm"})
    assert {"ecc", "xid", "pcie", "nvlink"} <= checks
