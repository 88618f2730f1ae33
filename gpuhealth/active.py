"""Active GPU tests (matmul burn-in, HBM bandwidth, all-reduce, DCGM diag) and what each GPU
model should reach; run with whichever of PyTorch or CuPy the node has."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol

from gpuhealth.commands import CommandRunner


@dataclass(frozen=True)
class ModelFigures:
    label: str
    pattern: str  # regex over NVML's lower-cased device name
    dense_tflops: float  # datasheet dense BF16 (FP16 for CuPy) tensor-core peak, no sparsity
    hbm_gbps: float  # datasheet memory bandwidth, GB/s
    # All-reduce bus bandwidth an 8-GPU NVLink node reaches in nccl-tests, GB/s; None where the
    # GPUs have no all-to-all NVLink (PCIe cards), so there is no figure to hold them to.
    allreduce_busbw_gbps: float | None


# Datasheet figures from NVIDIA's product pages (H100/H200/A100/L40S); all-reduce figures from
# nccl-tests results (8x H100 ~480 GB/s: NVIDIA/nccl-tests#212; 8x A100 ~230 GB/s). First match
# wins, so the narrower patterns come first ("gh200" before "h200", "nvl"/"pcie" before SXM).
MODEL_FIGURES: tuple[ModelFigures, ...] = (
    ModelFigures("GH200", r"gh200", 989.0, 4000.0, None),
    ModelFigures("H100 NVL", r"h100.*nvl", 835.0, 3900.0, None),
    ModelFigures("H100 PCIe", r"h100.*pcie", 756.0, 2000.0, None),
    ModelFigures("H100 SXM", r"h100", 989.0, 3350.0, 480.0),
    ModelFigures("H200", r"h200", 989.0, 4800.0, 480.0),
    ModelFigures("A100 PCIe 80GB", r"a100.*80gb.*pcie|a100.*pcie.*80gb", 312.0, 1935.0, None),
    ModelFigures("A100 PCIe 40GB", r"a100.*pcie", 312.0, 1555.0, None),
    ModelFigures("A100 SXM 80GB", r"a100.*sxm.*80gb", 312.0, 2039.0, 230.0),
    ModelFigures("A100 SXM 40GB", r"a100", 312.0, 1555.0, 230.0),
    ModelFigures("L40S", r"l40s", 362.0, 864.0, None),
)


def figures_for(device_name: str) -> ModelFigures | None:
    name = device_name.lower()
    return next((figures for figures in MODEL_FIGURES if re.search(figures.pattern, name)), None)


class ActiveBackend(Protocol):
    """One implementation per framework; each method runs on the GPUs and returns a rate."""

    name: str

    def matmul_tflops(self, device: int, size: int, iterations: int) -> float: ...
    def memory_bandwidth_gbps(self, device: int, size_mib: int) -> float: ...
    def allreduce_busbw_gbps(self, devices: list[int], size_mib: int) -> float: ...


def bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s: algorithm bandwidth x 2(n-1)/n, the share
    of the data each link carries, so figures compare across GPU counts."""
    return size_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9


class TorchBackend:
    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def matmul_tflops(self, device: int, size: int, iterations: int) -> float:
        torch = self.torch
        with torch.cuda.device(device):
            a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
            b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
            out = torch.empty_like(a)
            for _ in range(20):  # warm-up: cuBLAS picks its kernel, clocks ramp
                torch.matmul(a, b, out=out)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iterations):
                torch.matmul(a, b, out=out)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        return 2 * size**3 * iterations / seconds / 1e12

    def memory_bandwidth_gbps(self, device: int, size_mib: int) -> float:
        torch = self.torch
        iterations = 20
        with torch.cuda.device(device):
            src = torch.empty(size_mib << 20, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            dst.copy_(src)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iterations):
                dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        # Each copy reads and writes every byte once.
        return 2 * (size_mib << 20) * iterations / seconds / 1e9

    def allreduce_busbw_gbps(self, devices: list[int], size_mib: int) -> float:
        torch = self.torch
        from torch.cuda import nccl  # single-process, multi-GPU NCCL: no launcher needed

        iterations = 20
        count = (size_mib << 20) // 4
        tensors = [torch.ones(count, dtype=torch.float32, device=device) for device in devices]
        nccl.all_reduce(tensors)  # warm-up builds the communicators
        for device in devices:
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(iterations):
            nccl.all_reduce(tensors)
        for device in devices:
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - started) / iterations
        return bus_bandwidth(count * 4, seconds, len(devices))


class CupyBackend:
    name = "cupy"

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy

    def _timed(self, work, iterations: int) -> float:
        cupy = self.cupy
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(iterations):
            work()
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / 1e3

    def matmul_tflops(self, device: int, size: int, iterations: int) -> float:
        cupy = self.cupy
        # CuPy has no bfloat16; FP16 runs on the same tensor cores at the same dense peak.
        with cupy.cuda.Device(device):
            a = cupy.random.random((size, size), dtype=cupy.float32).astype(cupy.float16)
            b = cupy.random.random((size, size), dtype=cupy.float32).astype(cupy.float16)
            out = cupy.empty_like(a)
            for _ in range(20):
                cupy.matmul(a, b, out=out)
            seconds = self._timed(lambda: cupy.matmul(a, b, out=out), iterations)
        return 2 * size**3 * iterations / seconds / 1e12

    def memory_bandwidth_gbps(self, device: int, size_mib: int) -> float:
        cupy = self.cupy
        iterations = 20
        with cupy.cuda.Device(device):
            src = cupy.empty(size_mib << 20, dtype=cupy.uint8)
            dst = cupy.empty_like(src)
            cupy.copyto(dst, src)
            seconds = self._timed(lambda: cupy.copyto(dst, src), iterations)
        return 2 * (size_mib << 20) * iterations / seconds / 1e9

    def allreduce_busbw_gbps(self, devices: list[int], size_mib: int) -> float:
        cupy = self.cupy
        from cupy.cuda import nccl

        iterations = 20
        count = (size_mib << 20) // 4
        comms = nccl.NcclCommunicator.initAll(devices)
        buffers = []
        for device in devices:
            with cupy.cuda.Device(device):
                buffers.append(cupy.ones(count, dtype=cupy.float32))

        def all_reduce() -> None:
            nccl.groupStart()
            for comm, buffer, device in zip(comms, buffers, devices, strict=True):
                with cupy.cuda.Device(device):
                    ptr = buffer.data.ptr
                    comm.allReduce(ptr, ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
            nccl.groupEnd()

        def synchronize() -> None:
            for device in devices:
                with cupy.cuda.Device(device):
                    cupy.cuda.Device(device).synchronize()

        all_reduce()
        synchronize()
        started = time.perf_counter()
        for _ in range(iterations):
            all_reduce()
        synchronize()
        seconds = (time.perf_counter() - started) / iterations
        return bus_bandwidth(count * 4, seconds, len(devices))


class RecordedBackend:
    """Replays measurements from a recording's `active` section; an entry {"error": "..."}
    raises, as a GPU that crashes mid-test does."""

    def __init__(self, recording: dict[str, Any]) -> None:
        self.name = recording.get("backend", "recorded")
        self._recording = recording

    def _value(self, value: Any) -> float:
        if isinstance(value, dict) and "error" in value:
            raise RuntimeError(value["error"])
        return float(value)

    def matmul_tflops(self, device: int, size: int, iterations: int) -> float:
        return self._value(self._recording["matmul_tflops"][device])

    def memory_bandwidth_gbps(self, device: int, size_mib: int) -> float:
        return self._value(self._recording["memory_bandwidth_gbps"][device])

    def allreduce_busbw_gbps(self, devices: list[int], size_mib: int) -> float:
        return self._value(self._recording["allreduce_busbw_gbps"])


def detect_backend() -> tuple[ActiveBackend | None, str]:
    """PyTorch first (what training images carry), then CuPy; with neither, say why."""
    reasons = []
    try:
        import torch

        if torch.cuda.is_available():
            return TorchBackend(torch), f"torch {torch.__version__}"
        reasons.append("PyTorch is installed but sees no CUDA device")
    except ImportError:
        pass
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return CupyBackend(cupy), f"cupy {cupy.__version__}"
        reasons.append("CuPy is installed but sees no CUDA device")
    except ImportError:
        pass
    except Exception as exc:  # CuPy raises its own CUDARuntimeError without a driver
        reasons.append(f"CuPy cannot reach the GPUs: {exc}")
    return None, "; ".join(reasons) or "no PyTorch or CuPy"


@dataclass(frozen=True)
class DcgmOutcome:
    ran: bool
    statuses: dict[str, int]  # Pass/Fail/Warn/Skip -> how many test results said so
    failures: list[str]  # "<test> on GPU <n>: <info>" for each Fail
    message: str  # why it did not run, or dcgmi's own complaint


def run_dcgm_diag(run: CommandRunner, level: int) -> DcgmOutcome:
    """`dcgmi diag -r LEVEL -j`; DCGM's JSON nests results differently across versions, so
    every dict with a status-like key counts as one result."""
    timeout = {1: 120, 2: 600, 3: 1800, 4: 7200}[level]
    result = run(["dcgmi", "diag", "-r", str(level), "-j"], timeout)
    if result.rc == 127:
        return DcgmOutcome(False, {}, [], "dcgmi is not installed")
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError:
        said = (result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit {result.rc}"]
        return DcgmOutcome(False, {}, [], f"dcgmi diag gave no JSON: {said[0]}")
    statuses: dict[str, int] = {}
    failures: list[str] = []
    _collect_statuses(data, "", statuses, failures)
    return DcgmOutcome(True, statuses, failures, "")


def _collect_statuses(node: Any, test: str, statuses: dict[str, int], failures: list[str]) -> None:
    if isinstance(node, dict):
        test = str(node.get("name") or node.get("test_name") or test)
        status = node.get("status", node.get("result"))
        if isinstance(status, str) and status.capitalize() in ("Pass", "Fail", "Warn", "Skip"):
            status = status.capitalize()
            statuses[status] = statuses.get(status, 0) + 1
            if status == "Fail":
                info = node.get("info") or node.get("warnings") or ""
                gpu = node.get("gpu_id", node.get("entity_id", "?"))
                failures.append(f"{test} on GPU {gpu}: {info}".rstrip(": "))
        for value in node.values():
            _collect_statuses(value, test, statuses, failures)
    elif isinstance(node, list):
        for item in node:
            _collect_statuses(item, test, statuses, failures)
