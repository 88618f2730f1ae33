"""Rolling reboots of hosts that wait for one (/run/reboot-required): reboot a batch, wait for
SSH and for systemd to finish booting, clear the flag, then go on to the next batch."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inventory.model import LoadedCluster
from toolkit.operations import REBOOT_FLAG
from toolkit.remote import SSH_FAILED, RemoteResult, RemoteRunner, run_remote

if TYPE_CHECKING:
    from engine.reports import RunReport

# /run is a tmpfs on every systemd host (lab hosts included): a marker there is gone exactly
# when the host booted again. A boot id would not do: lab hosts share the machine's kernel.
BOOT_MARKER = "/run/gpuinfra-reboot-pending"
# `systemctl is-system-running`: booted is "running", or "degraded" (a failed unit, still up).
BOOTED_STATES = ("running", "degraded")


@dataclass
class RebootOutcome:
    host: str
    ok: bool
    seconds: float
    error: str | None = None


@dataclass
class Rebooter:
    """Reboots hosts of one cluster over SSH (host keys checked, like every other connection)."""

    loaded: LoadedCluster
    timeout: float = 600.0  # per host: from `systemctl reboot` to booted
    poll: float = 2.0
    run: RemoteRunner = run_remote
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def ssh(self, host: str, command: str, timeout: float = 30) -> RemoteResult:
        return self.run(self.loaded, host, command, timeout=timeout)

    def reboot(self, host: str) -> RebootOutcome:
        started = self.clock()
        marked = self.ssh(host, f"touch {BOOT_MARKER}")
        if not marked.ok:
            return RebootOutcome(host, False, 0.0, f"before reboot: {marked.stderr.strip()}")
        # The connection drops while the host goes down: its exit status means nothing.
        self.ssh(host, "systemctl reboot", timeout=30)
        deadline = started + self.timeout
        state = "unreachable"
        while self.clock() < deadline:
            self.sleep(self.poll)
            probe = self.ssh(
                host,
                f"test -e {BOOT_MARKER} && echo pending || systemctl is-system-running",
                timeout=15,
            )
            if probe.exit_code == SSH_FAILED:  # ssh itself failed: still down
                state = "unreachable"
                continue
            state = probe.stdout.strip() or "unknown"
            if state in BOOTED_STATES:
                cleared = self.ssh(host, f"rm -f {REBOOT_FLAG} {REBOOT_FLAG}.pkgs")
                if not cleared.ok:
                    return RebootOutcome(
                        host, False, self.clock() - started, cleared.stderr.strip()
                    )
                return RebootOutcome(host, True, self.clock() - started)
        return RebootOutcome(
            host,
            False,
            self.clock() - started,
            f"not back within {self.timeout:g} s (last state: {state})",
        )

    def rolling(
        self,
        batches: list[list[str]],
        progress: Callable[[str], None] | None = None,
    ) -> list[RebootOutcome]:
        """Reboot batch after batch; a host that does not come back stops the rollout, so a
        bad kernel or command line never takes down more than one batch."""
        outcomes: list[RebootOutcome] = []
        for batch in batches:
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                done = list(pool.map(self.reboot, batch))
            outcomes += done
            if progress:
                for outcome in done:
                    progress(f"rebooted {outcome.host}" if outcome.ok else outcome.error or "")
            if not all(outcome.ok for outcome in done):
                break
        return outcomes


def reboot_waiting(cluster: str | Path, report: RunReport, batch: str | None) -> None:
    """Reboot the hosts the run left "reboot required", in rolling steps by each group's policy
    (quorum and serving groups one member at a time, workers --batch at a time, one by
    default); the report says which came back (flag cleared) and which did not (failed)."""
    from engine.context import load
    from engine.orchestrate import batch_size, group_policies, plan_steps
    from engine.registry import PHASES
    from engine.reports import HostStatus

    waiting = [
        host.name
        for host in report.hosts.values()
        if host.reboot_required and host.status in (HostStatus.ok, HostStatus.changed)
    ]
    if not waiting:
        return
    loaded = load(cluster)
    groups_of = {name: loaded.cluster.hosts[name].groups for name in waiting}
    size = batch_size(batch or "1", len(waiting))
    steps = plan_steps(waiting, groups_of, group_policies(PHASES), size, rebooting=True)
    for outcome in Rebooter(loaded).rolling(steps):
        entry = report.hosts[outcome.host]
        if outcome.ok:
            entry.reboot_required = False
            report.notes.append(f"{outcome.host}: rebooted, back in {outcome.seconds:.1f} s")
        else:
            entry.status = HostStatus.failed
            entry.error = f"reboot: {outcome.error}"
    left = [name for name in waiting if report.hosts[name].reboot_required]
    if left:
        report.notes.append(f"still waiting for a reboot: {', '.join(left)}")
