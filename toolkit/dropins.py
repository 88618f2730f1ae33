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


def dropins_command(units: Iterable[str]) -> str:
    """For each unit (in the order given): `unit ID`, `load STATE`, then `ours PATH` or
    `other PATH` for each drop-in systemd loaded."""
    quoted = " ".join(shlex.quote(unit) for unit in units)
    return (
        f"systemctl show --property=Id,LoadState,DropInPaths {quoted} 2>/dev/null | "
        "while IFS='=' read -r key value; do case $key in "
        f'Id) echo "{UNIT_LINE}$value";; LoadState) echo "load $value";; '
        "DropInPaths) for path in $value; do "
        f'if head -n 3 "$path" 2>/dev/null | grep -q {shlex.quote(MARKER)}; '
        'then echo "ours $path"; else echo "other $path"; fi; done;; esac; done'
    )
