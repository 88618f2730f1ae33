"""The GPU check engine against recorded NVML answers and kernel logs, and the Xid classifier."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuhealth.active import detect_backend, figures_for
from gpuhealth.checks import (
    ActiveSetup,
    Expectations,
    check_dcgm,
    check_xids,
    model_matches,
    rate_verdict,
    run_checks,
)
from gpuhealth.commands import CommandResult
from gpuhealth.node import NodeRequest, check_node
from gpuhealth.nvml import NvmlError, PynvmlGpus, RecordedGpus, record
from gpuhealth.results import Verdict
from gpuhealth.xid import KernelLog, XidAction, parse_xids, read_kernel_log
from roles.gpu_health.config import GpuHealthConfig

RECORDINGS = Path(__file__).parent / "recordings" / "gpu"
H100_NODE = Expectations(count=8, model="H100-SXM5-80GB", driver="550.163.01")


def judge(name: str, **request) -> object:
    """Judge one recording as an 8x H100 node expecting the sample inventory's driver."""
    defaults = dict(
        host="gpu-1",
        expect_count=8,
        expect_model="H100-SXM5-80GB",
        expect_driver="550.163.01",
        replay=RECORDINGS / name,
    )
    return check_node(NodeRequest(**{**defaults, **request}))


def by_key(report) -> dict[tuple[str, int | None], object]:
    return {(check.check, check.gpu): check for check in report.checks}


def no_dcgm(argv: list[str], timeout: float) -> CommandResult:
    return CommandResult(127, "", "dcgmi: not found")


def test_healthy_h100_node_passes_every_check():
    """Recording (hand-written): 8x H100 SXM at idle, clean counters, clean kernel log."""
    report = judge("h100-healthy.json")
    assert report.verdict is Verdict.ok
    assert report.backend == "torch"
    not_ok = [c for c in report.checks if c.verdict is not Verdict.ok]
    # dcgmi is not part of a recording: its absence is said, as skipped.
    assert [(c.check, c.verdict) for c in not_ok] == [("dcgm", Verdict.skipped)]
    checks = by_key(report)
    for gpu in range(8):
        for name in ("model", "persistence", "ecc", "memory_repair", "throttle", "pcie", "nvlink"):
            assert (name, gpu) in checks
        assert checks[("matmul", gpu)].value == pytest.approx(730, abs=10)
    # Idle GPUs train PCIe down to gen1: not a downgrade, and the report says why.
    assert "idle" in checks[("pcie", 0)].measured
    assert checks[("allreduce", None)].verdict is Verdict.ok


def test_a_real_h200_recording_passes_and_a_wrong_model_fails_it():
    """Recording captured from hardware (a lent 1x H200, scripts/gpu_device_check.py): the live
    NVML answers, kernel log and burn-in figures judge ok; the same node held to H100 fails."""
    report = judge(
        "h200-lent-machine.json", expect_count=1, expect_model="H200", expect_driver="580.159.04"
    )
    checks = by_key(report)
    assert report.verdict is Verdict.ok, [c for c in report.checks if c.verdict is not Verdict.ok]
    assert checks[("pcie", 0)].measured == "gen5 x16"
    assert checks[("nvlink", 0)].verdict is Verdict.skipped  # a PCIe-attached single GPU
    # Sustained 8192^3 bf16 burn-in at the 700 W cap: 661 TFLOP/s, 67% of the 989 datasheet.
    assert checks[("matmul", 0)].value == pytest.approx(661, abs=1)
    assert checks[("matmul", 0)].threshold.endswith("(60% of 989)")
    assert checks[("membw", 0)].value == pytest.approx(4238, abs=1)
    wrong = judge(
        "h200-lent-machine.json", expect_count=1, expect_model="H100", expect_driver="580.159.04"
    )
    assert wrong.verdict is Verdict.failed
    assert by_key(wrong)[("model", 0)].verdict is Verdict.failed


def test_a_real_h200_shared_with_another_job_reads_degraded():
    """Recording captured from hardware: the same lent H200 while another process ran bf16
    products on it (the healthy recording above is the control)."""
    report = judge(
        "h200-lent-machine-contended.json",
        expect_count=1,
        expect_model="H200",
        expect_driver="580.159.04",
    )
    not_ok = {c.check: c.verdict for c in report.checks if c.verdict is not Verdict.ok}
    assert report.verdict is Verdict.degraded
    assert {k: v for k, v in not_ok.items() if v is not Verdict.skipped} == {
        "matmul": Verdict.degraded,
        "membw": Verdict.degraded,
    }
    assert by_key(report)[("matmul", 0)].value == pytest.approx(308, abs=1)  # 31% of 989


def test_a_real_h100_recording_passes_with_the_sxm_figures():
    """Recording captured from hardware (a lent 1x H100 80GB HBM3, scripts/gpu_device_check.py):
    judged against the H100 SXM row, not the PCIe one, and ok; the burn-in held 69% of the
    datasheet while the 700 W cap pulled the SM clock from 1980 to 1260-1425 MHz."""
    report = judge(
        "h100-lent-machine.json", expect_count=1, expect_model="H100", expect_driver="580.159.04"
    )
    checks = by_key(report)
    assert report.verdict is Verdict.ok, [c for c in report.checks if c.verdict is not Verdict.ok]
    assert checks[("matmul", 0)].value == pytest.approx(682, abs=1)
    assert checks[("matmul", 0)].threshold.endswith("(60% of 989)")
    assert checks[("membw", 0)].value == pytest.approx(3026, abs=1)
    assert checks[("membw", 0)].threshold.endswith("(70% of 3350)")
    contended = judge(
        "h100-lent-machine-contended.json",
        expect_count=1,
        expect_model="H100",
        expect_driver="580.159.04",
    )
    assert contended.verdict is Verdict.degraded
    degraded = {c.check for c in contended.checks if c.verdict is Verdict.degraded}
    assert degraded == {"matmul", "membw"}
    assert by_key(contended)[("matmul", 0)].value == pytest.approx(305, abs=1)  # 31% of 989


def test_uncorrectable_ecc_and_xid_79_fail_the_node():
    """Recording (hand-written): GPU 3 fell off the bus (Xid 79), GPU 5 has a volatile
    uncorrectable ECC error (Xid 48) and a pending row remap; its matmul hit a CUDA ECC error."""
    report = judge("h100-ecc-xid79.json")
    assert report.verdict is Verdict.failed
    checks = by_key(report)
    assert checks[("gpu", 3)].verdict is Verdict.failed
    assert "GPU is lost" in checks[("gpu", 3)].detail
    assert checks[("ecc", 5)].verdict is Verdict.failed
    assert checks[("ecc", 5)].value == 2
    assert checks[("memory_repair", 5)].verdict is Verdict.failed
    assert "pending" in checks[("memory_repair", 5)].measured
    xid = checks[("xid", None)]
    assert xid.verdict is Verdict.failed
    assert "79 x1 on 0000:5d:00" in xid.measured and "48 x1 on 0000:ab:00" in xid.measured
    assert checks[("matmul", 5)].verdict is Verdict.failed
    assert "uncorrectable ECC" in checks[("matmul", 5)].detail
    # The lost GPU is not burned in: there is nothing to measure.
    assert ("matmul", 3) not in checks
    # Healthy neighbours stay ok: the verdict points at the broken GPUs only.
    assert checks[("ecc", 0)].verdict is Verdict.ok


def test_thermally_throttled_gpu_degrades_the_node():
    """Recording (hand-written): GPU 2 in software thermal slowdown at 88 C, matmul at 55% of
    peak; the kernel log holds application Xids 13 and 43, which are the workload's fault."""
    report = judge("h100-throttled.json")
    assert report.verdict is Verdict.degraded
    checks = by_key(report)
    assert checks[("throttle", 2)].verdict is Verdict.degraded
    assert "sw thermal" in checks[("throttle", 2)].measured
    assert "88 C" in checks[("throttle", 2)].measured
    assert checks[("matmul", 2)].verdict is Verdict.degraded
    assert checks[("matmul", 1)].verdict is Verdict.ok
    xid = checks[("xid", None)]
    assert xid.verdict is Verdict.ok
    assert xid.value == 2 and "application error" in xid.detail


def test_pcie_downgraded_gpu_degrades_the_node():
    """Recording (hand-written): busy node (P0) whose GPU 6 trained its link at x8 of x16."""
    report = judge("h100-pcie-x8.json")
    assert report.verdict is Verdict.degraded
    pcie = by_key(report)[("pcie", 6)]
    assert pcie.verdict is Verdict.degraded
    assert (pcie.measured, pcie.threshold) == ("gen5 x8", "gen5 x16")
    assert by_key(report)[("pcie", 5)].verdict is Verdict.ok


def test_pcie_downgrade_can_be_made_a_failure():
    """Recording (hand-written): the x8 node again, with the verdict raised by configuration."""
    recording = json.loads((RECORDINGS / "h100-pcie-x8.json").read_text())
    cfg = GpuHealthConfig(pcie_downgrade_verdict="failed")
    report = run_checks(
        "gpu-1", RecordedGpus(recording), KernelLog("test", []), H100_NODE, cfg,
        ActiveSetup(run=False), no_dcgm,
    )  # fmt: skip
    assert by_key(report)[("pcie", 6)].verdict is Verdict.failed


def test_lost_lanes_show_at_idle_when_the_generation_is_down_clocked():
    """Recording (hand-written, NVML's answer format): idle node (P8), every link at gen1 as idle
    GPUs train it, GPU 3 at x8 of x16. The idle generation must not hide the lost lanes."""
    report = judge("h100-idle-gen1-x8.json")
    pcie = by_key(report)[("pcie", 3)]
    assert pcie.verdict is Verdict.degraded
    assert report.verdict is Verdict.degraded
    assert (pcie.measured, pcie.threshold) == ("gen1 x8 (idle)", "gen5 x16")
    assert "x8 of x16" in pcie.detail
    recording = json.loads((RECORDINGS / "h100-idle-gen1-x8.json").read_text())
    failing = run_checks(
        "gpu-1", RecordedGpus(recording), KernelLog("test", []), H100_NODE,
        GpuHealthConfig(pcie_downgrade_verdict="failed"), ActiveSetup(run=False), no_dcgm,
    )  # fmt: skip
    assert by_key(failing)[("pcie", 3)].verdict is Verdict.failed


def test_full_width_at_idle_gen1_passes():
    """Recording (hand-written, NVML's answer format): the same idle node at gen1, every link
    at its full x16: the down-clocked generation alone is no fault (positive control)."""
    report = judge("h100-idle-gen1-x16.json")
    pcie = by_key(report)[("pcie", 3)]
    assert pcie.verdict is Verdict.ok
    assert report.verdict is Verdict.ok


def test_gen_downgrade_counts_only_under_load():
    """Recording (hand-written): a healthy node's GPU 0 at gen4 of gen5, idle then busy."""
    recording = json.loads((RECORDINGS / "h100-healthy.json").read_text())
    device = recording["devices"][0]
    device["pcie_link"] = {"gen": 4, "max_gen": 5, "width": 16, "max_width": 16}
    args = (KernelLog("test", []), H100_NODE, GpuHealthConfig(), ActiveSetup(run=False), no_dcgm)
    idle = run_checks("gpu-1", RecordedGpus(recording), *args)
    assert by_key(idle)[("pcie", 0)].verdict is Verdict.ok
    device["performance_state"] = 0
    busy = run_checks("gpu-1", RecordedGpus(recording), *args)
    assert by_key(busy)[("pcie", 0)].verdict is Verdict.degraded


def test_inventory_mismatches():
    """Recording (hand-written): the healthy node held to the wrong count, model and driver."""
    report = judge("h100-healthy.json", expect_count=9, expect_model="A100", expect_driver="535.1")
    checks = by_key(report)
    assert checks[("gpu_count", None)].verdict is Verdict.failed
    assert checks[("model", 0)].verdict is Verdict.failed
    assert checks[("driver", None)].verdict is Verdict.degraded
    assert report.verdict is Verdict.failed


def test_persistence_off_and_hw_slowdown():
    """Recording (hand-written): healthy node edited to persistence off and HW slowdown."""
    recording = json.loads((RECORDINGS / "h100-healthy.json").read_text())
    recording["devices"][1]["persistence_mode"] = False
    recording["devices"][4]["clocks_event_reasons"] = 0x8 | 0x40
    report = run_checks(
        "gpu-1", RecordedGpus(recording), KernelLog("test", []), H100_NODE, GpuHealthConfig(),
        ActiveSetup(run=False), no_dcgm,
    )  # fmt: skip
    checks = by_key(report)
    assert checks[("persistence", 1)].verdict is Verdict.degraded
    assert checks[("throttle", 4)].verdict is Verdict.failed
    assert "hw thermal" in checks[("throttle", 4)].measured


def test_nvlink_down_and_row_remap_failure_fail():
    """Recording (hand-written): healthy node edited to one NVLink down and a failed remap."""
    recording = json.loads((RECORDINGS / "h100-healthy.json").read_text())
    recording["devices"][2]["nvlink_states"][7] = False
    recording["devices"][3]["row_remapping"]["failed"] = True
    report = run_checks(
        "gpu-1", RecordedGpus(recording), KernelLog("test", []), H100_NODE, GpuHealthConfig(),
        ActiveSetup(run=False), no_dcgm,
    )  # fmt: skip
    checks = by_key(report)
    assert checks[("nvlink", 2)].verdict is Verdict.failed
    assert checks[("nvlink", 2)].measured == "17 of 18 up"
    assert checks[("memory_repair", 3)].verdict is Verdict.failed
    assert "RMA" in checks[("memory_repair", 3)].detail


def test_without_pytorch_or_cupy_active_checks_say_skipped():
    """Recording (hand-written): the healthy node's NVML answers with no active backend."""
    recording = json.loads((RECORDINGS / "h100-healthy.json").read_text())
    setup = ActiveSetup(run=True, backend=None, why_none="no PyTorch or CuPy", dcgm=False)
    report = run_checks(
        "gpu-1", RecordedGpus(recording), KernelLog("test", []), H100_NODE, GpuHealthConfig(),
        setup, no_dcgm,
    )  # fmt: skip
    active = [c for c in report.checks if c.check in ("matmul", "membw", "allreduce")]
    assert [c.check for c in active] == ["matmul", "membw", "allreduce"]
    assert all(c.verdict is Verdict.skipped for c in active)
    assert all(c.measured == "skipped: no PyTorch or CuPy" for c in active)
    assert report.backend == "none"
    assert report.verdict is Verdict.ok
    required = run_checks(
        "gpu-1", RecordedGpus(recording), KernelLog("test", []), H100_NODE, GpuHealthConfig(),
        ActiveSetup(run=True, backend=None, require=True, dcgm=False), no_dcgm,
    )  # fmt: skip
    assert required.verdict is Verdict.failed


def test_detect_backend_without_frameworks(monkeypatch):
    # None in sys.modules makes the import fail, whatever this machine has installed.
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "cupy", None)
    backend, why = detect_backend()
    assert backend is None
    assert why == "no PyTorch or CuPy"


def test_nvml_that_cannot_start_fails_the_node():
    class NoDriver:
        def device_count(self) -> int:
            raise NvmlError("cannot load NVML (is the NVIDIA driver installed?)")

    report = run_checks(
        "gpu-1", NoDriver(), KernelLog("test", []), H100_NODE, GpuHealthConfig(),
        ActiveSetup(run=False), no_dcgm,
    )  # fmt: skip
    assert report.verdict is Verdict.failed
    assert report.checks[0].check == "nvml"


def test_real_adapter_reports_a_missing_driver_cleanly():
    # This machine has no NVIDIA driver: the real adapter must say so as an NvmlError.
    with pytest.raises(NvmlError, match="NVML"):
        PynvmlGpus()


def test_record_then_replay_round_trips():
    """Recording (hand-written): what `record` writes is what RecordedGpus reads back."""
    recording = json.loads((RECORDINGS / "h100-ecc-xid79.json").read_text())
    again = record(RecordedGpus(recording))
    assert again["driver_version"] == recording["driver_version"]
    assert again["devices"][5] == recording["devices"][5]
    assert again["devices"][3]["name"] == {"error": "GPU is lost"}


XID_EXPECTED = [
    (13, XidAction.application),
    (31, XidAction.application),
    (43, XidAction.application),
    (45, XidAction.application),
    (92, XidAction.watch),
    (94, XidAction.watch),
    (74, XidAction.drain),
    (95, XidAction.drain),
    (64, XidAction.drain),
    (119, XidAction.drain),
    (79, XidAction.drain),
    (500, XidAction.watch),  # in no catalog: watched, neither ignored nor fatal
]


def test_xid_classifier_on_kernel_log_lines():
    """Recording (hand-written kernel log lines in the driver's format, old and new)."""
    lines = (RECORDINGS / "xid-samples.log").read_text().splitlines()
    events = parse_xids(lines)
    assert [(event.code, event.action) for event in events] == XID_EXPECTED
    assert events[-2].bus == "0000:ab:00"  # the old format without "PCI:"
    assert check_xids(KernelLog("test", lines)).verdict is Verdict.failed


@pytest.mark.parametrize(
    ("lines", "verdict"),
    [
        ([], Verdict.ok),
        (["NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception"], Verdict.ok),
        (
            ["NVRM: Xid (PCI:0000:18:00): 92, pid=1, High single-bit ECC error rate"],
            Verdict.degraded,
        ),
        (["NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus."], Verdict.failed),
    ],
)
def test_xid_verdicts(lines, verdict):
    assert check_xids(KernelLog("test", lines)).verdict is verdict


def test_unreadable_kernel_log_is_not_clean():
    result = check_xids(KernelLog("journalctl: permission denied; dmesg: not permitted", None))
    assert result.verdict is Verdict.degraded
    assert "dmesg" in result.detail


def test_kernel_log_falls_back_to_dmesg():
    calls = []

    def runner(argv: list[str], timeout: float) -> CommandResult:
        calls.append(argv[0])
        if argv[0] == "journalctl":
            return CommandResult(0, "")  # no journal access: empty, not an error
        return CommandResult(0, "[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off\n")

    log = read_kernel_log(runner)
    assert calls == ["journalctl", "dmesg"]
    assert log.source == "dmesg" and len(log.lines) == 1

    def broken(argv: list[str], timeout: float) -> CommandResult:
        return CommandResult(
            1, "", f"{argv[0]}: read kernel buffer failed: Operation not permitted"
        )

    assert read_kernel_log(broken).lines is None


@pytest.mark.parametrize(
    ("name", "expected", "matches"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", True),
        ("NVIDIA H100 80GB HBM3", "H100", True),
        ("NVIDIA H100 80GB HBM3", "h100", True),
        ("NVIDIA A100-SXM4-80GB", "A100", True),
        ("NVIDIA A100-SXM4-80GB", "H100", False),
        ("NVIDIA GH200 480GB", "H200", False),
    ],
)
def test_model_matching(name, expected, matches):
    assert model_matches(name, expected) is matches


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ],
)
def test_model_figures(name, label):
    assert figures_for(name).label == label


@pytest.mark.parametrize(
    ("measured", "verdict"),
    [(989.0, Verdict.ok), (600.0, Verdict.ok), (593.0, Verdict.degraded), (296.0, Verdict.failed)],
)
def test_matmul_thresholds(measured, verdict):
    result = rate_verdict("matmul", lambda: measured, 989.0, 0.6, 0.3, "TFLOP/s", 0, "H100 SXM")
    assert result.verdict is verdict
    assert result.threshold.startswith(">= 593 TFLOP/s")


def test_unknown_model_is_measured_but_not_judged():
    result = rate_verdict("matmul", lambda: 100.0, None, 0.6, 0.3, "TFLOP/s", 0, "Tesla T4")
    assert result.verdict is Verdict.skipped
    assert result.value == 100.0 and "Tesla T4" in result.threshold


def dcgm_runner(rc: int, stdout: str):
    def run(argv: list[str], timeout: float) -> CommandResult:
        assert argv[:4] == ["dcgmi", "diag", "-r", "2"]
        return CommandResult(rc, stdout, "")

    return run


DCGM_JSON = {
    "DCGM GPU Diagnostic": {
        "test_categories": [
            {
                "category": "Hardware",
                "tests": [
                    {"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Pass"}]},
                    {
                        "name": "Diagnostic",
                        "results": [{"gpu_id": "3", "status": "Fail", "info": "SM stress"}],
                    },
                ],
            }
        ]
    }
}


def test_dcgm_diag_verdicts():
    failed = check_dcgm(dcgm_runner(226, json.dumps(DCGM_JSON)), 2)
    assert failed.verdict is Verdict.failed
    assert "Diagnostic on GPU 3: SM stress" in failed.detail
    passing = json.loads(json.dumps(DCGM_JSON).replace("Fail", "Pass"))
    assert check_dcgm(dcgm_runner(0, json.dumps(passing)), 2).verdict is Verdict.ok
    assert check_dcgm(dcgm_runner(127, ""), 2).verdict is Verdict.skipped
    assert check_dcgm(dcgm_runner(1, "Error: unable to connect"), 2).verdict is Verdict.degraded
