"""The plain results of GPU health checks: one verdict per check, rolled up per node."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    ok = "ok"
    degraded = "degraded"  # outside a threshold, but the node can keep working
    failed = "failed"  # the node should be drained
    skipped = "skipped"  # the check could not run here; says why, never counts as passing silently

    @property
    def severity(self) -> int:
        """Order for the roll-up; skipped ranks with ok because it says nothing bad was seen."""
        return {"ok": 0, "skipped": 0, "degraded": 1, "failed": 2}[self.value]


def worst(verdicts: list[Verdict]) -> Verdict:
    """The most severe verdict; ok for an empty list, skipped only if every check was skipped."""
    if verdicts and all(verdict is Verdict.skipped for verdict in verdicts):
        return Verdict.skipped
    ranked = [verdict for verdict in verdicts if verdict is not Verdict.skipped]
    return max(ranked, key=lambda verdict: verdict.severity, default=Verdict.ok)


@dataclass(frozen=True)
class CheckResult:
    check: str  # short stable name, also the Prometheus label: inventory, ecc, xid, matmul ...
    verdict: Verdict
    measured: str  # what was seen, for people: "712 TFLOP/s", "x8 of x16", "2 errors"
    threshold: str  # what it was held against: ">= 593 TFLOP/s", "0"
    gpu: int | None = None  # None for node-wide checks (driver, Xid, all-reduce)
    value: float | None = None  # the number behind `measured`, for metrics
    unit: str = ""
    detail: str = ""  # why the verdict, and what to do about it

    def to_dict(self) -> dict:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        return data


@dataclass
class NodeReport:
    host: str
    checks: list[CheckResult] = field(default_factory=list)
    backend: str = "none"  # what ran the active tests: torch, cupy, or none
    started: float = 0.0  # unix time
    duration_s: float = 0.0

    @property
    def verdict(self) -> Verdict:
        return worst([check.verdict for check in self.checks])

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "verdict": self.verdict.value,
            "backend": self.backend,
            "started": self.started,
            "duration_s": round(self.duration_s, 3),
            "checks": [check.to_dict() for check in self.checks],
        }

    @classmethod
    def from_dict(cls, data: dict) -> NodeReport:
        checks = [
            CheckResult(**{**check, "verdict": Verdict(check["verdict"])})
            for check in data.get("checks", [])
        ]
        return cls(
            host=data["host"],
            checks=checks,
            backend=data.get("backend", "none"),
            started=data.get("started", 0.0),
            duration_s=data.get("duration_s", 0.0),
        )
