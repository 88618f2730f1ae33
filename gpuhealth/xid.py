"""Xid errors from the kernel log, classified by what the operator should do about each code."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum

from gpuhealth.commands import CommandRunner


class XidAction(StrEnum):
    drain = "drain and reset"  # the GPU itself is suspect: take the node out, reset or RMA
    watch = "watch"  # the hardware coped (or may have): count it, act if it repeats
    application = "application error"  # the workload did something wrong; the GPU is fine


# Source: NVIDIA's Xid catalog, https://docs.nvidia.com/deploy/xid-errors/ (the "Resolution
# Bucket" columns and the per-Xid cause matrix), and the codes NVIDIA's k8s-device-plugin treats
# as application errors (13, 31, 43, 45, 68, 109: internal/rm/health.go). Codes not listed
# here are `watch`: an unknown code is never silently treated as harmless, nor as fatal.
XID_CATALOG: dict[int, tuple[XidAction, str]] = {
    13: (XidAction.application, "graphics engine exception (out-of-range access, bad kernel)"),
    31: (XidAction.application, "GPU memory page fault (illegal address in the application)"),
    43: (XidAction.application, "GPU stopped processing: a channel was reset for the process"),
    45: (XidAction.application, "preemptive cleanup: follows a killed process or another Xid"),
    68: (XidAction.application, "video decoder (NVDEC) exception"),
    69: (XidAction.application, "graphics engine class error"),
    109: (XidAction.application, "context switch timeout"),
    61: (XidAction.watch, "internal micro-controller breakpoint/warning"),
    63: (XidAction.watch, "ECC page retirement or row remap recorded: reset to apply it"),
    92: (XidAction.watch, "high single-bit ECC error rate"),
    94: (XidAction.watch, "contained ECC error: only the process using the row was stopped"),
    48: (XidAction.drain, "double-bit (uncorrectable) ECC error"),
    62: (XidAction.drain, "internal micro-controller halt"),
    64: (XidAction.drain, "ECC page retirement or row remapping failed"),
    74: (XidAction.drain, "NVLink error"),
    79: (XidAction.drain, "GPU has fallen off the bus"),
    95: (XidAction.drain, "uncontained ECC error: every process on the GPU is affected"),
    119: (XidAction.drain, "GSP (GPU System Processor) RPC timeout"),
    120: (XidAction.drain, "GSP error"),
    140: (XidAction.drain, "unrecovered ECC error"),
    154: (XidAction.drain, "GPU recovery action changed: the driver asks for a reset or reboot"),
}

# `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.` (older drivers omit
# "PCI:"). The rest of the line varies by code and driver; only the code is classified.
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f:.]+)\): (?P<code>\d+)\b")


@dataclass(frozen=True)
class XidEvent:
    code: int
    bus: str  # PCI address as the driver printed it, e.g. 0000:3b:00
    action: XidAction
    meaning: str
    line: str


def classify(code: int) -> tuple[XidAction, str]:
    return XID_CATALOG.get(code, (XidAction.watch, "not in the classification table"))


def parse_xids(lines: list[str]) -> list[XidEvent]:
    events = []
    for line in lines:
        match = XID_LINE.search(line)
        if match is None:
            continue
        code = int(match["code"])
        action, meaning = classify(code)
        events.append(XidEvent(code, match["bus"].lower(), action, meaning, line.strip()))
    return events


def summarise(events: list[XidEvent]) -> str:
    """`79 x1 on 0000:3b:00; 13 x4 on 0000:1a:00`, most severe first."""
    order = {XidAction.drain: 0, XidAction.watch: 1, XidAction.application: 2}
    counts = Counter((event.action, event.code, event.bus) for event in events)
    parts = [
        f"{code} x{count} on {bus}"
        for (action, code, bus), count in sorted(counts.items(), key=lambda kv: order[kv[0][0]])
    ]
    return "; ".join(parts)


@dataclass(frozen=True)
class KernelLog:
    source: str  # the command that produced it, or why nothing could be read
    lines: list[str] | None  # None when no source could be read


def read_kernel_log(run: CommandRunner) -> KernelLog:
    """Kernel messages since boot: journald first (survives ring-buffer wrap), then dmesg."""
    attempts = [
        ["journalctl", "-k", "-b", "--no-pager", "-q", "-o", "short-monotonic"],
        ["dmesg"],
    ]
    failures = []
    for argv in attempts:
        result = run(argv, 60)
        # journalctl exits 0 with no lines when the journal is not readable to this user.
        if result.rc == 0 and result.stdout.strip():
            return KernelLog(" ".join(argv), result.stdout.splitlines())
        reason = result.stderr.strip().splitlines()[-1:] or [f"exit {result.rc}, no output"]
        failures.append(f"{argv[0]}: {reason[0]}")
    return KernelLog("; ".join(failures), None)
