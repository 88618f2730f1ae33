"""One shard of `gpuinfra apply --job`, as a pod of the Job runs it (`gpuinfra apply
/etc/gpuinfra/rollout/cluster.yml --job-shard`): its share of the workers applied with the
operator's runner, each step granted by the shared ledger (engine/fleetgate.py), its joins paced
by its own time slots (toolkit/pacing.py SlotPacer), its progress written after each step so a
retried pod resumes. It has the inventory, its run's certified key and a join token; no `.state/`.

Exit codes: 0 the shard ran to its end (its hosts' ends are in its progress, failures
included), 1 the ledger could not be read or written (the Job retries the index), 2 bad input
(another gpuinfra's settings: the Job fails at once), 143 SIGTERM (deleted, evicted).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from engine import fleetgate
from engine.incluster import TERMINATED, copy_key

SETTINGS = "settings.json"
SETTINGS_FORMAT = 1  # day2/rolloutjob.py writes it
# day2/rolloutjob.py MOUNTED_KEY and POD_KEY: the Secret's file, and its 0400 copy in memory.
MOUNTED_KEY = Path("/etc/gpuinfra/rollout-key/id_ed25519")
POD_KEY = Path("/run/gpuinfra/id_ed25519")
# CERT_SUFFIX there: the run's certificate, beside the key where ssh and paramiko look for it.
CERT_SUFFIX = "-cert.pub"


class ShardInputError(Exception):
    """The settings cannot be read or are another gpuinfra's: exit 2."""


def read_settings(folder: Path) -> dict:
    try:
        settings = json.loads((folder / SETTINGS).read_text())
    except (OSError, ValueError) as exc:
        raise ShardInputError(f"{folder / SETTINGS}: unreadable: {exc}") from None
    if settings.get("format") != SETTINGS_FORMAT:
        raise ShardInputError(
            f"{folder / SETTINGS}: format {settings.get('format')!r}, this gpuinfra reads "
            f"{SETTINGS_FORMAT} (the image and the controller differ)"
        )
    return settings


def shard_index(settings: dict, environ=os.environ) -> int:
    try:
        index = int(environ["JOB_COMPLETION_INDEX"])
    except (KeyError, ValueError):
        raise ShardInputError(
            "JOB_COMPLETION_INDEX: not set (not a pod of an Indexed Job)"
        ) from None
    if not 0 <= index < settings["count"]:
        raise ShardInputError(f"JOB_COMPLETION_INDEX={index}: not below {settings['count']}")
    return index


def exit_on_sigterm() -> None:
    """The pod's PID 1: without a handler the kernel spares it the SIGTERM of a deleted pod.
    Ending at once leaves the hosts in flight in the ledger and the progress: the next pod of
    the index adopts them."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(TERMINATED))


def main(cluster_file: Path, api: fleetgate.LedgerApi | None = None, environ=os.environ) -> int:
    """Run the shard; prints one JSON line of its hosts' ends."""
    folder = cluster_file.parent
    try:
        settings = read_settings(folder)
        index = shard_index(settings, environ)
    except ShardInputError as exc:
        print(f"gpuinfra rollout shard: {exc}", file=sys.stderr)
        return 2
    pod = environ.get("POD_NAME", f"shard-{index}")
    api = api or fleetgate.InClusterApi(settings["namespace"])
    try:
        if MOUNTED_KEY.exists():
            copy_key(MOUNTED_KEY, POD_KEY)
            mounted_cert = MOUNTED_KEY.with_name(MOUNTED_KEY.name + CERT_SUFFIX)
            copy_key(mounted_cert, POD_KEY.with_name(POD_KEY.name + CERT_SUFFIX))
    except OSError as exc:
        print(f"gpuinfra rollout shard: the rollout key: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        report = run_shard(cluster_file, settings, index, pod, api)
    except fleetgate.LedgerError as exc:
        print(f"gpuinfra rollout shard {index}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"run": settings["run"], "shard": index, "pod": pod, "hosts": report}))
    return 0


def run_shard(
    cluster_file: Path, settings: dict, index: int, pod: str, api: fleetgate.LedgerApi
) -> dict[str, str]:
    """Resume from the shard's progress, then apply what is left through the ledger's gate."""
    from engine.context import load
    from engine.reports import Mode, RunOptions
    from engine.runner import run
    from inventory.model import StateAccess
    from toolkit.pacing import JOIN_PACER, Rate, SlotPacer, install_pacer

    ledger = settings["ledger"]
    hosts = settings["shards"][index]
    progress = fleetgate.ShardProgress(api, f"{ledger}-{index}", pod)
    gate = fleetgate.LedgerGate(api, ledger, pod, progress=progress)
    todo = fleetgate.resume(progress, gate, hosts)
    if not todo:
        return dict(progress.hosts)
    rate = Rate.parse(settings["join_rate"])
    install_pacer(JOIN_PACER, SlotPacer(rate, index, settings["count"]))
    loaded = load(cluster_file).with_state_access(StateAccess.existing)
    options = RunOptions(
        mode=Mode.apply,
        limit=tuple(todo),
        roles=tuple(settings["roles"]),
        parallel=settings.get("parallel"),
        connect_timeout=settings.get("connect_timeout", 10),
    )
    report = run(loaded, options, gate=gate)
    ends = dict(progress.hosts)
    for name, entry in report.hosts.items():
        ends.setdefault(name, entry.status.value)
    return ends
