"""One shard of `gpuinfra apply --job`, as a pod of the Job runs it (`gpuinfra apply
/etc/gpuinfra/rollout/cluster.yml --job-shard`): its share of the workers applied with the
operator's runner, each step granted by the shared ledger (engine/fleetgate.py), its joins paced
by its own time slots (toolkit/pacing.py SlotPacer), its progress written after each step so a
retried pod resumes. It has the inventory, its run's certified key, a join token and, of
`.state/`, only the entries its workers' files read (each one those workers hold).

Exit codes: 0 the shard ran to its end (its hosts' ends are in its progress, failures
included), 1 the ledger could not be read or written (the Job retries the index), 2 bad input
(another gpuinfra's settings: the Job fails at once), 143 SIGTERM (deleted, evicted), once
the step in progress ended.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

from engine import fleetgate
from engine.incluster import TERMINATED, copy_key
from toolkit.statefiles import private_dir, write_secret_atomically

SETTINGS = "settings.json"
SETTINGS_FORMAT = 2  # day2/rolloutjob.py writes it (2: the state entries are staged)
# day2/rolloutjob.py MOUNTED_KEY and POD_KEY: the Secret's file, and its 0400 copy in memory.
MOUNTED_KEY = Path("/etc/gpuinfra/rollout-key/id_ed25519")
POD_KEY = Path("/run/gpuinfra/id_ed25519")
# The run's certificate, beside the key where ssh and paramiko look for it.
CERT_SUFFIX = "-cert.pub"
# day2/rolloutjob.py MOUNTED_STATE: the state entries the workers' files read, as one JSON
# document. They are staged with a copy of the inventory in memory (the ConfigMap's folder is
# read-only, and an inventory's state is the `.state/` beside it: LoadedCluster.state_dir).
MOUNTED_STATE = Path("/etc/gpuinfra/rollout-state/state.json")
STAGED = Path("/run/gpuinfra/rollout")


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


def stage_inventory(cluster_file: Path, mounted_state: Path, folder: Path) -> Path:
    """The inventory copied into `folder`, the state entries beside it in `.state/`, 0600 in
    0700 folders as the controller keeps them; the copy's path. An entry that would land
    outside `.state/` is another gpuinfra's input (ShardInputError)."""
    try:
        entries = json.loads(mounted_state.read_text())
        text = cluster_file.read_bytes()
    except (OSError, ValueError) as exc:
        raise ShardInputError(f"{mounted_state}: unreadable: {exc}") from None
    for relative in entries:
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            raise ShardInputError(f"{mounted_state}: {relative!r} is not a path under .state/")
    staged = folder / cluster_file.name
    try:
        state_dir = private_dir(private_dir(folder) / ".state")
        for relative, content in sorted(entries.items()):
            path = state_dir / relative
            private_dir(path.parent)
            write_secret_atomically(path, content.encode())
        write_secret_atomically(staged, text)
    except OSError as exc:  # the pod's memory folder: every index would fail alike
        raise ShardInputError(f"{folder}: cannot stage the inventory: {exc.strerror}") from None
    return staged


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


# Set by SIGTERM: the shard's gate lets the step in progress end (a dpkg, a join) and starts
# no other (fleetgate.ShardTerminated); the pod's grace period (the Job's
# terminationGracePeriodSeconds) bounds how long that may take.
TERMINATING = threading.Event()


def exit_on_sigterm() -> None:
    """The pod's PID 1: without a handler the kernel spares it the SIGTERM of a deleted pod.
    The step in progress ends first, then the shard exits 143: the hosts between two steps stay
    in flight in the ledger and the progress, and the next pod of the index adopts them."""
    signal.signal(signal.SIGTERM, lambda signum, frame: TERMINATING.set())


def main(
    cluster_file: Path,
    api: fleetgate.LedgerApi | None = None,
    environ=os.environ,
    mounted_state: Path = MOUNTED_STATE,
    staged: Path = STAGED,
) -> int:
    """Run the shard; prints one JSON line of its hosts' ends."""
    folder = cluster_file.parent
    try:
        settings = read_settings(folder)
        index = shard_index(settings, environ)
        cluster_file = stage_inventory(cluster_file, mounted_state, staged)
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
    except fleetgate.ShardTerminated as exc:
        print(f"gpuinfra rollout shard {index}: {exc}", file=sys.stderr)
        return TERMINATED
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
    gate = fleetgate.LedgerGate(api, ledger, pod, progress=progress, terminating=TERMINATING)
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
    with fleetgate.Keepalive(api, ledger):
        report = run(loaded, options, gate=gate)
    ends = dict(progress.hosts)
    for name, entry in report.hosts.items():
        ends.setdefault(name, entry.status.value)
        # Why a host failed, in the pod's log: the controller's report quotes its last lines.
        failed = [op for op in entry.operations if op.error] if entry.error is None else []
        why = entry.error or "; ".join(f"{op.name}: {op.error}" for op in failed)
        if why:
            print(f"gpuinfra rollout shard {index}: {name}: {why}"[:2000], file=sys.stderr)
    return ends
