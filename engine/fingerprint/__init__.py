"""The drift fast path: one round trip per host that proves the host is as its last exact check
found it, or hands the host to the exact check.

A deploy's plan is a function of what it is given (the code, the inventory, the controller's
`.state/`, the host's rendered files) and of the outputs of the commands its facts run on the
host. When an exact check (an apply with nothing to change, or the check an apply runs after
changing a host) finds a host converged, it keeps, under `.state/converged/<host>.json`:

- the key: a digest of everything the deploys were given, and the inputs: the same without the
  rendered files, with the moment until which the clock cannot change those files
  (toolkit/clock.py);
- every command the host's deploys asked for while preparing, as the SSH channel carried it,
  with a digest of its output;
- the report that check made for the host (operations, notes, reboot flag).

`gpuinfra drift` then sends each host one command that runs those same commands, and compares
the digests of their outputs here. Until that moment the inputs stand for the key
(the files are a function of them: the test of this module keeps the rendering from reading
anything else), so a clean fleet's drift renders nothing; after it, the files are rendered again
and the key compared. Same key and same outputs mean the same facts,
so the deploys would decide the same: nothing to change, and the recorded report is that answer.
Anything else (no record, another key, one output that differs, a command that fails) sends the
host to the exact check, operation by operation, which finds and shows what differs.

One output field is compared loosely: the access time pyinfra's file facts print (`stat`'s
atime), which reading a file may move. No operation of the roles passes `atime` to pyinfra (a
unit test reads their sources to keep it so), so no plan depends on it.

Standard library only at import (what needs pydantic, the roles or pyinfra is imported by the
function that uses it): a clean fleet's drift never imports pyinfra or paramiko, and the command
line sends the probes before it imports typer, pydantic or the inventory (`send_early`): the
hosts answer while the controller loads and checks the inventory and computes the keys. The
probes it sent are used only where they are, byte for byte, the ones `Probes` would send.

The modules, by concern: `records` (what a converged host keeps), `keys` (the digests of what
the deploys were given), `probe` (the one-round-trip script and its answer), `check` (asking
every host and comparing: `Probes`, `FastCheck`), `early` (the probes sent before the
command line is imported, and the answer given without loading the inventory), `recording`
(what an apply keeps once it has run) and `installed` (the drift Job's probes). The names the
runner, the command line and the drift use are re-exported here.
"""

from __future__ import annotations

from engine.fingerprint.check import FastCheck, Probes, new_marker, summary
from engine.fingerprint.early import (
    EARLY_SHEET,
    claim_early,
    inventory_stamp,
    plain_drift,
    send_early,
    settled,
    write_early_sheet,
)
from engine.fingerprint.keys import (
    Keys,
    code_digest,
    code_files,
    common_digest,
    host_key,
    host_roles,
    inputs_key,
    inputs_stand,
    record_keys,
    state_digest,
)
from engine.fingerprint.probe import (
    differences,
    file_fact_text,
    grouped,
    output_digest,
    probe_script,
    read_probe,
    unwrapped,
)
from engine.fingerprint.records import Record, forget, load_record, record_path, save_record

__all__ = [
    "EARLY_SHEET",
    "FastCheck",
    "Keys",
    "Probes",
    "Record",
    "claim_early",
    "code_digest",
    "code_files",
    "common_digest",
    "differences",
    "file_fact_text",
    "forget",
    "grouped",
    "host_key",
    "host_roles",
    "inputs_key",
    "inputs_stand",
    "inventory_stamp",
    "load_record",
    "new_marker",
    "output_digest",
    "plain_drift",
    "probe_script",
    "read_probe",
    "record_keys",
    "record_path",
    "save_record",
    "send_early",
    "settled",
    "state_digest",
    "summary",
    "unwrapped",
    "write_early_sheet",
]
