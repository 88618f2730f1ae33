"""drift as one engine call: the fast path first (engine/fingerprint/), then the exact check
for the hosts it left, merged into one report in inventory order.

Standard library only at import: the drift that answers before the command line is imported
(cli/launch.py) builds its report with `merged_report`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.fingerprint import FastCheck
    from engine.reports import RunOptions, RunReport
    from inventory.model import LoadedCluster

# The exact check of some hosts: the runner, as the caller shows its progress.
ExactRun = Callable[["LoadedCluster", "RunOptions"], "RunReport"]


def drift(loaded: LoadedCluster, options: RunOptions, run_exact: ExactRun) -> RunReport:
    """Every selected host checked: a host the last apply found converged in one round trip
    (its recorded commands asked again), any other host, and any whose answers differ, by
    `run_exact`. The hosts with a record are asked before the state is checked and the keys
    are computed (both only read the controller's files), so their answers are on their way.

    When a host's inputs changed, its files are rendered for its key: a missing secret stops
    the check there (StateMissing, as require_state raises it) before any exact check."""
    from dataclasses import replace

    from engine import fingerprint
    from engine.clusterstate import require_state
    from engine.reports import RunReport
    from engine.selection import selected_hosts
    from inventory.model import StateAccess

    started = time.monotonic()
    hosts, notes = selected_hosts(loaded, options)
    probes = fingerprint.Probes(
        loaded,
        hosts,
        options.roles,
        options.connect_timeout,
        options.parallel,
        early=fingerprint.claim_early(),
    )
    try:
        fast = probes.finish(loaded.with_state_access(StateAccess.existing))
    except BaseException:
        probes.cancel()
        raise
    rest = [name for name in hosts if name in fast.exact]
    if rest:
        loaded = require_state(loaded, options.roles)
        exact = run_exact(loaded, replace(options, limit=tuple(rest), shard=None))
    else:
        exact = RunReport(cluster=loaded.cluster.name, mode=options.mode)
    return merged_report(loaded.cluster.name, hosts, notes, fast, exact, started)


def merged_report(
    cluster: str,
    hosts: list[str],
    notes: list[str],
    fast: FastCheck,
    exact: RunReport,
    started: float,
) -> RunReport:
    """drift's report: each host as the fast check matched it or as the exact check found it,
    in inventory order; the total time from the first probe (which the command line may have
    sent before the command began) or from `started`, whichever came first."""
    from engine import fingerprint
    from engine.reports import Mode, RunReport

    report = RunReport(cluster=cluster, mode=Mode.drift)
    report.hosts = {name: fast.reports.get(name) or exact.hosts[name] for name in hosts}
    report.phase_seconds = {"fast check": fast.seconds, **exact.phase_seconds}
    report.notes = [*notes, fingerprint.summary(fast, len(hosts)), *exact.notes]
    report.seconds = time.monotonic() - min(started, fast.started)
    return report
