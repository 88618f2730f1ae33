"""GPU health reports: the Prometheus textfile format, JSON round trips and atomic writes."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from gpuhealth.node import NodeRequest, check_node
from gpuhealth.report import to_json, to_prometheus, write_atomically
from gpuhealth.results import CheckResult, NodeReport, Verdict

RECORDINGS = Path(__file__).parent / "recordings" / "gpu"

# One sample of the text exposition format: name, optional labels, a float value.
SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r'(?:\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)\})?'
    r" (?P<value>-?[0-9.e+-]+|NaN|[+-]Inf)$"
)


def failing_report() -> NodeReport:
    """Recording (hand-written): the node with an Xid 79 and an uncorrectable ECC error."""
    return check_node(
        NodeRequest(host="gpu-1", expect_count=8, replay=RECORDINGS / "h100-ecc-xid79.json")
    )


def parse_textfile(text: str) -> tuple[dict[str, str], list[tuple[str, str, float]]]:
    """Validate every line; return TYPE per metric and the samples."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    helps: set[str] = set()
    samples = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in helps, f"HELP twice for {name}"
            helps.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name not in types, f"TYPE twice for {name}"
            assert kind in ("gauge", "counter")
            types[name] = kind
        else:
            match = SAMPLE.match(line)
            assert match, f"not a valid sample line: {line!r}"
            assert match["name"] in types, f"sample before its TYPE: {line!r}"
            samples.append((match["name"], match["labels"] or "", float(match["value"])))
    assert helps == set(types)
    return types, samples


def test_prometheus_textfile_is_valid_and_says_what_failed():
    """Recording (hand-written): the failing H100 node, exported for node exporter."""
    types, samples = parse_textfile(to_prometheus(failing_report()))
    assert set(types) == {
        "gpuinfra_gpu_health_verdict",
        "gpuinfra_gpu_health_check_verdict",
        "gpuinfra_gpu_health_check_value",
        "gpuinfra_gpu_health_last_run_timestamp_seconds",
        "gpuinfra_gpu_health_duration_seconds",
    }
    values = {(name, labels): value for name, labels, value in samples}
    assert values[("gpuinfra_gpu_health_verdict", 'backend="torch"')] == 2
    assert values[("gpuinfra_gpu_health_check_verdict", 'check="ecc",gpu="5"')] == 2
    assert values[("gpuinfra_gpu_health_check_verdict", 'check="ecc",gpu="0"')] == 0
    assert values[("gpuinfra_gpu_health_check_verdict", 'check="xid"')] == 2
    assert values[("gpuinfra_gpu_health_check_verdict", 'check="dcgm"')] == -1
    assert values[("gpuinfra_gpu_health_check_value", 'check="ecc",gpu="5",unit="errors"')] == 2
    matmul = values[("gpuinfra_gpu_health_check_value", 'check="matmul",gpu="0",unit="TFLOP/s"')]
    assert matmul == 731.4


def test_prometheus_label_values_are_escaped():
    report = NodeReport(host="n", checks=[CheckResult('we"ird\\name\n', Verdict.ok, "1", "1")])
    text = to_prometheus(report)
    parse_textfile(text)
    assert 'check="we\\"ird\\\\name\\n"' in text


def test_json_round_trips():
    """Recording (hand-written): the failing node's report through JSON and back."""
    report = failing_report()
    data = json.loads(to_json(report))
    assert data["verdict"] == "failed" and data["host"] == "gpu-1"
    first = data["checks"][0]
    assert set(first) == {
        "check", "verdict", "measured", "threshold", "gpu", "value", "unit", "detail"
    }  # fmt: skip
    again = NodeReport.from_dict(data)
    assert again.verdict is Verdict.failed
    assert again.checks == report.checks


def test_textfile_is_replaced_atomically(tmp_path):
    target = tmp_path / "collector" / "gpu_health.prom"
    write_atomically(target, "old 1\n")
    write_atomically(target, "new 2\n")
    assert target.read_text() == "new 2\n"
    # Readable by node exporter's own user, and no temporary file left for it to trip over.
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["gpu_health.prom"]


def test_failed_write_leaves_the_old_textfile(tmp_path, monkeypatch):
    target = tmp_path / "gpu_health.prom"
    write_atomically(target, "old 1\n")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("toolkit.statefiles.os.replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, "new 2\n")
    assert target.read_text() == "old 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_health.prom"]
