"""The shell text that lists units' drop-in files and says whether each is gpuinfra's, shared by
the UnitDropIns fact (toolkit/effective.py) and the drift probe, which answers every such fact
of a host with one `systemctl show` (engine/fingerprint/probe.py). No pyinfra here: the probe's
imports stay light."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

# The first lines of every file gpuinfra writes into a folder that others write to as well
# (a unit's drop-ins, apt's sources and preferences) carry this: tests/unit/test_effective.py
# checks it on every such file of the sample inventory. It tells a reader, not the checks:
# they judge a file by its path (toolkit/effective.py `ours_or_declared`), as a foreign file
# may copy it.
MARKER = "Managed by gpuinfra"
# The properties the filter renames (`Id=X` becomes `unit X`) and the words it classifies each
# drop-in with: the probe maps an answer back to the properties with these.
RENAMED = {"Id": "unit", "LoadState": "load"}
CLASSES = ("ours", "other")


def unit_name(unit: str) -> str:
    """A unit's full name, as systemctl names one given without its type: "docker" is
    "docker.service" (journalctl's and systemctl's field matches take the full name)."""
    return unit if "." in unit else f"{unit}.service"


def dropins_filter(others: bool = False) -> str:
    """An awk reading `systemctl show` lines: `Id=` and `LoadState=` become `unit ID` and
    `load STATE`, a `DropInPaths=` line becomes `ours PATH` or `other PATH` for each drop-in
    (whether the marker is in its first three lines); with `others`, every other line (other
    properties, the blank line between units) is printed as it is, else dropped. One process,
    where a shell loop started two for each drop-in."""
    renames = "".join(
        f'index($0, "{key}=") == 1 {{ print "{word} " substr($0, {len(key) + 2}); next }} '
        for key, word in RENAMED.items()
    )
    ours, other = CLASSES
    program = (
        renames + 'index($0, "DropInPaths=") == 1 { n = split(substr($0, 13), paths, " "); '
        "for (i = 1; i <= n; i++) { ours = 0; "
        "for (k = 0; k < 3 && (getline line < paths[i]) > 0; k++) if (index(line, m)) ours = 1; "
        f'close(paths[i]); print (ours ? "{ours} " : "{other} ") paths[i] }} next }} '
        + ("{ print }" if others else "")
    )
    return f"awk -v m={shlex.quote(MARKER)} {shlex.quote(program.strip())}"


def dropins_command(units: Iterable[str]) -> str:
    """For each unit (in the order given): `unit ID`, `load STATE`, then `ours PATH` or
    `other PATH` for each drop-in systemd loaded."""
    quoted = " ".join(shlex.quote(unit) for unit in units)
    return (
        f"systemctl show --property=Id,LoadState,DropInPaths {quoted} 2>/dev/null | "
        f"{dropins_filter()}"
    )
