"""One shard of `gpuinfra drift --job`, as a pod of the Job runs it (`gpuinfra drift --job-shard
FOLDER`): its sheet's hosts asked over ssh as the forced-command user, each answer's digest
compared with the one its last apply kept, one line of report on stdout and its sha256 in the
termination message. It never sees the inventory, the records or `.state/`
(docs/design/fleet-jobs.md sections 1 and 4).

Standard library only, and the sheet's format is this code's: a pod of another gpuinfra exits 2
(bad input: the Job's pod failure policy then fails the whole Job at once).

The sheet and its wire format are also what the controller (day2/fleetjob.py) writes and reads:
`shard_sheet`, `report_line` and `read_report` are the two sides of one contract.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from engine.fingerprint.check import KEEPALIVE_S, Asking
from engine.incluster import TERMINATED, copy_key
from toolkit import driftprobe

SHEET_FORMAT = 1  # bump when the sheet or the report changes: a skewed pod exits 2
SHEET = "sheet.json.gz"
KNOWN_HOSTS = "known_hosts"
# Where the Job mounts the shards' data (one folder per shard) and the drift key.
DATA_DIR = "/etc/gpuinfra/drift"
KEY_FILE = "/etc/gpuinfra/drift-key/id_ed25519"
RUN_DIR = "/run/gpuinfra"  # a memory emptyDir: ssh refuses a key its group may read
TERMINATION_LOG = "/dev/termination-log"
# The container's memory high-water mark, as its cgroup keeps it: v1, then v2 (memory.peak,
# Linux 5.19+). Readable by the pod's user; absent elsewhere, and then not reported.
MEMORY_PEAK_FILES = (
    "/sys/fs/cgroup/memory/memory.max_usage_in_bytes",
    "/sys/fs/cgroup/memory.peak",
)

MATCHED, UNSETTLED, SSH = "matched", "unsettled", "ssh"
# A shard stopped before it reported exits TERMINATED. The pod's process is its PID 1, which the
# kernel spares a SIGTERM it has no handler for: without one the shard would finish, report and
# succeed after its pod was deleted.


class Terminated(Exception):
    """SIGTERM arrived before the shard reported."""


def _terminated(signum, frame) -> None:
    raise Terminated


class ShardInputError(Exception):
    """The sheet cannot be read or is another gpuinfra's: exit 2."""


@dataclass(frozen=True)
class ShardHost:
    name: str
    status: str  # matched, unsettled or ssh
    reason: str = ""
    seconds: float = 0.0


def shard_folder(index: int) -> str:
    return f"shard-{index}"


def shard_sheet(
    run: str, shard: int, count: int, settings: dict, hosts: list[tuple[str, str, str]]
) -> bytes:
    """The gzipped sheet of one shard: the run, the shard, the ssh settings and each host's
    (name, address, probe_digest)."""
    sheet = {"format": SHEET_FORMAT, "run": run, "shard": shard, "count": count, **settings}
    sheet["hosts"] = [{"name": n, "address": a, "probe_digest": d} for n, a, d in hosts]
    return gzip.compress(json.dumps(sheet, separators=(",", ":")).encode(), mtime=0)


def read_sheet(folder: Path, index: int) -> dict:
    path = folder / shard_folder(index) / SHEET
    try:
        sheet = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError) as exc:
        raise ShardInputError(f"{path}: cannot read the sheet ({exc})") from None
    if not isinstance(sheet, dict) or sheet.get("format") != SHEET_FORMAT:
        raise ShardInputError(
            f"{path}: sheet format {sheet.get('format') if isinstance(sheet, dict) else '?'}, "
            f"this gpuinfra reads {SHEET_FORMAT} (the image and the controller differ)"
        )
    if sheet.get("shard") != index:
        raise ShardInputError(f"{path}: the sheet of shard {sheet.get('shard')}, not {index}")
    return sheet


def shard_argv(sheet: dict, key: str, known_hosts: str, address: str) -> list[str]:
    """ssh to one host as the forced-command user: no command (the host forces its own), no
    pty, no agent or config of the pod's, host keys checked against the shard's known_hosts; a
    silent host is dropped as a local probe drops it (check.probe_argv)."""
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-T",
        "-i",
        key,
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        f"ServerAliveInterval={KEEPALIVE_S}",
        "-o",
        "ServerAliveCountMax=6",
        "-o",
        f"ConnectTimeout={int(sheet['timeout'])}",
        "-p",
        str(int(sheet["port"])),
        f"{sheet['user']}@{address}",
    ]


def judged(entry: dict, answer: tuple[int, bytes, bytes, float]) -> ShardHost:
    code, output, errors, seconds = answer
    name = entry["name"]
    if code in (255, -1):
        said = errors.decode(errors="replace").strip().splitlines()
        return ShardHost(name, SSH, said[-1] if said else "ssh failed", seconds)
    digest = driftprobe.answer_digest(output)
    if code == 0 and digest == entry["probe_digest"]:
        return ShardHost(name, MATCHED, "", seconds)
    if digest is None:
        why = f"the probe did not answer (exit {code})"
    elif code != 0:
        why = f"the probe exited {code}"
    else:
        why = "its answer differs from the one its last apply kept"
    return ShardHost(name, UNSETTLED, why, seconds)


def report_line(run: str, shard: int, count: int, hosts: list[ShardHost], usage: dict) -> bytes:
    """The shard's report: one line, gzip and base64 of its JSON."""
    document = {
        "format": SHEET_FORMAT,
        "run": run,
        "shard": shard,
        "count": count,
        "hosts": [[h.name, h.status, h.reason, round(h.seconds, 3)] for h in hosts],
        "rusage": usage,
    }
    packed = gzip.compress(json.dumps(document, separators=(",", ":")).encode(), mtime=0)
    return base64.b64encode(packed)


def termination_message(run: str, shard: int, count: int, hosts: int, line: bytes) -> str:
    sha = hashlib.sha256(line).hexdigest()
    return json.dumps({"run": run, "shard": shard, "count": count, "hosts": hosts, "sha256": sha})


def read_report(line: bytes) -> dict:
    """The controller's side of `report_line` (ValueError when it is not one)."""
    try:
        document = json.loads(gzip.decompress(base64.b64decode(line, validate=True)))
    except (ValueError, EOFError, OSError) as exc:
        raise ValueError(f"not a shard report ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != SHEET_FORMAT:
        raise ValueError("not a shard report of this gpuinfra")
    return document


def _usage(started: float | None = None, peak_files: tuple[str, ...] = MEMORY_PEAK_FILES) -> dict:
    """The shard's own cost: CPU of itself and its ssh clients, the largest process, its wall
    seconds, and the container's memory peak where its cgroup shows one (the benchmark's
    per-shard figures, benchmarks/jobs.py)."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    usage: dict = {
        "cpu_s": round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 3),
        "max_rss_kib": max(own.ru_maxrss, children.ru_maxrss),
    }
    if started is not None:
        usage["seconds"] = round(time.monotonic() - started, 3)
    for path in peak_files:
        try:
            usage["memory_peak_bytes"] = int(Path(path).read_text().split()[0])
            break
        except (OSError, ValueError, IndexError):
            continue
    return usage


def run_shard(
    index: int,
    folder: Path = Path(DATA_DIR),
    key_source: Path = Path(KEY_FILE),
    run_dir: Path = Path(RUN_DIR),
    stdout: IO[bytes] | None = None,
    termination: Path = Path(TERMINATION_LOG),
) -> int:
    """Ask every host of shard `index`; 0 when it reported (whatever the hosts answered),
    2 when its input is bad, TERMINATED when stopped before it reported."""
    started = time.monotonic()
    try:
        sheet = read_sheet(folder, index)
        key = run_dir / "id_ed25519"
        copy_key(key_source, key)
    except (ShardInputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    known_hosts = str(folder / shard_folder(index) / KNOWN_HOSTS)
    asking = Asking("gpuinfra-drift-job", int(sheet["parallel"]))
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        for entry in sheet["hosts"]:
            argv = shard_argv(sheet, str(key), known_hosts, entry["address"])
            asking.send(entry["name"], argv, [])
        asking.go()
        hosts = [judged(entry, asking.answer(entry["name"])) for entry in sheet["hosts"]]
    except Terminated:
        asking.cancel()
        print("error: stopped (SIGTERM) before reporting: the Job starts this shard again",
              file=sys.stderr)  # fmt: skip
        return TERMINATED
    finally:
        signal.signal(signal.SIGTERM, previous)
    line = report_line(sheet["run"], index, sheet["count"], hosts, _usage(started))
    out = stdout if stdout is not None else sys.stdout.buffer
    out.write(line + b"\n")
    out.flush()
    message = termination_message(sheet["run"], index, sheet["count"], len(hosts), line)
    termination.write_text(message)
    return 0


def main(args: list[str]) -> int:
    """`gpuinfra drift --job-shard FOLDER`: the shard whose index Kubernetes gives the pod."""
    if len(args) != 1 or not args[0] or args[0].startswith("-"):
        print("usage: gpuinfra drift --job-shard FOLDER", file=sys.stderr)
        return 2
    index = os.environ.get("JOB_COMPLETION_INDEX", "")
    if not index.isdigit():
        print(
            "error: JOB_COMPLETION_INDEX is not set: not a pod of an Indexed Job", file=sys.stderr
        )
        return 2
    return run_shard(int(index), Path(args[0]))
