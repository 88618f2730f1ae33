"""What a recording run (an apply) keeps for drift once it has run: the record of every host it
found converged, the hosts it changed checked again to find them converged, the early sheet and,
with the drift Job, each recorded host's probe (engine/fingerprint/installed.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from engine.fingerprint import installed
from engine.fingerprint.check import new_marker
from engine.fingerprint.early import write_early_sheet
from engine.fingerprint.keys import code_digest, common_digest, host_roles, record_keys
from engine.fingerprint.records import Record, forget, save_record
from engine.reports import HostStatus, Mode, RunOptions, RunReport

if TYPE_CHECKING:
    from inventory.model import LoadedCluster
    from toolkit.spec import HostContext

# The note naming the converged hosts an apply could not record (keys.record_keys).
NOT_RECORDED = "not recorded for drift's one round trip"
CODE_CHANGED = (
    "gpuinfra's code changed on disk during the run; the next drift checks every host "
    "operation by operation, until an apply records them"
)


def record_converged(
    loaded: LoadedCluster,
    options: RunOptions,
    report: RunReport,
    asked: Mapping[str, tuple],
    contexts: Mapping[str, HostContext],
    check: Callable[[RunOptions], RunReport],
) -> None:
    """Keep the record of every host this run found converged, check the hosts an apply changed
    once more (exactly, with `check`, a recording run: their facts are the ones that run
    recorded), and forget the records of the hosts that are neither (their next drift checks
    them operation by operation). `asked`: per host, the commands its deploys asked."""
    if code_digest(again=True) != code_digest():
        # An upgrade or a checkout while the run had the code loaded: what it found was found by
        # code that is no longer on disk, and a record must name the code that made it.
        report.notes.append(f"{NOT_RECORDED}: {CODE_CHANGED}")
        forget(loaded.state_dir, set(report.hosts))
        return
    converged = [name for name in asked if report.hosts[name].status is HostStatus.ok]
    common = common_digest(loaded)
    keys, unkeyed = record_keys(loaded, converged, common)
    parts = tuple(common.split())
    kept = set()
    job = drift_job_enabled(loaded)
    if unkeyed:
        report.notes.append(
            f"{NOT_RECORDED} (checked operation by operation until an apply records them): "
            f"{', '.join(sorted(unkeyed))} ({next(iter(unkeyed.values()))})"
        )
    for name in keys:
        entry = report.hosts[name]
        record = Record(
            key=keys[name].key,
            roles=host_roles(contexts[name].host.groups, options.roles, cluster=loaded.cluster),
            commands=asked[name],
            operations=tuple((op.phase, op.name) for op in entry.operations),
            notes=tuple(entry.notes),
            reboot_required=entry.reboot_required,
            parts=parts,
            inputs=keys[name].inputs,
            valid_until=keys[name].valid_until,
            marker=new_marker() if job else "",
        )
        save_record(loaded.state_dir, name, record)
        kept.add(name)
    changed = [h.name for h in report.with_status(HostStatus.changed)]
    if options.mode is Mode.apply and changed:
        clock = time.monotonic()
        check_options = RunOptions(
            mode=Mode.plan,
            limit=tuple(changed),
            roles=options.roles,
            parallel=options.parallel,
            connect_timeout=options.connect_timeout,
        )
        checked = check(check_options)
        report.add_time("converged check", clock)
        report.notes += [note for note in checked.notes if note.startswith(NOT_RECORDED)]
        kept.update(h for h in changed if checked.hosts[h].status is HostStatus.ok)
        still = [h for h in changed if checked.hosts[h].status is not HostStatus.ok]
        if still:
            report.notes.append(
                f"checked again after the apply, not converged: {', '.join(still)} "
                "(`gpuinfra plan` shows what would still change)"
            )
    forget(loaded.state_dir, set(report.hosts) - kept)
    if options.mode is Mode.apply:  # once, after the check of the changed hosts above
        write_early_sheet(loaded)
        if job and kept:
            _install_probes(loaded, report, kept)


def drift_job_enabled(loaded: LoadedCluster) -> bool:
    """Whether the drift Job is on (drift_job.enabled, a fleet-wide setting)."""
    from toolkit.spec import settings_of

    first = next(iter(loaded.cluster.hosts), None)
    return first is not None and bool(settings_of(loaded, first, "drift_job").enabled)


def _install_probes(loaded: LoadedCluster, report: RunReport, kept: set[str]) -> None:
    """The drift Job's probes, after the records are kept."""
    clock = time.monotonic()
    failed = installed.install_probes(loaded, sorted(kept))
    report.add_time("drift probes", clock)
    if failed:
        report.notes.append(
            f"drift Job probe not installed on {len(failed)} host(s), checked by the "
            f"controller in `drift --job`: {', '.join(sorted(failed))} "
            f"({next(iter(failed.values()))})"
        )
