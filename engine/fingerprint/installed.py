"""The drift Job's probes, installed by an apply (drift_job.enabled): for each host it recorded,
the probe of its record written to the host, run there as the forced command will run it,
checked against the record, and its answer's digest kept in the record (`probe_digest`).

One OpenSSH round trip per host with the operator's key (toolkit/remote.py), `PARALLEL` at
once. A host whose install fails, or whose answer differs from its record, keeps no digest:
`drift --job` then leaves it to the controller's exact check.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from engine.fingerprint.probe import differences, probe_script, read_probe
from engine.fingerprint.records import Record, load_record, save_record
from toolkit import driftprobe
from toolkit.remote import RemoteRunner, run_remote

if TYPE_CHECKING:
    from inventory.model import LoadedCluster

PARALLEL = 200
INSTALL_TIMEOUT_S = 120  # drift's own probe timeout (check.PROBE_TIMEOUT_S)


def installed_probe(name: str, record: Record) -> bytes:
    """The probe file of a host's record: its commands batched as drift asks them."""
    commands = [command for command, _, _ in record.commands]
    return driftprobe.probe_file(probe_script(commands, record.marker), name).encode()


def checked_digest(record: Record, output: bytes) -> tuple[str | None, str]:
    """(the answer's digest, "") when the probe's answer matches the record; (None, why)."""
    lines = driftprobe.answer_lines(output)
    if lines is None:
        return None, "the probe did not answer"
    commands = [command for command, _, _ in record.commands]
    found = differences(record, read_probe("\n".join(lines).encode(), record.marker, commands))
    if found:
        return None, f"its answer differs from its record ({found[0]})"
    return driftprobe.answer_digest(output), ""


def install_probes(
    loaded: LoadedCluster, hosts: Iterable[str], runner: RemoteRunner = run_remote
) -> dict[str, str]:
    """Install each host's probe and keep its digest in its record; host -> why not, for the
    hosts that keep none (no record, a failed install, an answer unlike the record)."""
    failed: dict[str, str] = {}

    def install(name: str) -> None:
        record = load_record(loaded.state_dir, name)
        if record is None or not record.marker:
            failed[name] = "no record with a probe marker"
            return
        script = installed_probe(name, record)
        command = driftprobe.install_command(len(script))
        result = runner(loaded, name, command, timeout=INSTALL_TIMEOUT_S, stdin=script)
        if not result.ok:
            failed[name] = f"install failed: {result.last_line()}"
            save_record(loaded.state_dir, name, replace(record, probe_digest=""))
            return
        digest, why = checked_digest(record, result.stdout.encode())
        if digest is None:
            failed[name] = why
        save_record(loaded.state_dir, name, replace(record, probe_digest=digest or ""))

    names = list(hosts)
    if names:
        with ThreadPoolExecutor(max_workers=min(PARALLEL, len(names))) as pool:
            list(pool.map(install, names))
    return failed
