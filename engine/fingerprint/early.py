"""The drift that starts before the command line is imported: the probes sent from the sheet an
apply kept (`send_early`), and the answer given without loading the inventory (`settled`)."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.fingerprint import check
from engine.fingerprint.check import (
    DEFAULT_PARALLEL,
    Asking,
    FastCheck,
    _matched,
    new_marker,
)
from engine.fingerprint.keys import (
    cluster_digest,
    code_digest,
    host_roles,
    inputs_stand,
    state_digest,
)
from engine.fingerprint.records import FORMAT, RECORDS, Record, load_record
from toolkit.ssh import ssh_settings
from toolkit.statefiles import write_secret_atomically

if TYPE_CHECKING:
    from inventory.model import LoadedCluster


# -- sent before the inventory is loaded -----------------------------------------------------

EARLY_SHEET = ".probes.json"  # under .state/converged/ (a dot: no host is named so)
# Files in the inventory's folder beyond which it gets no stamp (and drift sends nothing early).
STAMP_LIMIT = 5000
# `gpuinfra drift` options that change neither which hosts are asked nor how.
_EARLY_OPTIONS = ("--format", "-f", "--report", "--junit")  # see PlainDrift
_FORMATS = ("table", "json")  # cli.options.OutputFormat
_early: Asking | None = None
_PLUGINS = "PYDANTIC_DISABLE_PLUGINS"  # cli/__init__.py


def inventory_stamp(source: Path, folder: bool = True) -> str | None:
    """What the inventory in `source` is, without reading it: each file's path, size,
    modification and change times and inode (an edit, a file put back changes it). With
    `folder`, every file of its folder, .state/ aside: an Ansible inventory reads group_vars
    and host_vars there. A cluster file's load reads the file alone, so reports or rendered
    files kept beside it change nothing. None when a file cannot be seen or there are more than
    STAMP_LIMIT."""
    source = source.resolve()
    digest = hashlib.sha256(f"{source}\n".encode())
    if not folder:
        try:
            st = source.stat()
        except OSError:
            return None
        line = f"{source} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}\n"
        digest.update(line.encode())
        return digest.hexdigest()
    folders, seen = [source.parent], 0
    try:
        while folders:
            folder = folders.pop()
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
            for entry in entries:
                if folder == source.parent and entry.name == ".state":
                    continue
                seen += 1
                if seen > STAMP_LIMIT:
                    return None
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                    continue
                st = entry.stat()
                line = f"{entry.path} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}\n"
                digest.update(line.encode())
    except OSError:
        return None
    return digest.hexdigest()


def write_early_sheet(loaded: LoadedCluster) -> None:
    """After an apply has kept its records: each recorded host's probe command line (for a
    record of all the host's roles, the only ones a plain drift asks), with the inventory's
    stamp, for the next drift's send_early. Removed when there is none to write."""
    path = loaded.state_dir / RECORDS / EARLY_SHEET
    ssh = ssh_settings(loaded)
    hosts = {}
    for name, host in loaded.cluster.hosts.items():
        record = load_record(loaded.state_dir, name)
        if record is not None and record.roles == host_roles(host.groups, cluster=loaded.cluster):
            hosts[name] = check.probe_argv(ssh, str(host.address))
    whole_folder = loaded.text_digest is None  # an Ansible inventory (a cluster file: its text)
    stamp = inventory_stamp(loaded.source, whole_folder)
    if not hosts or stamp is None:
        path.unlink(missing_ok=True)
        return
    source = str(loaded.source.resolve())
    sheet = {"format": FORMAT, "source": source, "code": code_digest()}
    sheet |= {"stamp": stamp, "whole_folder": whole_folder}
    sheet["alone"] = _alone(loaded, hosts) if len(hosts) == len(loaded.cluster.hosts) else None
    write_secret_atomically(path, json.dumps({**sheet, "hosts": hosts}).encode())


def _alone(loaded: LoadedCluster, hosts: dict[str, list[str]]) -> dict | None:
    """What a load of the inventory depends on beyond the code (`settled`): the cluster file's
    text, the names it was read by, the home folder `~` stands for, the user, and the SSH key
    that validation checks; with the cluster's digest and every host's roles. None for an
    Ansible inventory (ansible-core reads its configuration and may run scripts)."""
    if loaded.text_digest is None:
        return None
    ssh = ssh_settings(loaded)
    return {
        "text": loaded.text_digest,
        "target": os.path.join(os.getcwd(), loaded.source),  # the folder `./key` is taken from
        "cwd": os.getcwd(),  # what a relative path in the probes' command lines is taken from
        "home": os.path.expanduser("~"),
        "uid": os.geteuid(),
        "plugins": os.environ.get(_PLUGINS),  # pydantic's plugins take part in validation
        "key": None if ssh.key is None else [str(ssh.key), _file_stamp(ssh.key)],
        "cluster": loaded.cluster.name,
        "cluster_digest": cluster_digest(loaded),
        "roles": {
            name: list(host_roles(loaded.cluster.hosts[name].groups, cluster=loaded.cluster))
            for name in hosts
        },
    }


def _file_stamp(path: Path) -> list[int] | None:
    """A file's identity, mode, owner, size and times (a chmod or chown moves ctime too)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def send_early(args: list[str]) -> None:
    """For `gpuinfra drift CLUSTER` (with at most --format, --report and --junit), before
    anything else is imported: send each recorded host's probe now, to the command line the
    last apply's sheet names, while the inventory's stamp and the code are the sheet's (so the
    inventory is one this code validated: the probes only read). `Probes` keeps those it would
    send itself (claim_early); the rest are stopped there, and all at exit."""
    global _early, _sheet
    plain = plain_drift(args)
    if plain is None:
        return
    cluster = plain.cluster
    from inventory.errors import InventoryInvalid
    from inventory.paths import locate

    try:
        target = locate(Path(cluster))
        source = target.resolve()
        state_dir = source.parent / ".state"
        sheet = json.loads((state_dir / RECORDS / EARLY_SHEET).read_bytes())
        if sheet["format"] != FORMAT or sheet["source"] != str(source):
            return
        # The inventory this code validated when it wrote the sheet, as it was then.
        stamp = inventory_stamp(source, sheet["whole_folder"] is not False)
        if sheet["stamp"] != stamp or sheet["code"] != code_digest():
            return
        probes, records = [], {}
        for name, argv in sheet["hosts"].items():
            record = load_record(state_dir, name)
            if record is not None:
                commands = [command for command, _, _ in record.commands]
                probes.append((name, [str(part) for part in argv], commands))
                records[name] = record
    except (OSError, ValueError, KeyError, TypeError, AttributeError, InventoryInvalid):
        return  # drift goes on without: the inventory's own errors are reported by its load
    asking = Asking(new_marker(), DEFAULT_PARALLEL)
    atexit.register(asking.cancel)
    for name, argv, commands in probes:
        asking.send(name, argv, commands)
    asking.go()
    _early = asking
    _sheet = _Sheet(str(target), source, state_dir, sheet, records)


def claim_early() -> Asking | None:
    """The probes send_early sent, once."""
    global _early
    asking, _early = _early, None
    return asking


@dataclass(frozen=True)
class _Sheet:
    target: str  # the inventory file as the command line named it (locate), not resolved
    source: Path
    state_dir: Path
    content: dict
    records: dict[str, Record]


_sheet: _Sheet | None = None


@dataclass(frozen=True)
class Settled:
    cluster: str
    hosts: list[str]  # every host of the cluster, in inventory order
    result: FastCheck


def settled() -> Settled | None:
    """drift's answer without loading the inventory, when send_early sent every host's probe
    and each answered as its record says; None (and the probes left for `Probes`) otherwise.

    The answer is the one the inventory's load would lead to. That load is a function of the
    cluster file's text, the code (code_digest: the roles, the inventory layer, the templates,
    every installed distribution), the names the file was read by, `~` and, for validation, the
    SSH key's mode and readability. The last apply wrote each of those into the sheet, from the
    load it validated. Here each is compared with what it is now: the text read again, the key
    stat'ed again. Probes.finish is then repeated. The records are read again. The state is
    hashed again, and the clock is read, for the inputs that stand for each key. A host whose
    roles have changed since its record, or an apply that is running, leaves the answer to
    the command's own path."""
    global _early
    found, asking = _sheet, _early
    if found is None or asking is None:
        return None
    try:
        alone = found.content["alone"]
        if alone is None or not _loads_the_same(found, alone):
            return None
        order = list(alone["roles"])
        if set(order) != set(found.records) or set(order) != set(asking.sent):
            return None
        if any(found.records[n].roles != tuple(alone["roles"][n]) for n in order):
            return None
        from engine.applylock import current_holder

        if current_holder(found.state_dir) is not None:
            return None  # the command's own path says so, and checks as it does then
        common = f"{code_digest()} {alone['cluster_digest']} {state_digest(found.state_dir)}"
        if not all(inputs_stand(found.records[n], common, n) for n in order):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    result = FastCheck(early=len(order), started=asking.started, alone=True)
    for name in order:
        matched = _matched(name, found.records[name], asking.answer(name), asking.marker)
        if isinstance(matched, str):
            return None
        result.reports[name] = matched
    result.seconds = time.monotonic() - result.started
    _early = None
    return Settled(alone["cluster"], order, result)


def _loads_the_same(found: _Sheet, alone: dict) -> bool:
    from inventory.paths import locate, text_digest

    target = os.path.join(os.getcwd(), locate(Path(found.target)))
    if target != alone["target"] or os.getcwd() != alone["cwd"]:
        return False
    if os.path.expanduser("~") != alone["home"] or os.geteuid() != alone["uid"]:
        return False
    if os.environ.get(_PLUGINS) != alone["plugins"]:
        return False
    if alone["key"] is not None:
        key, stamp = alone["key"]
        if stamp is None or _file_stamp(Path(key)) != stamp or not os.access(key, os.R_OK):
            return False
    return text_digest(found.source.read_text()) == alone["text"]


@dataclass(frozen=True)
class PlainDrift:
    """`gpuinfra drift CLUSTER` with at most --format, --report and --junit, as typer reads it."""

    cluster: str
    output: str = "table"
    report: str | None = None
    junit: str | None = None


_OPTION_FIELDS = {"--format": "output", "-f": "output", "--report": "report", "--junit": "junit"}


def plain_drift(args: list[str]) -> PlainDrift | None:
    """drift's `args` when they are a plain drift, else None: another option, a second argument,
    a format typer refuses, or a value that is empty or starts with "-" (what typer would do
    with those is not this function's to guess)."""
    positional: list[str] = []
    given: dict[str, str] = {}
    values = iter(args)
    for arg in values:
        option, has_value, value = arg.partition("=")
        if arg in _EARLY_OPTIONS:
            option, value = arg, next(values, "")
        elif not (arg.startswith("--") and has_value and option in _EARLY_OPTIONS):
            if arg.startswith("-"):
                return None
            positional.append(arg)
            continue
        if not value or value.startswith("-"):
            return None
        given[_OPTION_FIELDS[option]] = value  # the last one given wins, as in typer
    if len(positional) != 1 or given.get("output", "table") not in _FORMATS:
        return None
    return PlainDrift(positional[0], **given)
