"""The shell text that lists units' drop-in files and says whether each is gpuinfra's, shared by
the UnitDropIns fact (toolkit/effective.py) and the drift probe, which answers every such fact
of a host with one `systemctl show` (engine/fingerprint/probe.py). No pyinfra here: the probe's
imports stay light."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

# The first lines of every file gpuinfra writes into a folder that others write to as well
# (a unit's drop-ins, apt's sources and preferences) carry this: tests/unit/test_effective.py
# checks it on every such file of the sample inventory.
MARKER = "Managed by gpuinfra"
# Printed by `systemctl show` for each unit asked, whatever else it prints: where a unit's
# lines begin in the answer for several units.
UNIT_LINE = "unit "


def dropins_filter(others: bool = False) -> str:
    """An awk reading `systemctl show` lines: `Id=` and `LoadState=` become `unit ID` and
    `load STATE`, a `DropInPaths=` line becomes `ours PATH` or `other PATH` for each drop-in
    (whether the marker is in its first three lines); with `others`, every other line (other
    properties, the blank line between units) is printed as it is, else dropped. One process,
    where a shell loop started two for each drop-in."""
    rest = "{ print }" if others else ""
    program = (
        'index($0, "Id=") == 1 { print "unit " substr($0, 4); next } '
        'index($0, "LoadState=") == 1 { print "load " substr($0, 11); next } '
        'index($0, "DropInPaths=") == 1 { n = split(substr($0, 13), paths, " "); '
        "for (i = 1; i <= n; i++) { ours = 0; "
        "for (k = 0; k < 3 && (getline line < paths[i]) > 0; k++) if (index(line, m)) ours = 1; "
        'close(paths[i]); print (ours ? "ours " : "other ") paths[i] } next } ' + rest
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
