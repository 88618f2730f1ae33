"""Rate limits for work that loads a shared service: at most N hosts start per interval.

Joining hundreds of nodes at once overloaded the API servers of the reference design; spacing
joins by a few seconds helped, and slowing down further when the API answers 429 or 5xx keeps a
struggling control plane from being pushed over. The engine paces `apply --rate` steps with a
`Pacer`; a role paces one operation (the kubernetes role's node joins) with `shared_pacer`,
acquiring a slot inside the operation itself, so hosts that have nothing to do never wait.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from toolkit.clock import wall_seconds

# The shared pacer the kubernetes role's worker joins draw from (roles/kubernetes/operations.py);
# a rollout shard installs its SlotPacer under this name (engine/rolloutshard.py).
JOIN_PACER = "kubernetes-join"

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)\s*(s|m)?\s*$")


class RateInvalid(ValueError):
    """A rate that is not N/INTERVAL ("5/30s", "10/1m", "2/10")."""


@dataclass(frozen=True)
class Rate:
    hosts: int  # at most this many starts ...
    seconds: float  # ... within any window of this length

    @classmethod
    def parse(cls, text: str) -> Rate:
        match = _RATE.match(text)
        if not match:
            raise RateInvalid(f"invalid rate {text!r}: use N/INTERVAL, e.g. 5/30s or 10/1m")
        hosts, interval, unit = int(match[1]), float(match[2]), match[3] or "s"
        seconds = interval * 60 if unit == "m" else interval
        if hosts < 1 or seconds <= 0:
            raise RateInvalid(f"invalid rate {text!r}: N and INTERVAL must be positive")
        return cls(hosts, seconds)

    def __str__(self) -> str:
        return f"{self.hosts}/{self.seconds:g}s"


class Pacer:
    """A sliding window of start times: `acquire` returns once fewer than `rate.hosts` starts
    happened in the last `rate.seconds` (times the current slow-down factor)."""

    MAX_SLOWDOWN = 8.0  # past this, a failing API is an incident for a person, not a retry loop

    def __init__(
        self,
        rate: Rate,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ):
        self.rate = rate
        self.slowdown = 1.0
        self._clock = clock
        self._sleep = sleep
        self._starts: deque[float] = deque()
        self._lock = threading.Lock()  # gevent's monkey patching makes this a greenlet lock

    @property
    def window(self) -> float:
        return self.rate.seconds * self.slowdown

    def acquire(self) -> float:
        """Wait for a slot; returns the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                now = self._clock()
                while self._starts and now - self._starts[0] >= self.window:
                    self._starts.popleft()
                if len(self._starts) < self.rate.hosts:
                    self._starts.append(now)
                    return waited
                delay = self.window - (now - self._starts[0])
            # time.sleep looked up now, not when this module was imported: the command line
            # patches it for gevent only once it knows it connects, and a blocking sleep would
            # freeze every host's greenlet, the ones that already have their slot too.
            (self._sleep or time.sleep)(delay)
            waited += delay

    def slow_down(self) -> None:
        """The shared service pushed back (HTTP 429 or 5xx): widen the window, up to a cap."""
        self.slowdown = min(self.slowdown * 2, self.MAX_SLOWDOWN)

    def recover(self) -> None:
        """A healthy answer: step back towards the configured rate."""
        self.slowdown = max(1.0, self.slowdown / 2)


_shared: dict[str, Pacer] = {}


def shared_pacer(name: str, rate: Rate) -> Pacer | SlotPacer:
    """One pacer per name for the whole run: every host's operation draws from it (the one
    `install_pacer` put there, in a rollout shard)."""
    if name in _installed:
        return _installed[name]
    pacer = _shared.get(name)
    if pacer is None or pacer.rate != rate:
        pacer = _shared[name] = Pacer(rate)
    return pacer


def reset_shared() -> None:
    """Forget every shared pacer (the engine calls this when a run starts)."""
    _shared.clear()


class SlotPacer:
    """A join rate shared by `count` shards that never talk to each other: time is cut into
    slots (wall clock: chrony runs on every node), and shard `index` starts a join only at the
    beginning of a slot where `floor(t / slot) % count == index`, at most one per slot.
    Fleet-wide that is at most one start per slot, so no window of `rate.seconds` holds more
    than `rate.hosts` starts, however many shards there are; a static share
    `Rate(hosts, seconds * count)` per shard cannot promise that (docs/design/fleet-jobs.md
    section 5).

    A start may come up to `late` seconds after its slot's beginning (a woken process's
    oversleep); a later one waits for the shard's next slot. Slots are `(rate.seconds + late) /
    rate.hosts` long, not `rate.seconds / rate.hosts`: two starts `rate.hosts` slots apart are
    then at least `rate.seconds` apart whatever their lateness, so the bound is exact (0.5 %
    slower at 5/10s).

    `slow_down` (the API answered 429 or 5xx) skips the shard's next 2^k slots, k counting the
    push-backs since the last healthy answer; `recover` resets k. Same interface as `Pacer`,
    so the kubernetes role's join draws from either."""

    LATE_S = 0.05  # a sleep's oversleep on a busy node; later starts wait for the next slot
    MAX_BACKOFF = 6  # 2^6 = 64 of the shard's slots: past that, a person looks at the API

    def __init__(
        self,
        rate: Rate,
        index: int,
        count: int,
        clock: Callable[[], float] = wall_seconds,
        sleep: Callable[[float], None] | None = None,
        late: float = LATE_S,
    ):
        if not 0 <= index < count:
            raise ValueError(f"shard {index} of {count}: the index must be below the count")
        self.rate = rate
        self.index = index
        self.count = count
        self.late = late
        self.slot = (rate.seconds + late) / rate.hosts
        self.backoff = 0  # k: push-backs since the last healthy answer
        self._clock = clock
        self._sleep = sleep
        self._last: int | None = None  # the slot of this shard's last start
        self._not_before: int | None = None  # the first slot a backoff allows
        self._lock = threading.Lock()

    def next_slot(self, now: float) -> int:
        """The first slot this shard may start in at or after `now` (maybe the current one)."""
        number = math.floor(now / self.slot)
        if now - number * self.slot > self.late:
            number += 1  # too far into this slot to start in it
        if self._last is not None:
            number = max(number, self._last + 1)
        if self._not_before is not None:
            number = max(number, self._not_before)
        return number + (self.index - number) % self.count

    def acquire(self) -> float:
        """Wait for this shard's next free slot; returns the seconds waited."""
        waited = 0.0
        with self._lock:
            while True:
                now = self._clock()
                number = self.next_slot(now)
                start = number * self.slot
                if start <= now + 1e-9:  # reached (a float sum may land an ulp short)
                    self._last = number
                    return waited
                (self._sleep or time.sleep)(start - now)
                waited += start - now

    def slow_down(self) -> None:
        """A 429 or 5xx: skip this shard's next 2^k slots."""
        self.backoff = min(self.backoff + 1, self.MAX_BACKOFF)
        after = self._last if self._last is not None else math.floor(self._clock() / self.slot)
        self._not_before = after + 1 + self.count * 2**self.backoff

    def recover(self) -> None:
        self.backoff = 0


_installed: dict[str, Pacer | SlotPacer] = {}


def install_pacer(name: str, pacer: Pacer | SlotPacer | None) -> None:
    """Make `shared_pacer(name, ...)` return `pacer` whatever rate it is asked for (a rollout
    shard's SlotPacer for the joins), until installed again with None. Survives reset_shared."""
    if pacer is None:
        _installed.pop(name, None)
    else:
        _installed[name] = pacer
