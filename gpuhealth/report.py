"""Node reports as JSON and as a Prometheus textfile for node exporter's textfile collector."""

from __future__ import annotations

import json
from pathlib import Path

from gpuhealth.results import NodeReport, Verdict
from toolkit import statefiles

# Numeric verdicts for metrics: higher is worse; skipped is apart so alerts on > 0 ignore it.
VERDICT_VALUE = {Verdict.ok: 0, Verdict.degraded: 1, Verdict.failed: 2, Verdict.skipped: -1}


def to_json(report: NodeReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)


def _label(value: str) -> str:
    """Escape a label value the way the text exposition format requires."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str | None) -> str:
    pairs = [f'{key}="{_label(value)}"' for key, value in labels.items() if value is not None]
    return "{" + ",".join(pairs) + "}"


def to_prometheus(report: NodeReport) -> str:
    """The text exposition format: HELP and TYPE once per metric, then its samples."""
    node = report.verdict
    lines = [
        "# HELP gpuinfra_gpu_health_verdict Worst GPU health verdict on the node: "
        "0 ok, 1 degraded, 2 failed, -1 nothing checked.",
        "# TYPE gpuinfra_gpu_health_verdict gauge",
        f"gpuinfra_gpu_health_verdict{_labels(backend=report.backend)} {VERDICT_VALUE[node]}",
        "# HELP gpuinfra_gpu_health_check_verdict Verdict of one check: "
        "0 ok, 1 degraded, 2 failed, -1 skipped.",
        "# TYPE gpuinfra_gpu_health_check_verdict gauge",
    ]
    for check in report.checks:
        gpu = None if check.gpu is None else str(check.gpu)
        labels = _labels(check=check.check, gpu=gpu)
        lines.append(f"gpuinfra_gpu_health_check_verdict{labels} {VERDICT_VALUE[check.verdict]}")
    lines += [
        "# HELP gpuinfra_gpu_health_check_value Measured value of one check, in the unit label.",
        "# TYPE gpuinfra_gpu_health_check_value gauge",
    ]
    for check in report.checks:
        if check.value is None:
            continue
        gpu = None if check.gpu is None else str(check.gpu)
        labels = _labels(check=check.check, gpu=gpu, unit=check.unit or None)
        lines.append(f"gpuinfra_gpu_health_check_value{labels} {check.value:g}")
    lines += [
        "# HELP gpuinfra_gpu_health_last_run_timestamp_seconds When the checks started.",
        "# TYPE gpuinfra_gpu_health_last_run_timestamp_seconds gauge",
        f"gpuinfra_gpu_health_last_run_timestamp_seconds {report.started:.3f}",
        "# HELP gpuinfra_gpu_health_duration_seconds How long the checks took.",
        "# TYPE gpuinfra_gpu_health_duration_seconds gauge",
        f"gpuinfra_gpu_health_duration_seconds {report.duration_s:.3f}",
    ]
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Write beside the target and rename over it: node exporter must never read half a file.

    The temporary name (".NAME.PID.partial") does not end in .prom, so the collector ignores it
    while it is written; 0644 because node exporter usually runs as its own user.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    statefiles.write_atomically(path, text.encode(), 0o644)
