"""The converged records (`.state/converged/<host>.json`): for a host an exact check found
converged, the key, the inputs and their horizon, each asked command's output digest and the
report."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.statefiles import write_secret_atomically

if TYPE_CHECKING:
    pass


# Bump when the record or the key changes meaning: old records are then ignored. The drift
# Job's fields (`marker`, `probe_digest`) did not bump it: they are written only when the Job
# is enabled, so every other inventory keeps its records byte for byte, and a record without
# them only sends its host to the exact check of `drift --job`.
FORMAT = 2
RECORDS = "converged"  # under the cluster's .state/
JOB_FIELDS = ("marker", "probe_digest")


@dataclass(frozen=True)
class Record:
    key: str
    roles: tuple[str, ...]
    # (command text, success exit codes, digest of its normalised stdout), in the order asked
    commands: tuple[tuple[str, tuple[int, ...], str], ...]
    operations: tuple[tuple[str, str], ...]  # (role, operation name) of the recorded report
    notes: tuple[str, ...] = ()
    reboot_required: bool = False
    # What the key was made of (digests of the code, the cluster, the state): says which changed.
    parts: tuple[str, ...] = ()
    inputs: str = ""  # the key without the rendered files (inputs_key)
    valid_until: float | None = None  # epoch seconds: when the clock may change the files
    # The drift Job (drift_job.enabled) only: the marker of the probe installed on the host
    # (random per record) and the digest of its answer when installed (toolkit/driftprobe.py).
    marker: str = ""
    probe_digest: str = ""

    def to_json(self) -> bytes:
        fields = asdict(self)
        for name in JOB_FIELDS:  # absent, not empty, without the Job: records as they were
            if not fields[name]:
                del fields[name]
        return json.dumps({"format": FORMAT, **fields}, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Record | None:
        try:
            raw = json.loads(data)
            if raw.pop("format", None) != FORMAT:
                return None
            return cls(
                key=raw["key"],
                roles=tuple(raw["roles"]),
                commands=tuple((c, tuple(codes), d) for c, codes, d in raw["commands"]),
                operations=tuple((role, name) for role, name in raw["operations"]),
                notes=tuple(raw["notes"]),
                reboot_required=bool(raw["reboot_required"]),
                parts=tuple(raw["parts"]),
                inputs=raw["inputs"],
                valid_until=raw["valid_until"],
                marker=raw.get("marker", ""),
                probe_digest=raw.get("probe_digest", ""),
            )
        except (ValueError, KeyError, TypeError):
            return None


# -- records ---------------------------------------------------------------------------------


def record_path(state_dir: Path, host: str) -> Path:
    return state_dir / RECORDS / f"{host}.json"


def load_record(state_dir: Path, host: str) -> Record | None:
    try:
        return Record.from_json(record_path(state_dir, host).read_bytes())
    except OSError:
        return None


def save_record(state_dir: Path, host: str, record: Record) -> None:
    """0600: a recorded command may name what is private to the cluster."""
    folder = state_dir / RECORDS
    folder.mkdir(mode=0o700, exist_ok=True)
    write_secret_atomically(record_path(state_dir, host), record.to_json())


def forget(state_dir: Path, hosts: Iterable[str]) -> None:
    for host in hosts:
        record_path(state_dir, host).unlink(missing_ok=True)
