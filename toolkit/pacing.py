"""Rate limits for work that loads a shared service: at most N hosts start per interval.

Joining hundreds of nodes at once overloaded the API servers of the reference design; spacing
joins by a few seconds helped, and slowing down further when the API answers 429 or 5xx keeps a
struggling control plane from being pushed over. The engine paces `apply --rate` steps with a
`Pacer`; a role paces one operation (the kubernetes role's node joins) with `shared_pacer`,
acquiring a slot inside the operation itself, so hosts that have nothing to do never wait.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

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


def shared_pacer(name: str, rate: Rate) -> Pacer:
    """One pacer per name for the whole run: every host's operation draws from it."""
    pacer = _shared.get(name)
    if pacer is None or pacer.rate != rate:
        pacer = _shared[name] = Pacer(rate)
    return pacer


def reset_shared() -> None:
    """Forget every shared pacer (the engine calls this when a run starts)."""
    _shared.clear()
