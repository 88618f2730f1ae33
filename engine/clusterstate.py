"""The controller's state of a cluster (`.state/`), made explicit per command.

render reads it and shows placeholders for what is missing; plan and drift need it and never
write it; apply holds the cluster lock, runs every role's pre-apply check (etcd: the live CA
against the state's), and only then may create what is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from engine.applylock import LOCK_FILE, HeldLock, apply_lock
from engine.context import host_contexts, host_files
from engine.registry import ROLES
from inventory.model import LoadedCluster, StateAccess
from toolkit.spec import PreApplyRefused
from toolkit.statefiles import StateMissing


def require_state(loaded: LoadedCluster, roles: Iterable[str] = ()) -> LoadedCluster:
    """The cluster for a read-only command: StateMissing, naming the missing path, when a
    secret the files of `roles` (all when empty) need is not in the state (nothing is
    created). One host of each distinct set of groups is rendered: the secrets are
    cluster-wide, so that covers every one."""
    loaded = loaded.with_state_access(StateAccess.existing)
    seen: set[tuple[str, ...]] = set()
    for ctx in host_contexts(loaded):
        groups = tuple(sorted(ctx.host.groups))
        if groups in seen:
            continue
        seen.add(groups)
        try:
            host_files(ctx, roles)
        except StateMissing:
            if not loaded.state_dir.exists():
                raise StateMissing(loaded.state_dir) from None
            raise
    return loaded


@contextlib.contextmanager
def applying(
    loaded: LoadedCluster, command: str | None = None, *, break_lock: bool = False
) -> Iterator[tuple[LoadedCluster, HeldLock]]:
    """Hold the cluster's apply lock (LockHeld when another apply has it), then run every role's
    pre-apply check (PreApplyRefused: the etcd members trust another CA than the state's, say);
    yields the cluster allowed to create missing state.

    Every registered role's check runs, not only those of the roles an apply selects: the
    checks guard state that is cluster-wide (the etcd CA signs the control plane's etcd client
    certificates too), and they ran so before they were part of the record."""
    fresh = not loaded.state_dir.exists()
    try:
        with apply_lock(loaded.state_dir, command, break_lock=break_lock) as held:
            _check_rollout_job(loaded, held, break_lock)
            run_pre_apply_checks(loaded)
            yield loaded.with_state_access(StateAccess.create), held
    except PreApplyRefused:
        if fresh:  # refused before anything was made: leave no state folder behind
            (loaded.state_dir / LOCK_FILE).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                loaded.state_dir.rmdir()
        raise


def _check_rollout_job(loaded: LoadedCluster, held: HeldLock, break_lock: bool) -> None:
    """A rollout Job's ledger is the lock inside the cluster (engine/rolloutlock.py): asked on
    cp-1 only when the inventory enables the Job, so any other apply asks nothing more."""
    from engine.rolloutlock import check_rollout, fleet_config

    if not loaded.cluster.hosts or not fleet_config(loaded).enabled:
        return

    note = check_rollout(loaded, held.path, break_lock=break_lock, who=held.holder.describe())
    if note:
        held.notes.append(note)


def run_pre_apply_checks(loaded: LoadedCluster) -> None:
    """Each role's pre-apply check (its record's `pre_apply`), in registry order; the first
    refusal (PreApplyRefused) stops the apply before anything changes."""
    for role in ROLES:
        if role.pre_apply is not None:
            role.pre_apply(loaded)
