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
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.reports import HostReport, HostStatus, OperationResult
from toolkit import clock
from toolkit.ssh import SSHSettings
from toolkit.statefiles import PLACEHOLDER, StateMissing, write_secret_atomically

if TYPE_CHECKING:
    from inventory.model import LoadedCluster
    from toolkit.spec import HostContext, ManagedFile

FORMAT = 2  # bump when the record or the key changes meaning: old records are then ignored
RECORDS = "converged"  # under the cluster's .state/
# pyinfra's file facts (pyinfra/facts/files.py LINUX_STAT_COMMAND) print "... atime=N mtime=...".
_ATIME = re.compile(r"^(user=\S* group=\S* mode=\S* atime=)-?[0-9]+( mtime=)")
# Files under .state/ that say who runs, not what the deploys read.
_STATE_IGNORED = {".lock", "apply.lock", RECORDS}


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

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1).encode()

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
            )
        except (ValueError, KeyError, TypeError):
            return None


# -- what the deploys were given ---------------------------------------------------------------

_code_digest: str | None = None
_ROOT = Path(__file__).resolve().parents[1]


def code_digest(again: bool = False) -> str:
    """The roles' and the inventory layer's code and templates, Python's version and every
    installed distribution's name and version (pyinfra's, Jinja's, pydantic's...), as they were
    at the first call of the process (`again`: as they are on disk now, the first kept). The
    command line takes it before an apply imports the inventory or a role (cli/launch.py); the
    apply records its hosts only when the files are still those at its end (engine/runner.py),
    so a record never names code the run did not have loaded."""
    global _code_digest
    if _code_digest is None or again:
        digest = hashlib.sha256(f"{sys.version}\n{' '.join(_distributions())}\n".encode())
        for name, path in code_files():
            digest.update(f"{name}\n".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        if _code_digest is None:
            _code_digest = digest.hexdigest()
        return digest.hexdigest()
    return _code_digest


def code_files() -> list[tuple[str, Path]]:
    """(name, path) of each file of the engine's, the roles' and the inventory layer's code and
    templates: the Python of those packages and of the role toolkit (`inventory/` also holds
    inventories) and every template."""
    from toolkit.assets import TEMPLATES

    root = Path(__file__).resolve().parents[1]
    found = []
    for folder, pattern in (
        (root / "engine", "*.py"),
        (root / "toolkit", "*.py"),
        (root / "roles", "*.py"),
        (root / "inventory", "*.py"),
        (TEMPLATES, "*"),
    ):
        for path in sorted(folder.rglob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                found.append((str(path.relative_to(folder.parent)), path))
    return found


def _distributions() -> list[str]:
    """The installed distributions as their metadata folders are named ("pyinfra-3.5.1.dist-info")
    on the import path: a listing, where importlib.metadata would parse each one. In the folder
    that holds gpuinfra's own code, gpuinfra's own metadata is left out, and only that: a
    checkout is on sys.path or not depending on how gpuinfra was started (its code is in
    code_files either way), while a wheel's folder is site-packages, which holds every
    dependency."""
    found = []
    for entry in dict.fromkeys(sys.path):
        if not entry:
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        own = Path(entry).resolve() == _ROOT
        found += (
            f"{entry}/{n}"
            for n in names
            if n.endswith((".dist-info", ".egg-info"))
            and not (own and n.startswith(("gpuinfra-", "gpuinfra.")))
        )
    return sorted(found)


def state_digest(state_dir: Path) -> str:
    """The controller's state the deploys read (PKI, keys, serials, the operator kubeconfig)."""
    digest = hashlib.sha256()
    if state_dir.is_dir():
        for relative, path in _state_files(state_dir):
            digest.update(f"{relative}\n".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _state_files(state_dir: Path) -> list[tuple[Path, Path]]:
    """(path relative to `state_dir`, path) of each state file, in order of the relative path.
    Symlinks are followed, as the deploys follow them when they read: a folder or key linked in
    from elsewhere is state all the same. A link to a folder it is inside is not entered again."""
    found: list[tuple[Path, Path]] = []

    def walk(folder: Path, inside: frozenset[str]) -> None:
        real = os.path.realpath(folder)
        if real in inside:
            return
        with os.scandir(folder) as listing:
            entries = list(listing)
        for entry in entries:
            path = Path(entry.path)
            relative = path.relative_to(state_dir)
            if relative.parts[0] in _STATE_IGNORED:
                continue
            if entry.is_dir():
                walk(path, inside | {real})
            elif entry.is_file() and not entry.name.endswith(".partial"):
                found.append((relative, path))

    walk(state_dir, frozenset())
    return sorted(found)


def cluster_digest(loaded: LoadedCluster) -> str:
    return hashlib.sha256(loaded.cluster.model_dump_json().encode()).hexdigest()


def inputs_key(common: str, name: str) -> str:
    """What a host's files and settings are made from: `common` (code, cluster, state) and its
    name; with the clock's horizon, it stands for `host_key` (see the module)."""
    return hashlib.sha256(f"{FORMAT}\n{common}\n{name}\ninputs\n".encode()).hexdigest()


def inputs_stand(record: Record, common: str, name: str) -> bool:
    """Whether the record's inputs stand for its key: the same inputs, and the clock not yet
    at the moment it may change the files."""
    return record.inputs == inputs_key(common, name) and not clock.expired(record.valid_until)


def host_key(ctx: HostContext, common: str, files: list[ManagedFile] | None = None) -> str:
    """The key of one host: `common` (code, cluster, state), its settings and its files
    (rendered now unless given)."""
    from engine.context import host_files

    digest = hashlib.sha256(f"{FORMAT}\n{common}\n{ctx.name}\n".encode())
    for role, settings in sorted(ctx.settings.items()):
        digest.update(f"{role} {settings.model_dump_json()}\n".encode())
    for managed in host_files(ctx) if files is None else files:
        head = f"{managed.role} {managed.path} {managed.mode} {managed.user}:{managed.group} "
        digest.update(head.encode() + hashlib.sha256(managed.content.encode()).digest())
    return digest.hexdigest()


def common_digest(loaded: LoadedCluster) -> str:
    return f"{code_digest()} {cluster_digest(loaded)} {state_digest(loaded.state_dir)}"


@dataclass(frozen=True)
class Keys:
    key: str
    inputs: str
    valid_until: float | None


def record_keys(
    loaded: LoadedCluster, names: Iterable[str], common: str
) -> tuple[dict[str, Keys], dict[str, str]]:
    """Each host's keys, its files rendered afresh as drift renders them (the state as it is,
    nothing made) while the clock is watched: the cluster files first (every host's horizon
    includes theirs), then each host's own. A host whose files need state that is missing
    (a role not applied yet) or hold a placeholder for what only apply makes (a certificate
    that entered its renewal window since) gets no keys: (keys, host -> why not). `common` is
    common_digest(loaded)."""
    from engine.context import host_contexts, host_files
    from inventory.model import StateAccess

    names = list(names)
    if not names:
        return {}, {}
    loaded = loaded.with_state_access(StateAccess.existing)
    contexts = {ctx.name: ctx for ctx in host_contexts(loaded)}
    keys: dict[str, Keys] = {}
    unkeyed: dict[str, str] = {}
    try:
        with clock.watching() as shared:
            contexts[names[0]].cluster_files()
    except StateMissing as missing:
        return {}, dict.fromkeys(names, str(missing))
    for name in names:
        try:
            with clock.watching() as horizon:
                files = host_files(contexts[name])
        except StateMissing as missing:
            unkeyed[name] = str(missing)
            continue
        held = [managed.path for managed in files if PLACEHOLDER in managed.content]
        if held:
            unkeyed[name] = f"{held[0]} would be made by the next apply"
            continue
        if shared.until is not None:
            horizon.limit(shared.until)
        key = host_key(contexts[name], common, files)
        keys[name] = Keys(key, inputs_key(common, name), horizon.until)
    return keys, unkeyed


def host_roles(groups: Iterable[str], wanted: Iterable[str] = ()) -> tuple[str, ...]:
    """The roles with a phase on a host of these groups (of `wanted`; all when empty), in
    phase order."""
    from engine.registry import PHASES

    wanted, groups = set(wanted), list(groups)
    roles = [
        phase.role
        for phase in PHASES
        if (not wanted or phase.role in wanted) and phase.applies_to(groups)
    ]
    return tuple(dict.fromkeys(roles))


# -- outputs ---------------------------------------------------------------------------------


def output_digest(stdout: Iterable[str]) -> str:
    """Digest of a command's stdout lines, with stat's access time masked (see the module)."""
    digest = hashlib.sha256()
    for line in stdout:
        if line.startswith("user="):  # the pattern's own start: other lines are left as they are
            line = _ATIME.sub(r"\1*\2", line)
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


# Commands asked once per file or per unit, recognised by their exact text (rebuilt here for the
# name and compared whole) and answered for all their names at once: a host's deploys ask about
# 70 file facts and 10 unit states, each a shell and two or three processes on the host.
# tests/unit/test_fingerprint.py checks the texts against pyinfra's and the roles' own facts,
# and tests/integration/test_drift_fast.py checks on lab hosts that each batched answer is what
# the commands print one by one.
_STAT = "user=%U group=%G mode=%A atime=%X mtime=%Y ctime=%Z size=%s %N"
_BSD_STAT = "user=%Su group=%Sg mode=%Sp atime=%a mtime=%m ctime=%c size=%z %N%SY"
_NOCMD = "##PYINFRA_NOCMD##"
UNIT_PROPERTIES = "--property=LoadState,ActiveState,UnitFileState"


def _sh(inner: str) -> str:
    return "sh -c " + shlex.quote(inner)


def file_fact_text(path: str) -> str:
    """pyinfra's File/Link/Directory fact (pyinfra/facts/files.py) for `path`, as sent."""
    return _sh(
        f"! (test -e {path} || test -L {path} ) || ( stat -c '{_STAT}' {path} 2> /dev/null || "
        f"stat -f '{_BSD_STAT}' {path} || ls -ld {path} )"
    )


def sha1_fact_text(path: str) -> str:
    """pyinfra's Sha1File fact for `path`, as sent."""
    return _sh(
        f"test -e {path} && ( sha1sum {path} 2> /dev/null || shasum {path} 2> /dev/null || "
        f"sha1 {path} 2> /dev/null ) || true"
    )


def unit_state_text(unit: str) -> str:
    """toolkit.facts.UnitState for `unit`, as sent."""
    return _sh(f"systemctl show {UNIT_PROPERTIES} {unit} 2>/dev/null || true")


def systemd_status_text(unit: str) -> str:
    """pyinfra's SystemdStatus fact (pyinfra/facts/systemd.py) for one unit, as sent."""
    return _sh(
        "if command -v systemctl >/dev/null 2>&1; then ( systemctl show --all --property Id "
        f"--property SubState {unit} ); else echo '{_NOCMD}'; fi"
    )


def _existing_then(kind: str, tool: str) -> Callable[[dict[str, list[str]]], str]:
    """A line per path, y or n (whether it exists: shell builtins), then `tool` on those that
    do, as the single commands run it on each (one line of output per path)."""

    def script(names: dict[str, list[str]]) -> str:
        return (
            f"set --\nfor p in {' '.join(names[kind])}; do "
            'if [ -e "$p" ] || [ -L "$p" ]; then echo y; set -- "$@" "$p"; else echo n; fi; '
            f'done\n[ $# -eq 0 ] || {tool} -- "$@" </dev/null 2>/dev/null\n'
        )

    return script


def _split_existing(kind: str) -> Callable[[list[str], dict[str, list[str]]], _Answers | None]:
    def split(lines: list[str], names: dict[str, list[str]]) -> _Answers | None:
        paths = names[kind]
        flags, found = lines[: len(paths)], iter(lines[len(paths) :])
        if len(flags) != len(paths) or flags.count("y") != len(lines) - len(paths):
            return None  # a path appeared or vanished, or the tool could not read one
        return {kind: [[next(found)] if flag == "y" else [] for flag in flags]}

    return split


def _split_blocks(lines: list[str], units: list[str]) -> list[list[str]] | None:
    """`systemctl show` of several units: each unit's lines, a blank line between units."""
    blocks: list[list[str]] = [[]]
    for line in lines:
        if line == "":
            blocks.append([])
        else:
            blocks[-1].append(line)
    return blocks if len(blocks) == len(units) and all(blocks) else None


# The properties both systemd facts ask for, in one `systemctl show` of every unit either asks
# about: systemctl prints a unit's properties in its own order whatever the order asked, and an
# explicitly asked property even when empty (a block then filtered to one fact's properties is
# what that fact's own command prints; the lab test compares them on real hosts). A unit is
# asked once: systemctl names a unit given without a type suffix as its .service ("docker" is
# "docker.service", as pyinfra's service operations name it).
_UNIT_KEYS = ("LoadState", "ActiveState", "UnitFileState")
_STATUS_KEYS = ("Id", "SubState")


def _systemctl_name(unit: str) -> str:
    return unit if "." in unit else f"{unit}.service"


def _asked_units(names: dict[str, list[str]]) -> list[str]:
    return list(dict.fromkeys(map(_systemctl_name, [*names["unit"], *names["status"]])))


def _systemd_script(names: dict[str, list[str]]) -> str:
    asked = ",".join(dict.fromkeys([*_STATUS_KEYS, *_UNIT_KEYS]))
    return (
        "command -v systemctl >/dev/null 2>&1 && "
        f"systemctl show --all --property={asked} {' '.join(_asked_units(names))} "
        "</dev/null 2>/dev/null\n"
    )


def _split_systemd(lines: list[str], names: dict[str, list[str]]) -> _Answers | None:
    asked = _asked_units(names)
    blocks = _split_blocks(lines, asked)
    if blocks is None:
        return None
    block = dict(zip(asked, blocks, strict=True))

    def only(unit: str, keys: tuple[str, ...]) -> list[str]:
        return [line for line in block[_systemctl_name(unit)] if line.split("=", 1)[0] in keys]

    return {
        "unit": [only(unit, _UNIT_KEYS) for unit in names["unit"]],
        "status": [only(unit, _STATUS_KEYS) for unit in names["status"]],
    }


_Answers = dict[str, list[list[str]]]  # group -> each of its names' stdout, in order


@dataclass(frozen=True)
class _Group:
    text: Callable[[str], str]  # the single command's text for one name
    name: re.Pattern  # where the name is in that text


@dataclass(frozen=True)
class _Section:
    """The part of the probe answering one or more groups for all their names at once."""

    groups: tuple[str, ...]
    script: Callable[[dict[str, list[str]]], str]  # names by group -> shell
    split: Callable[[list[str], dict[str, list[str]]], _Answers | None]


_PATH = r"(/[A-Za-z0-9_./%+@:=,-]+)"
_UNIT = r"([A-Za-z0-9@_.:-]+)"
_GROUPS = {
    "stat": _Group(file_fact_text, re.compile(rf"sh -c '! \(test -e {_PATH} ")),
    "sha1": _Group(sha1_fact_text, re.compile(rf"sh -c 'test -e {_PATH} && \( sha1sum ")),
    "unit": _Group(
        unit_state_text, re.compile(rf"sh -c 'systemctl show {UNIT_PROPERTIES} {_UNIT} ")
    ),
    "status": _Group(
        systemd_status_text,
        re.compile(rf"sh -c 'if command -v systemctl .* --property SubState {_UNIT} \)"),
    ),
}
_SECTIONS = {
    "stat": _Section(
        ("stat",), _existing_then("stat", f"stat -c '{_STAT}'"), _split_existing("stat")
    ),
    "sha1": _Section(("sha1",), _existing_then("sha1", "sha1sum"), _split_existing("sha1")),
    "systemd": _Section(("unit", "status"), _systemd_script, _split_systemd),
}


def grouped(command: str) -> tuple[str, str] | None:
    """(group, name) when `command` is exactly one group's text for that name."""
    for kind, group in _GROUPS.items():
        found = group.name.match(command)
        if found is not None and group.text(found.group(1)) == command:
            return kind, found.group(1)
    return None


def unwrapped(command: str) -> str | None:
    """The script of a command sent as `sh -c '<script>'` (what pyinfra sends without sudo or
    env), exactly: the probe, itself a `sh` with no arguments, runs it in a subshell, which is
    what `sh -c` does in a new process (the same $0, no positional parameters, nothing kept
    after it), without the cost of starting `sh` again for each command on the host."""
    if not command.startswith("sh -c "):
        return None
    # The one text shlex.quote could have made `command` from; it stands only when quoting
    # it again gives `command` back (shlex.quote is one-to-one), as shlex.split would find.
    quoted = command[len("sh -c ") :]
    if len(quoted) >= 2 and quoted[0] == quoted[-1] == "'":
        quoted = quoted[1:-1].replace("'\"'\"'", "'")
    return quoted if _sh(quoted) == command else None


def probe_script(commands: Iterable[str], marker: str, batched: bool = True) -> str:
    """One shell script for one host. Each command runs as the SSH channel would run it (its
    own `sh -c` text, no input), followed by a line with the marker, its index and its exit
    code; the commands of a group (see `grouped`) are answered together, their section
    ending with a line with the marker and the section's name, and the others run `unwrapped`
    (each exactly as sent, in its own `sh -c`, when not `batched`: what the batched answers
    are checked against)."""
    members: dict[str, list[str]] = {kind: [] for kind in _GROUPS}
    parts = []
    for index, command in enumerate(commands):
        found = grouped(command) if batched else None
        if found is not None:
            members[found[0]].append(found[1])
            continue
        body = (unwrapped(command) if batched else None) or command
        parts.append(f"( {body}\n) </dev/null 2>/dev/null\nprintf '\\n{marker} {index} %d\\n' $?\n")
    for name, section in _SECTIONS.items():
        if any(members[group] for group in section.groups):
            parts.append(section.script(members) + f"printf '\\n{marker} {name} 0\\n'\n")
    return "".join(parts)


def read_probe(
    output: bytes, marker: str, commands: Iterable[str] = ()
) -> dict[int, tuple[int, list[str]]]:
    """index -> (exit code, stdout lines), lines split as pyinfra's connector splits them. A
    grouped command gets what its own text would have printed (exit 0: each group's single
    commands end in `|| true` or cannot fail); a group whose answer does not add up answers
    none of its commands, which sends the host to the exact check."""
    sections: dict[str, tuple[int, list[str]]] = {}
    section: list[str] = []
    for raw in output.split(b"\n"):
        line = raw.decode("utf-8", errors="replace")
        if not line.startswith(marker + " "):
            section.append(line)
            continue
        _, name, code = line.split(" ")
        if section and section[-1] == "":  # the newline printed before the marker
            section.pop()
        sections[name] = (int(code), section)
        section = []
    answers = {int(name): answer for name, answer in sections.items() if name.isdigit()}
    members: dict[str, list[tuple[int, str]]] = {kind: [] for kind in _GROUPS}
    for index, command in enumerate(commands):
        found = grouped(command)
        if found is not None:
            members[found[0]].append((index, found[1]))
    names = {kind: [name for _, name in wanted] for kind, wanted in members.items()}
    for name, section in _SECTIONS.items():
        if name not in sections:
            continue
        split = section.split(sections[name][1], names)
        if split is None:
            continue
        for group in section.groups:
            for (index, _), stdout in zip(members[group], split[group], strict=True):
                answers[index] = (0, stdout)
    return answers


def differences(record: Record, answers: dict[int, tuple[int, list[str]]]) -> list[str]:
    """The recorded commands whose replay failed or printed something else (empty: none)."""
    found = []
    for index, (_, codes, digest) in enumerate(record.commands):
        answer = answers.get(index)
        if answer is None:
            found.append(f"no answer to command {index}")
        elif answer[0] not in codes:
            found.append(f"command {index} exited {answer[0]}")
        elif output_digest(answer[1]) != digest:
            found.append(f"command {index} printed something else")
    return found


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
    ssh = SSHSettings.from_cluster(loaded)
    hosts = {}
    for name, host in loaded.cluster.hosts.items():
        record = load_record(loaded.state_dir, name)
        if record is not None and record.roles == host_roles(host.groups):
            hosts[name] = probe_argv(ssh, str(host.address))
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
    ssh = SSHSettings.from_cluster(loaded)
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
        "roles": {name: list(host_roles(loaded.cluster.hosts[name].groups)) for name in hosts},
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


# -- the fast check --------------------------------------------------------------------------


@dataclass
class FastCheck:
    reports: dict[str, HostReport] = field(default_factory=dict)  # answered in one round trip
    exact: dict[str, str] = field(default_factory=dict)  # host -> why it needs the exact check
    seconds: float = 0.0
    early: int = 0  # hosts whose probe the command line had sent (send_early)
    alone: bool = False  # answered without loading the inventory (settled)
    started: float = 0.0  # time.monotonic() when the first probe left


# OpenSSH clients at once when --parallel does not say: each is a process of its own (about
# 6 MiB and a few descriptors), unlike pyinfra's connections inside one process.
DEFAULT_PARALLEL = 200
KEEPALIVE_S = 5
# A host whose commands have not all answered by then is left to the exact check.
PROBE_TIMEOUT_S = 120
Answer = tuple[int, bytes, bytes, float]  # exit code (-1: none), stdout, stderr, seconds


def probe_argv(ssh: SSHSettings, address: str) -> list[str]:
    """The ssh command line of one host's probe; the script goes on stdin (one argument of a
    remote command is limited to 128 KiB). A silent peer is dropped as the exact check drops
    one (engine/runner.py DEAD_PEER_S)."""
    argv = [*ssh.argv(address), "sh", "-s"]
    argv[1:1] = ["-o", f"ServerAliveInterval={KEEPALIVE_S}", "-o", "ServerAliveCountMax=6"]
    return argv


@dataclass(eq=False)  # each one is itself: found in the queue by identity
class _Sent:
    argv: list[str]
    commands: list[str]
    script: bytes
    began: float = 0.0
    process: subprocess.Popen | None = None
    answer: Answer | None = None
    done: threading.Event = field(default_factory=threading.Event)
    dropped: bool = False


class Asking:
    """Probes on their way, at most `parallel` at once. The caller's thread starts each ssh
    (`send`), so that no host waits for a thread to be scheduled before its connection begins;
    `go` then gives each a thread that writes its script and reads its answer, and that starts
    a waiting host's ssh when its own is done."""

    def __init__(self, marker: str, parallel: int):
        self.marker = marker
        self.started = time.monotonic()
        self.sent: dict[str, _Sent] = {}
        self._free = max(1, parallel)
        self._waiting: deque[_Sent] = deque()
        self._unattended: list[_Sent] = []
        self._lock = threading.Lock()
        self._cancelled = False

    def send(self, name: str, argv: list[str], commands: list[str]) -> None:
        """Ask `name` over `argv` for the outputs of `commands` (probe_script)."""
        script = probe_script(commands, self.marker).encode()
        sent = self.sent[name] = _Sent(argv, commands, script)
        with self._lock:
            if not self._free:
                self._waiting.append(sent)
                return
            self._free -= 1
        self._start(sent)
        self._unattended.append(sent)

    def go(self) -> None:
        for sent in self._unattended:
            threading.Thread(target=self._talk, args=(sent,), daemon=True).start()
        self._unattended.clear()

    def take(self, name: str, argv: list[str], commands: list[str]) -> bool:
        """Whether `name`'s probe was sent with exactly this command line and these commands
        (so with the same script: probe_script is a function of them and the marker); one sent
        otherwise is stopped."""
        sent = self.sent.get(name)
        if sent is not None and (sent.argv, sent.commands) == (argv, commands):
            return True
        self.drop(name)
        return False

    def drop(self, name: str) -> None:
        """Stop asking `name` (its answer is not needed): never started if it still waits."""
        sent = self.sent.pop(name, None)
        if sent is None:
            return
        with self._lock:
            sent.dropped = True
            if sent in self._waiting:
                self._waiting.remove(sent)
                sent.answer = (-1, b"", b"not asked", 0.0)
                sent.done.set()
                return
        if sent.process is not None and sent.process.poll() is None:
            sent.process.kill()

    def answer(self, name: str) -> Answer:
        sent = self.sent[name]
        sent.done.wait()
        assert sent.answer is not None
        return sent.answer

    def cancel(self) -> None:
        """Stop every probe (the caller cannot go on, or the process exits)."""
        with self._lock:
            self._cancelled = True
            waiting, self._waiting = self._waiting, deque()
        for sent in waiting:
            sent.answer = (-1, b"", b"cancelled", 0.0)
            sent.done.set()
        for name in list(self.sent):
            self.drop(name)

    def _start(self, sent: _Sent) -> None:
        sent.began = time.monotonic()
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        try:
            sent.process = subprocess.Popen(sent.argv, **pipes)
        except OSError as error:  # no ssh client: the exact check says why it cannot connect
            sent.answer = (-1, b"", str(error).encode(), 0.0)
            sent.done.set()
            return
        if sent.dropped:  # dropped while a finished talker was starting it
            sent.process.kill()

    def _talk(self, sent: _Sent | None) -> None:
        while sent is not None:
            if sent.process is not None:
                sent.answer = self._exchange(sent)
                sent.done.set()
            with self._lock:
                sent = self._waiting.popleft() if self._waiting and not self._cancelled else None
                if sent is None:
                    self._free += 1
            if sent is not None:
                self._start(sent)

    @staticmethod
    def _exchange(sent: _Sent) -> Answer:
        process = sent.process
        assert process is not None
        with process:
            try:
                output, errors = process.communicate(sent.script, timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                output, errors = b"", b"no answer in %d s" % PROBE_TIMEOUT_S
                return -1, output, errors, time.monotonic() - sent.began
        return process.returncode, output, errors, time.monotonic() - sent.began


def new_marker() -> str:
    return f"gpuinfra-fingerprint-{secrets.token_hex(8)}"


class Probes:
    """Every selected host with a record asked at once, one ssh each (`parallel` at a time),
    started before the caller has finished its own checks; `finish` computes the keys while
    the hosts answer, then compares. With `early` (send_early), a host's probe already on its
    way is kept when it is exactly the one this would send."""

    def __init__(
        self,
        loaded: LoadedCluster,
        hosts: list[str],
        roles: Iterable[str],
        connect_timeout: int,
        parallel: int | None = None,
        early: Asking | None = None,
    ):
        self.result = FastCheck()
        self.records: dict[str, Record] = {}
        ssh = SSHSettings.from_cluster(loaded, connect_timeout)
        wanted = tuple(roles)
        for name in hosts:
            record = load_record(loaded.state_dir, name)
            if record is None:
                self.result.exact[name] = "no converged record"
            elif host_roles(loaded.cluster.hosts[name].groups, wanted) != record.roles:
                self.result.exact[name] = "other roles than its record"
            else:
                self.records[name] = record
        if early is not None and parallel is None:  # sent DEFAULT_PARALLEL at a time too
            self.asking = early
        else:
            if early is not None:
                early.cancel()
            workers = min(len(self.records), parallel or DEFAULT_PARALLEL)
            self.asking = Asking(new_marker(), workers)
        for name in set(self.asking.sent) - set(self.records):
            self.asking.drop(name)
        for name, record in self.records.items():
            argv = probe_argv(ssh, str(loaded.cluster.hosts[name].address))
            commands = [command for command, _, _ in record.commands]
            if self.asking is early and early.take(name, argv, commands):
                self.result.early += 1
            else:
                self.asking.send(name, argv, commands)
        self.asking.go()

    def cancel(self) -> None:
        """Stop asking (the caller found the command cannot go on)."""
        self.asking.cancel()

    def finish(self, loaded: LoadedCluster) -> FastCheck:
        """The keys (from the inputs while the clock cannot change the files; else the files
        rendered from `loaded`, which must not create state), then each host's answers against
        its record."""
        result = self.result
        common = common_digest(loaded)
        rendered = [n for n, r in self.records.items() if not inputs_stand(r, common, n)]
        if rendered:
            from engine.context import host_contexts

            contexts = {ctx.name: ctx for ctx in host_contexts(loaded)}  # cluster files once
            for name in rendered:
                if host_key(contexts[name], common) != self.records[name].key:
                    # Checked exactly, whatever it answers.
                    result.exact[name] = "code, inventory or state changed since its record"
                    del self.records[name]
                    self.asking.drop(name)
        answers = {name: self.asking.answer(name) for name in self.records}
        for name, record in self.records.items():
            matched = _matched(name, record, answers[name], self.asking.marker)
            if isinstance(matched, str):
                result.exact[name] = matched
            else:
                result.reports[name] = matched
        result.started = self.asking.started
        result.seconds = time.monotonic() - result.started
        return result


def _matched(name: str, record: Record, answer: Answer, marker: str) -> HostReport | str:
    """The host's recorded report when its answer matches its record, else why not."""
    code, output, errors, seconds = answer
    if code in (255, -1):  # ssh failed, or no answer in time: the exact check says why
        return f"ssh: {errors.decode(errors='replace').strip() or 'failed'}"
    commands = [command for command, _, _ in record.commands]
    found = differences(record, read_probe(output, marker, commands))
    if found:
        return f"differs from its record ({found[0]})"
    return HostReport(
        name,
        HostStatus.ok,
        operations=[OperationResult(role, op, False) for role, op in record.operations],
        seconds=seconds,
        reboot_required=record.reboot_required,
        notes=list(record.notes),
    )


def summary(result: FastCheck, total: int) -> str:
    why: dict[str, int] = {}
    for reason in result.exact.values():
        short = reason.split(" (", 1)[0]
        why[short] = why.get(short, 0) + 1
    text = (
        f"{len(result.reports)} of {total} hosts matched their converged record "
        f"(one round trip each, {result.seconds:.1f} s)"
    )
    if result.alone:
        text = text[:-1] + "; the inventory unchanged since the last apply: not loaded again)"
    elif result.early:
        text = text[:-1] + f"; {result.early} sent before the inventory was loaded)"
    if why:
        text += "; checked operation by operation: " + ", ".join(
            f"{count} {reason}" for reason, count in sorted(why.items())
        )
    return text
