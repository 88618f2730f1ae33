"""The disk gate: etcd's fio fdatasync test on a member's data directory, p99 against a limit.

etcd's hardware guide: WAL fsync p99 must stay under 10 ms, measured with
`fio --rw=write --ioengine=sync --fdatasync=1 --size=22m --bs=2300` (the WAL's write pattern).
The deploy runs it before etcd is installed or started on a node; `gpuinfra etcd check-disk`
runs it on demand.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass

JOB = "gpuinfra-etcd-disk-gate"
CHECK_NAME = "etcd disk gate"


@dataclass(frozen=True)
class GateResult:
    host: str
    path: str
    p99_ms: float | None
    limit_ms: float
    status: str  # pass, fail, override (failed, run anyway), error (fio did not run)
    detail: str

    def to_check(self) -> dict:
        return {"check": CHECK_NAME, **asdict(self)}


def fio_command(directory: str) -> str:
    """fio writing etcd's WAL pattern into the directory, JSON on stdout, its file removed."""
    quoted = shlex.quote(directory)
    return (
        f"mkdir -p {quoted} && fio --name={JOB} --directory={quoted} --rw=write "
        "--ioengine=sync --fdatasync=1 --size=22m --bs=2300 --output-format=json; "
        f"rc=$?; rm -f {quoted}/{JOB}*; exit $rc"
    )


def parse_p99_ms(output: str) -> float:
    """p99 fdatasync latency in ms from fio's JSON (jobs[0].sync.lat_ns.percentile)."""
    start = output.find("{")
    if start < 0:
        raise ValueError("fio printed no JSON")
    data = json.loads(output[start:])
    percentiles = data["jobs"][0]["sync"]["lat_ns"]["percentile"]
    return percentiles["99.000000"] / 1e6


def judge(host: str, path: str, output: str | None, ok: bool, limit_ms: float,
          override: bool) -> GateResult:  # fmt: skip
    """Turn one fio run into a verdict; an override turns a failure into "override"."""
    if not ok or output is None:
        tail = (output or "").strip().splitlines()[-1:] or ["no output"]
        return GateResult(host, path, None, limit_ms, "error", f"fio failed: {tail[0]}")
    try:
        p99 = parse_p99_ms(output)
    except (ValueError, KeyError, IndexError) as exc:
        return GateResult(host, path, None, limit_ms, "error", f"unreadable fio output: {exc}")
    if p99 < limit_ms:
        return GateResult(
            host, path, p99, limit_ms, "pass", f"fsync p99 {p99:.3f} ms < {limit_ms:g} ms"
        )
    verdict = "override" if override else "fail"
    detail = f"fsync p99 {p99:.3f} ms >= {limit_ms:g} ms on {host}:{path}"
    if override:
        detail += " (disk_gate_override: running etcd anyway)"
    return GateResult(host, path, p99, limit_ms, verdict, detail)
