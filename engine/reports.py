"""What a run reports: per host, its status and operations; per run, timings and notes.
Standard library only, so that a command that never connects through pyinfra (the drift fast
path, engine/fingerprint/) can build the same report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from toolkit.pacing import Rate


class Mode(StrEnum):
    plan = "plan"
    apply = "apply"
    drift = "drift"


class HostStatus(StrEnum):
    ok = "ok"  # matches the inventory (plan/drift) or converged without change (apply)
    skipped = "skipped"  # not tried: a batched run stopped before its step
    changed = "changed"  # apply changed it
    drift = "drift"  # plan/drift: would change
    failed = "failed"  # an operation failed
    unreachable = "unreachable"  # no SSH connection (refused key, changed host key, down)


@dataclass
class OperationResult:
    phase: str
    name: str
    changed: bool
    diff: str | None = None  # unified diff of a managed file; secrets are redacted
    error: str | None = None


@dataclass
class HostReport:
    name: str
    status: HostStatus = HostStatus.ok
    error: str | None = None
    operations: list[OperationResult] = field(default_factory=list)
    seconds: float = 0.0
    reboot_required: bool = False  # /run/reboot-required, read at the end of the run
    notes: list[str] = field(default_factory=list)  # why operations did nothing on this host
    # Results of checks a role ran while executing (the etcd disk gate: p99, pass/fail/override)
    checks: list[dict] = field(default_factory=list)

    @property
    def changes(self) -> list[OperationResult]:
        return [op for op in self.operations if op.changed]


@dataclass
class RunReport:
    cluster: str
    mode: Mode
    hosts: dict[str, HostReport] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    stopped: str | None = None  # why a batched run stopped early
    notes: list[str] = field(default_factory=list)

    def with_status(self, *statuses: HostStatus) -> list[HostReport]:
        return [h for h in self.hosts.values() if h.status in statuses]

    def add_time(self, key: str, since: float) -> None:
        """Add the time since `since` (time.monotonic()) to the phase `key`."""
        self.phase_seconds[key] = self.phase_seconds.get(key, 0.0) + time.monotonic() - since


@dataclass(frozen=True)
class RunOptions:
    mode: Mode
    limit: tuple[str, ...] = ()  # host or group names; empty: every host
    roles: tuple[str, ...] = ()  # role names; empty: every role
    parallel: int | None = None  # concurrent hosts; None: every host (within the nofile cap)
    batch: str | None = None  # apply in rolling steps: "N" hosts or "P%" (engine/orchestrate.py)
    rate: Rate | None = None  # at most N batch-policy hosts start per interval
    fail_percent: float | None = None  # stop a batched run past this share of failed hosts
    connect_timeout: int = 10
    shard: tuple[int, int] | None = None  # (index, count): check only this share of the hosts
