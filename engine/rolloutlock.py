"""The rollout Job's ledger as the cluster's lock: while a Job's heartbeat is renewed (under
120 s old, or seen renewed while watched: `live_rollout`), a local apply is refused (LockHeld,
exit 8) naming the Job; `--break-lock` stops the Job
instead (docs/design/fleet-jobs.md section 5). A ledger that cannot be read refuses too (exit 8):
the lock fails closed. Read on the first control-plane node with
admin.conf, only when the inventory enables the rollout Job.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path

from engine import fleetgate
from engine.applylock import LockHeld
from engine.incluster import ADMIN_CONF, remote_kubectl
from inventory.model import LoadedCluster
from toolkit.remote import RemoteRunner, run_remote
from toolkit.spec import settings_of


def fleet_config(loaded: LoadedCluster):
    """The rollout Job's settings (group_vars.all only, the same on every host)."""
    first = next(iter(loaded.cluster.hosts))
    return settings_of(loaded, first, "rollout_job")


class RolloutHoldsLock(LockHeld):
    """A rollout Job's heartbeat is fresh: it holds the cluster."""

    def __init__(self, path: Path, message: str):
        Exception.__init__(self, f"{path}: {message}")
        self.holder = None


def ledger_name(cluster: str) -> str:
    return f"gpuinfra-rollout-{cluster}"


def _api(loaded: LoadedCluster, runner: RemoteRunner) -> fleetgate.KubectlApi | None:
    cfg = fleet_config(loaded)
    control_planes = loaded.cluster.in_group("control_plane")
    if not cfg.enabled or not control_planes:
        return None
    return fleetgate.KubectlApi(
        cfg.namespace, remote_kubectl(loaded, control_planes[0], cfg.namespace, runner)
    )


# A heartbeat that looks stale by this machine's clock is watched this long for a renewal
# before the rollout is called dead: one renewal period of its writers, and a margin.
WATCH_S = fleetgate.HEARTBEAT_RENEW_S + 10


def live_rollout(
    loaded: LoadedCluster,
    runner: RemoteRunner | None = None,
    now: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> fleetgate.Ledger | None:
    """The ledger of a rollout Job still running; None when there is none: the Job is off,
    cp-1 has no Kubernetes yet (no admin.conf), no ledger, or one stopped, finished or dead.
    LedgerError when cp-1 cannot say (ssh or kubectl failing, a ledger that does not parse): a
    rollout may be running, so the caller must not read that as none.

    Alive is decided without trusting two clocks to agree: a heartbeat fresh by this machine's
    clock holds the cluster (the safe reading); one that looks stale, or that is ahead of this
    clock, is watched for WATCH_S, and only a ledger nobody wrote meanwhile (the same
    resourceVersion, which the API server assigns) is dead."""
    run = runner or run_remote
    api = _api(loaded, run)
    if api is None:
        return None
    name = ledger_name(loaded.cluster.name)
    read = _read(loaded, api, run, name)
    if read is None:
        return None
    ledger, version = read
    if not ledger.active():
        return None
    if ledger.fresh(time.time() if now is None else now):
        return ledger
    sleep(WATCH_S)
    again = _read(loaded, api, run, name)
    if again is None or again[1] == version or not again[0].active():
        return None
    return again[0]


def _read(
    loaded: LoadedCluster, api: fleetgate.KubectlApi, runner: RemoteRunner, name: str
) -> tuple[fleetgate.Ledger, str] | None:
    try:
        data, version = api.get(name)
    except fleetgate.LedgerError as exc:
        if "(NotFound)" in str(exc) or not _has_kubernetes(loaded, runner):
            return None
        raise
    return fleetgate.Ledger.parse(data), version


def _has_kubernetes(loaded: LoadedCluster, runner: RemoteRunner) -> bool:
    """False only when cp-1 answers and has no admin.conf (a cluster not up yet has no Job)."""
    host = loaded.cluster.in_group("control_plane")[0]
    found = runner(loaded, host, f"test -e {shlex.quote(ADMIN_CONF)}", timeout=60)
    return found.exit_code != 1


def check_rollout(
    loaded: LoadedCluster,
    path: Path,
    *,
    break_lock: bool = False,
    who: str = "",
    runner: RemoteRunner | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """RolloutHoldsLock while a live Job holds the cluster; with `break_lock`, mark its ledger
    stopped and return what was broken (a note for the operator). A ledger cp-1 cannot read
    refuses too: the lock fails closed."""
    cfg = fleet_config(loaded)
    name = ledger_name(loaded.cluster.name)
    try:
        ledger = live_rollout(loaded, runner, sleep=sleep)
    except fleetgate.LedgerError as exc:
        why = " ".join(str(exc).split())
        raise RolloutHoldsLock(
            path,
            f"cannot read the rollout Job's ledger {cfg.namespace}/{name} on the first "
            f"control-plane node, so a rollout may hold the cluster: {why}",
        ) from None
    if ledger is None:
        return None
    now = time.time()
    beat = (
        f"heartbeat {int(now - ledger.heartbeat)} s ago"
        if ledger.fresh(now)
        else f"heartbeat renewed within {WATCH_S} s"
    )
    holder = (
        f"the rollout Job {cfg.namespace}/{name} (run {ledger.run}, "
        f"{len(ledger.in_flight)} host(s) in flight, {beat})"
    )
    if not break_lock:
        raise RolloutHoldsLock(
            path, f"{holder} holds the cluster; wait for it, or pass --break-lock to stop it"
        )
    api = _api(loaded, runner or run_remote)
    assert api is not None

    def stop(found: fleetgate.Ledger):
        found.stopped = f"stopped by --break-lock ({who or 'another apply'})"
        return None, True

    try:
        fleetgate.swap(api, name, stop)
    except fleetgate.LedgerError as exc:
        raise RolloutHoldsLock(path, f"{holder} holds the cluster; --break-lock: {exc}") from None
    return f"stopped {holder}: its shards end without trying their other hosts"
