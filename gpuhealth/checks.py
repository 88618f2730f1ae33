"""The node check engine: NVML answers, kernel log and active measurements in, verdicts out."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuhealth.active import ActiveBackend, figures_for, run_dcgm_diag
from gpuhealth.commands import CommandRunner
from gpuhealth.nvml import GpuQueries, NvmlError
from gpuhealth.results import CheckResult, NodeReport, Verdict
from gpuhealth.xid import KernelLog, XidAction, parse_xids, summarise
from roles.gpu_health.config import GpuHealthConfig

OK, DEGRADED, FAILED, SKIPPED = Verdict.ok, Verdict.degraded, Verdict.failed, Verdict.skipped

# NVML clock event reasons (nvmlClocksEventReason*): the hardware ones halve clocks or worse and
# make the GPU a straggler that holds back every rank of a synchronous job.
HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x8, 0x20, 0x40, 0x80
THROTTLE_NAMES = {
    0x1: "idle",
    0x2: "applications clocks",
    0x4: "sw power cap",
    HW_SLOWDOWN: "hw slowdown",
    0x10: "sync boost",
    SW_THERMAL: "sw thermal",
    HW_THERMAL: "hw thermal",
    HW_POWER_BRAKE: "hw power brake",
    0x100: "display clocks",
}


@dataclass(frozen=True)
class Expectations:
    """What this node should have; None where nobody said (the check then only reports)."""

    count: int | None = None
    model: str | None = None
    driver: str | None = None


@dataclass(frozen=True)
class ActiveSetup:
    run: bool = True  # False for --passive-only (the DaemonSet's periodic loop)
    backend: ActiveBackend | None = None
    why_none: str = "no PyTorch or CuPy"  # shown as the skipped checks' reason
    require: bool = False  # skipped active tests fail the node (preflight must prove the GPUs)
    dcgm: bool = True


def run_checks(
    host: str,
    gpus: GpuQueries,
    kernel_log: KernelLog,
    expect: Expectations,
    cfg: GpuHealthConfig,
    active: ActiveSetup,
    run: CommandRunner,
    clock: Callable[[], float] = time.time,
) -> NodeReport:
    report = NodeReport(host=host, started=clock())
    checks = report.checks
    try:
        count = gpus.device_count()
        driver = gpus.driver_version()
    except NvmlError as exc:
        checks.append(CheckResult("nvml", FAILED, "no answer", "NVML answers", detail=str(exc)))
        checks.append(check_xids(kernel_log))
        report.duration_s = clock() - report.started
        return report
    checks.append(check_driver(driver, expect.driver))
    checks.append(check_count(count, expect.count))
    healthy: list[int] = []  # GPUs that answered NVML; only those are worth an active test
    names: dict[int, str] = {}
    for index in range(count):
        try:
            names[index] = gpus.name(index)
            per_gpu = [
                check_model(index, names[index], expect.model),
                check_persistence(index, gpus.persistence_mode(index)),
                check_ecc(index, gpus, cfg),
                check_memory_repair(index, gpus),
                check_throttle(index, gpus.clocks_event_reasons(index), gpus.temperature_c(index)),
                check_pcie(index, gpus, cfg),
                check_nvlink(index, gpus.nvlink_states(index), cfg),
            ]
        except NvmlError as exc:
            checks.append(
                CheckResult(
                    "gpu",
                    FAILED,
                    "not answering",
                    "answers NVML",
                    gpu=index,
                    detail=f"{exc}: a lost GPU (Xid 79) needs the node drained and rebooted",
                )  # fmt: skip
            )
            continue
        checks.extend(per_gpu)
        healthy.append(index)
    checks.append(check_xids(kernel_log))
    if active.run:
        report.backend = active.backend.name if active.backend else "none"
        checks.extend(active_checks(healthy, names, cfg, active, run))
    report.duration_s = clock() - report.started
    return report


def check_driver(driver: str, expected: str | None) -> CheckResult:
    if expected is None:
        return CheckResult("driver", OK, driver, "not set", detail="no expected driver given")
    verdict = OK if driver == expected else DEGRADED
    detail = "" if verdict is OK else "not the inventory's pinned driver: CUDA/NCCL may differ"
    return CheckResult("driver", verdict, driver, expected, detail=detail)


def check_count(count: int, expected: int | None) -> CheckResult:
    measured = f"{count} GPUs"
    if expected is None:
        return CheckResult("gpu_count", OK, measured, "not set", value=count)
    if count < expected:
        verdict, detail = FAILED, "GPUs missing: fallen off the bus, or not seen by the driver"
    elif count > expected:
        verdict, detail = DEGRADED, "more GPUs than the inventory says: fix the inventory"
    else:
        verdict, detail = OK, ""
    return CheckResult("gpu_count", verdict, measured, f"{expected}", value=count, detail=detail)


def model_matches(name: str, expected: str) -> bool:
    """`H100` and `H100-SXM5-80GB` both match NVML's `NVIDIA H100 80GB HBM3`: the family token
    (letters then digits) of the expected model must appear as a word in the device name."""
    tokens = re.findall(r"[a-z]+\d+[a-z]*", expected.lower())
    words = set(re.findall(r"[a-z0-9]+", name.lower()))
    return bool(tokens) and tokens[0] in words


def check_model(index: int, name: str, expected: str | None) -> CheckResult:
    if expected is None:
        return CheckResult("model", OK, name, "not set", gpu=index)
    verdict = OK if model_matches(name, expected) else FAILED
    detail = "" if verdict is OK else "a different GPU model than the inventory says"
    return CheckResult("model", verdict, name, expected, gpu=index, detail=detail)


def check_persistence(index: int, enabled: bool | None) -> CheckResult:
    if enabled is None:
        return CheckResult("persistence", SKIPPED, "unsupported", "on", gpu=index)
    return CheckResult(
        "persistence",
        OK if enabled else DEGRADED,
        "on" if enabled else "off",
        "on",
        gpu=index,
        value=float(enabled),
        # Without it the driver tears GPU state down between clients: slow starts, lost errors.
        detail="" if enabled else "enable nvidia-persistenced",
    )


def check_ecc(index: int, gpus: GpuQueries, cfg: GpuHealthConfig) -> CheckResult:
    volatile = gpus.ecc_uncorrected(index, volatile=True)
    aggregate = gpus.ecc_uncorrected(index, volatile=False)
    threshold = (
        f"volatile <= {cfg.ecc_volatile_uncorrectable_max}, "
        f"aggregate <= {cfg.ecc_aggregate_uncorrectable_max}"
    )
    if volatile is None:
        return CheckResult(
            "ecc", SKIPPED, "unavailable", threshold, gpu=index, detail="ECC off or unsupported"
        )
    measured = f"volatile {volatile}, aggregate {aggregate if aggregate is not None else '?'}"
    if volatile > cfg.ecc_volatile_uncorrectable_max:
        verdict, detail = FAILED, "uncorrectable ECC errors since the last reset: drain and reset"
    elif aggregate is not None and aggregate > cfg.ecc_aggregate_uncorrectable_max:
        verdict, detail = DEGRADED, "uncorrectable ECC errors in the GPU's lifetime: watch it"
    else:
        verdict, detail = OK, ""
    return CheckResult(
        "ecc", verdict, measured, threshold, gpu=index, value=volatile, unit="errors", detail=detail
    )


def check_memory_repair(index: int, gpus: GpuQueries) -> CheckResult:
    """Row remapping (Ampere on) or page retirement (before): a pending repair needs a reset,
    which needs the GPU idle, which needs the node drained; a failed one needs an RMA."""
    rows = gpus.row_remapping(index)
    if rows is not None:
        measured = (
            f"{rows.uncorrectable} uncorrectable + {rows.correctable} correctable rows remapped"
            + (", pending" if rows.pending else "")
            + (", FAILED" if rows.failed else "")
        )
        if rows.failed:
            verdict, detail = FAILED, "row remapping failed: no spare rows left, RMA the GPU"
        elif rows.pending:
            verdict, detail = FAILED, "a row remap is pending: drain and reset the GPU to apply it"
        else:
            verdict, detail = OK, ""
        return CheckResult(
            "memory_repair", verdict, measured, "no pending or failed remap", gpu=index,
            value=rows.uncorrectable + rows.correctable, unit="rows", detail=detail,
        )  # fmt: skip
    pages = gpus.retired_pages(index)
    if pages is None:
        return CheckResult("memory_repair", SKIPPED, "unsupported", "-", gpu=index)
    measured = f"{pages.double_bit} double-bit + {pages.single_bit} single-bit pages retired"
    verdict = FAILED if pages.pending else OK
    detail = "a page retirement is pending: drain and reset the GPU" if pages.pending else ""
    return CheckResult(
        "memory_repair", verdict, measured + (", pending" if pages.pending else ""),
        "no pending retirement", gpu=index, value=pages.double_bit + pages.single_bit,
        unit="pages", detail=detail,
    )  # fmt: skip


def check_throttle(index: int, reasons: int | None, temperature: int | None) -> CheckResult:
    threshold = "no hw slowdown, no thermal slowdown"
    if reasons is None:
        return CheckResult("throttle", SKIPPED, "unsupported", threshold, gpu=index)
    active = [name for bit, name in THROTTLE_NAMES.items() if reasons & bit]
    measured = ", ".join(active) or "none"
    if temperature is not None:
        measured += f" at {temperature} C"
    if reasons & (HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE):
        verdict = FAILED
        detail = "hardware clock slowdown: cooling or power delivery fault; a straggler node"
    elif reasons & SW_THERMAL:
        verdict, detail = DEGRADED, "driver lowered clocks for temperature: check airflow"
    else:
        verdict, detail = OK, ""
    return CheckResult(
        "throttle", verdict, measured, threshold, gpu=index, value=reasons, unit="bitmask",
        detail=detail,
    )  # fmt: skip


def check_pcie(index: int, gpus: GpuQueries, cfg: GpuHealthConfig) -> CheckResult:
    link = gpus.pcie_link(index)
    if link is None:
        return CheckResult("pcie", SKIPPED, "unsupported", "-", gpu=index)
    measured = f"gen{link.gen} x{link.width}"
    threshold = f"gen{link.max_gen} x{link.max_width}"
    busy = gpus.performance_state(index) == 0
    problems = []
    # Width is judged against the maximum whatever the generation: lanes do not come back at
    # idle, so a lost lane shows at gen1 as plainly as at full speed.
    if link.width < link.max_width:
        problems.append(f"width x{link.width} of x{link.max_width}: reseat or replace the riser")
    if link.gen < link.max_gen and busy:
        problems.append(f"gen{link.gen} of gen{link.max_gen} while busy (P0)")
    if link.gen < link.max_gen and not busy:
        # GPUs train the link generation down at idle to save power; it only tells under load.
        measured += " (idle)"
        if not problems:
            return CheckResult(
                "pcie", OK, measured, threshold, gpu=index, value=link.width,
                unit="lanes", detail="link generation drops at idle; width checked",
            )  # fmt: skip
    verdict = Verdict(cfg.pcie_downgrade_verdict) if problems else OK
    return CheckResult(
        "pcie", verdict, measured, threshold, gpu=index, value=link.width, unit="lanes",
        detail="; ".join(problems),
    )  # fmt: skip


def check_nvlink(index: int, states: list[bool] | None, cfg: GpuHealthConfig) -> CheckResult:
    if states is None:
        return CheckResult("nvlink", SKIPPED, "no NVLink", "-", gpu=index)
    down = [link for link, up in enumerate(states) if not up]
    measured = f"{len(states) - len(down)} of {len(states)} up"
    verdict = FAILED if len(down) > cfg.nvlink_links_down_max else OK
    detail = f"links down: {', '.join(map(str, down))}" if down else ""
    return CheckResult(
        "nvlink", verdict, measured, f"<= {cfg.nvlink_links_down_max} down", gpu=index,
        value=len(states) - len(down), unit="links", detail=detail,
    )  # fmt: skip


def check_xids(kernel_log: KernelLog) -> CheckResult:
    threshold = "no drain-class Xid since boot"
    if kernel_log.lines is None:
        # Unread is not clean: say so, and keep the node from looking healthy.
        return CheckResult(
            "xid", DEGRADED, "kernel log unreadable", threshold,
            detail=f"{kernel_log.source}; run as root or mount /dev/kmsg",
        )  # fmt: skip
    events = parse_xids(kernel_log.lines)
    actions = {event.action for event in events}
    if XidAction.drain in actions:
        verdict = FAILED
    elif XidAction.watch in actions:
        verdict = DEGRADED
    else:
        verdict = OK
    meanings = sorted({f"{e.code}: {e.meaning} ({e.action.value})" for e in events})
    return CheckResult(
        "xid", verdict, summarise(events) or "none", threshold, value=len(events),
        unit="events", detail="; ".join(meanings),
    )  # fmt: skip


def active_checks(
    gpus: list[int],
    names: dict[int, str],
    cfg: GpuHealthConfig,
    active: ActiveSetup,
    run: CommandRunner,
) -> list[CheckResult]:
    results: list[CheckResult] = []
    backend = active.backend
    if backend is None:
        verdict = FAILED if active.require else SKIPPED
        why = f"skipped: {active.why_none}"
        detail = "preflight requires the active tests" if active.require else ""
        results += [
            CheckResult(check, verdict, why, "-", detail=detail)
            for check in ("matmul", "membw", "allreduce")
        ]
    else:
        for index in gpus:
            results.append(measure_matmul(backend, index, names[index], cfg))
            results.append(measure_membw(backend, index, names[index], cfg))
        results.append(measure_allreduce(backend, gpus, names, cfg))
    if active.dcgm:
        results.append(check_dcgm(run, cfg.dcgm_level))
    return results


def rate_verdict(
    check: str,
    measure: Callable[[], float],
    expected: float | None,
    degraded_fraction: float,
    failed_fraction: float,
    unit: str,
    gpu: int | None,
    what: str,
) -> CheckResult:
    """Run one measurement and hold it against fractions of the model's expected figure."""
    try:
        value = measure()
    except Exception as exc:  # a CUDA error mid-test is the GPU failing the test
        return CheckResult(check, FAILED, "error", "-", gpu=gpu, unit=unit, detail=str(exc))
    measured = f"{value:.0f} {unit}"
    if expected is None:
        return CheckResult(
            check, SKIPPED, measured, f"no expected figure for {what}", gpu=gpu, value=value,
            unit=unit, detail="add the model to MODEL_FIGURES to judge it",
        )  # fmt: skip
    floor, hard_floor = expected * degraded_fraction, expected * failed_fraction
    if value < hard_floor:
        verdict = FAILED
    elif value < floor:
        verdict = DEGRADED
    else:
        verdict = OK
    threshold = f">= {floor:.0f} {unit} ({degraded_fraction:.0%} of {expected:.0f})"
    return CheckResult(
        check, verdict, measured, threshold, gpu=gpu, value=value, unit=unit,
        detail="" if verdict is OK else f"{value / expected:.0%} of the {what} figure",
    )  # fmt: skip


def measure_matmul(backend: ActiveBackend, index: int, name: str, cfg: GpuHealthConfig):
    figures = figures_for(name)
    return rate_verdict(
        "matmul",
        lambda: backend.matmul_tflops(index, cfg.matmul_size, cfg.matmul_iterations),
        figures.dense_tflops if figures else None,
        cfg.matmul_degraded_fraction,
        cfg.matmul_failed_fraction,
        "TFLOP/s",
        index,
        figures.label if figures else name,
    )


def measure_membw(backend: ActiveBackend, index: int, name: str, cfg: GpuHealthConfig):
    figures = figures_for(name)
    return rate_verdict(
        "membw",
        lambda: backend.memory_bandwidth_gbps(index, cfg.membw_size_mib),
        figures.hbm_gbps if figures else None,
        cfg.membw_degraded_fraction,
        cfg.membw_failed_fraction,
        "GB/s",
        index,
        figures.label if figures else name,
    )


def measure_allreduce(
    backend: ActiveBackend, gpus: list[int], names: dict[int, str], cfg: GpuHealthConfig
) -> CheckResult:
    if len(gpus) < 2:
        return CheckResult("allreduce", SKIPPED, f"{len(gpus)} GPU", "-", detail="needs 2 GPUs")
    figures = figures_for(names[gpus[0]])
    expected = figures.allreduce_busbw_gbps if figures else None
    if expected is not None and len(gpus) != 8:
        expected = None  # the figures are for 8-GPU NVLink nodes; fewer GPUs reach other rates
    return rate_verdict(
        "allreduce",
        lambda: backend.allreduce_busbw_gbps(gpus, cfg.allreduce_size_mib),
        expected,
        cfg.allreduce_degraded_fraction,
        cfg.allreduce_failed_fraction,
        "GB/s",
        None,
        f"{len(gpus)}x {figures.label if figures else names[gpus[0]]}",
    )


def check_dcgm(run: CommandRunner, level: int) -> CheckResult:
    outcome = run_dcgm_diag(run, level)
    threshold = f"dcgmi diag -r {level}: no Fail"
    if not outcome.ran:
        verdict = SKIPPED if "not installed" in outcome.message else DEGRADED
        return CheckResult("dcgm", verdict, outcome.message, threshold)
    measured = ", ".join(f"{count} {status}" for status, count in sorted(outcome.statuses.items()))
    if outcome.statuses.get("Fail"):
        verdict = FAILED
    elif outcome.statuses.get("Warn"):
        verdict = DEGRADED
    elif not outcome.statuses:
        verdict = DEGRADED  # JSON without a single result: cannot call it a pass
    else:
        verdict = OK
    return CheckResult(
        "dcgm", verdict, measured or "no results", threshold, detail="; ".join(outcome.failures)
    )
