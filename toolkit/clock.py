"""The wall clock as rendering reads it, and until when what it read stays true.

A host's rendered files are a function of the code, the inventory, the controller's `.state/`
and, in two places, of the clock: a zone's serial when its records changed (the date) and a
certificate kept until it is within its renewal window (now + the window). Each such reading
goes through here, so that whoever watches a rendering learns the moment before which the clock
cannot change its result. The drift fast path (engine/fingerprint/) keys a converged host on
those inputs alone until that moment, and renders its files again after it.
tests/unit/test_fingerprint.py keeps the modules that render from reading the clock elsewhere.

Standard library only.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(eq=False)  # removed from the watchers by identity: nested watches may be equal
class Horizon:
    """The earliest moment (epoch seconds) a clock reading seen while watching could read
    differently; None while the clock was not read."""

    until: float | None = None

    def limit(self, moment: float) -> None:
        self.until = moment if self.until is None else min(self.until, moment)


_watching: list[Horizon] = []


@contextmanager
def watching() -> Iterator[Horizon]:
    """Collect the horizon of every clock reading made inside (nested watches each see it)."""
    horizon = Horizon()
    _watching.append(horizon)
    try:
        yield horizon
    finally:
        _watching.remove(horizon)


def _limit(moment: float) -> None:
    for horizon in _watching:
        horizon.limit(moment)


def today() -> dt.date:
    """The local date; what is decided from it holds until the next local midnight."""
    day = dt.date.today()
    _limit(dt.datetime.combine(day + dt.timedelta(days=1), dt.time.min).timestamp())
    return day


def now_utc() -> dt.datetime:
    """Now, for a decision that also calls `holds_until` with the moment it would flip."""
    return dt.datetime.now(dt.UTC)


def holds_until(moment: dt.datetime) -> None:
    """A decision taken from `now_utc()` stays the same until `moment` (timezone-aware)."""
    _limit(moment.timestamp())


def expired(until: float | None) -> bool:
    return until is not None and time.time() >= until


def wall_seconds() -> float:
    """Epoch seconds for what shards on several hosts pace together by (the rollout Job's join
    slots, toolkit/pacing.py SlotPacer; chrony keeps the nodes' clocks together). Not an input
    of any rendering, so it sets no horizon."""
    return time.time()
