"""One round trip per host: the recorded commands batched into one `sh -s` script (file and unit
facts answered together, recognised by their exact text), its answer split again and compared."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engine.fingerprint.records import Record
from toolkit.driftprobe import lines_digest as output_digest
from toolkit.dropins import CLASSES, RENAMED, dropins_command, dropins_filter, unit_name

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


def dropins_fact_text(units: str) -> str:
    """toolkit.effective.UnitDropIns for `units` (space-separated, as the roles ask them), as
    sent."""
    return _sh(dropins_command(units.split(" ")))


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


# The properties the systemd facts ask for (a unit's state, its status, its drop-ins), in one
# `systemctl show` of every unit any of them asks about, its drop-ins classified on the way
# (toolkit.dropins.dropins_filter): systemctl prints a unit's properties in its own order
# whatever the order asked, and an explicitly asked property even when empty (a block then
# filtered to one fact's properties is what that fact's own command prints; the lab test
# compares them on real hosts). A unit is asked once: systemctl names a unit given without a
# type suffix as its .service ("docker" is "docker.service", as pyinfra's service operations
# name it); the drop-in facts name their units with the suffix.
_UNIT_KEYS = ("LoadState", "ActiveState", "UnitFileState")
_STATUS_KEYS = ("Id", "SubState")
_DROPIN_KINDS = (*RENAMED.values(), *CLASSES)
_PROPERTY_OF = {word: key for key, word in RENAMED.items()}


def _dropin_units(names: dict[str, list[str]]) -> list[str]:
    return [unit for units in names["dropins"] for unit in units.split(" ")]


def _asked_units(names: dict[str, list[str]]) -> list[str]:
    asked = [*names["unit"], *names["status"], *_dropin_units(names)]
    return list(dict.fromkeys(map(unit_name, asked)))


def _kept(names: dict[str, list[str]]) -> list[tuple[str, ...]]:
    """For each asked unit, in order, the lines some fact reads of it (properties by name, the
    drop-in filter's classes by word): what the split keeps of its block."""
    kept: dict[str, list[str]] = {unit: [] for unit in _asked_units(names)}
    for unit in names["unit"]:
        kept[unit_name(unit)] += _UNIT_KEYS
    for unit in names["status"]:
        kept[unit_name(unit)] += _STATUS_KEYS
    for unit in _dropin_units(names):
        kept[unit_name(unit)] += [*RENAMED, *CLASSES]
    return [tuple(dict.fromkeys(keys)) for keys in kept.values()]


def _keep_filter(kept: list[tuple[str, ...]]) -> str:
    """An awk after the drop-in filter: of each unit's block, only the lines some fact reads.
    systemctl prints every asked property of every unit, and a property no fact reads can move
    without any fact changing (a timer's SubState is `running` while its service runs): the
    whole answer's digest, which the drift Job's shards compare, would then differ for nothing."""
    words = " ".join(f"{word}={key}" for key, word in RENAMED.items())
    blocks = "".join(f'k[{i}] = " {" ".join(keys)} "; ' for i, keys in enumerate(kept))
    program = (
        f'BEGIN {{ b = 0; {blocks}n = split("{words}", r, " "); '
        'for (i = 1; i <= n; i++) { split(r[i], p, "="); alias[p[1]] = p[2] } } '
        '$0 == "" { b++; print; next } '
        '{ w = $0; sub(/[ =].*/, "", w); if (w in alias) w = alias[w]; '
        'if (index(k[b], " " w " ")) print }'
    )
    return f"awk {shlex.quote(program)}"


def _systemd_script(names: dict[str, list[str]]) -> str:
    keys = [*_STATUS_KEYS, *_UNIT_KEYS] if names["unit"] or names["status"] else []
    if names["dropins"]:
        keys += [*RENAMED, "DropInPaths"]
    asked = ",".join(dict.fromkeys(keys))
    return (
        "command -v systemctl >/dev/null 2>&1 && "
        f"systemctl show --all --property={asked} {' '.join(_asked_units(names))} "
        f"</dev/null 2>/dev/null | {dropins_filter(others=True)} | {_keep_filter(_kept(names))}\n"
    )


def _split_systemd(lines: list[str], names: dict[str, list[str]]) -> _Answers | None:
    asked = _asked_units(names)
    blocks = _split_blocks(lines, asked)
    if blocks is None:
        return None
    block = dict(zip(asked, blocks, strict=True))

    def only(unit: str, keys: tuple[str, ...]) -> list[str]:
        found = []
        for line in block[unit_name(unit)]:
            kind, _, value = line.partition(" ")
            if kind in _PROPERTY_OF:  # a property the filter renamed, named back
                line = f"{_PROPERTY_OF[kind]}={value}"
            if line.split("=", 1)[0] in keys:
                found.append(line)
        return found

    def dropins(units: str) -> list[str]:
        return [
            line
            for unit in units.split(" ")
            for line in block[unit]
            if line.partition(" ")[0] in _DROPIN_KINDS
        ]

    return {
        "unit": [only(unit, _UNIT_KEYS) for unit in names["unit"]],
        "status": [only(unit, _STATUS_KEYS) for unit in names["status"]],
        "dropins": [dropins(units) for units in names["dropins"]],
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
_UNITS = r"([A-Za-z0-9@_.:-]+(?: [A-Za-z0-9@_.:-]+)*)"
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
    "dropins": _Group(
        dropins_fact_text,
        re.compile(rf"sh -c 'systemctl show --property=Id,LoadState,DropInPaths {_UNITS} 2>"),
    ),
}
_SECTIONS = {
    "stat": _Section(
        ("stat",), _existing_then("stat", f"stat -c '{_STAT}'"), _split_existing("stat")
    ),
    "sha1": _Section(("sha1",), _existing_then("sha1", "sha1sum"), _split_existing("sha1")),
    "systemd": _Section(("unit", "status", "dropins"), _systemd_script, _split_systemd),
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
