"""Check this node's GPUs: gather NVML answers, the kernel log and active measurements (or replay
a recording of them) and judge them against what the node should have."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuhealth import expect as expectations
from gpuhealth.active import RecordedBackend, detect_backend
from gpuhealth.checks import ActiveSetup, Expectations, run_checks
from gpuhealth.commands import CommandResult, CommandRunner, run_command
from gpuhealth.nvml import GpuQueries, NvmlError, PynvmlGpus, RecordedGpus, record
from gpuhealth.results import NodeReport
from gpuhealth.xid import KernelLog, read_kernel_log
from roles.gpu_health.config import GpuHealthConfig


@dataclass(frozen=True)
class NodeRequest:
    host: str | None = None  # defaults to this machine's short host name
    expect_count: int | None = None
    expect_model: str | None = None
    expect_driver: str | None = None
    cluster: Path | None = None  # inventory to take expectations and settings from
    expect_file: Path | None = None  # or the expectations file rendered for the cluster
    active: bool = True
    require_active: bool = False
    dcgm: bool = True
    dcgm_level: int | None = None  # overrides the config's level (the DaemonSet's preflight)
    replay: Path | None = None  # a recording to judge instead of this node's GPUs


class _FailingGpus:
    """Stands in when NVML cannot even start, so the report says so as a failed check."""

    def __init__(self, error: NvmlError) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise self.error

        return refuse


def _replayed_command(argv: list[str], timeout: float) -> CommandResult:
    """A recording holds no DCGM run: report dcgmi as absent rather than run the local one."""
    return CommandResult(127, "", f"{argv[0]}: not in the recording")


def resolve(request: NodeRequest) -> tuple[str, Expectations, GpuHealthConfig]:
    """Expectations from the inventory or the expectations file, then explicit flags on top."""
    host = request.host or socket.gethostname().split(".", 1)[0]
    expect, cfg = Expectations(), GpuHealthConfig()
    if request.cluster is not None:
        from inventory.loader import load

        expect, cfg = expectations.from_cluster(load(request.cluster), host)
    elif request.expect_file is not None:
        expect, cfg = expectations.from_file(request.expect_file, host)
    expect = replace(
        expect,
        count=request.expect_count if request.expect_count is not None else expect.count,
        model=request.expect_model or expect.model,
        driver=request.expect_driver or expect.driver,
    )
    if request.dcgm_level is not None:
        cfg = cfg.model_copy(update={"dcgm_level": request.dcgm_level})
    return host, expect, cfg


def check_node(request: NodeRequest, run: CommandRunner = run_command) -> NodeReport:
    host, expect, cfg = resolve(request)
    if request.replay is not None:
        recording = json.loads(request.replay.read_text())
        gpus: GpuQueries = RecordedGpus(recording)
        kernel_log = KernelLog(f"recording {request.replay.name}", recording.get("kernel_log"))
        backend = RecordedBackend(recording["active"]) if recording.get("active") else None
        active = ActiveSetup(
            request.active, backend, "the recording has no active measurements",
            request.require_active, request.dcgm,
        )  # fmt: skip
        return run_checks(host, gpus, kernel_log, expect, cfg, active, _replayed_command)
    try:
        gpus = PynvmlGpus()
    except NvmlError as exc:
        gpus = _FailingGpus(exc)  # type: ignore[assignment]
    backend, why = detect_backend() if request.active else (None, "passive only")
    active = ActiveSetup(request.active, backend, why, request.require_active, request.dcgm)
    try:
        return run_checks(host, gpus, read_kernel_log(run), expect, cfg, active, run)
    finally:
        if isinstance(gpus, PynvmlGpus):
            gpus.close()


def record_node(run: CommandRunner = run_command) -> dict[str, Any]:
    """This node's NVML answers and kernel log, in the form `check_node(replay=...)` reads."""
    gpus = PynvmlGpus()
    try:
        recording = record(gpus)
    finally:
        gpus.close()
    log = read_kernel_log(run)
    recording["kernel_log"] = log.lines
    recording["provenance"] = f"recorded by gpuinfra health record on {socket.gethostname()}"
    return recording
