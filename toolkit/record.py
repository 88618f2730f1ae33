"""What roles tell the run while it prepares and executes, kept by the runner (never stored on
pyinfra's objects): the managed file behind each operation (for diffs), notes on why
operations did nothing, check results (the etcd disk gate), and values one role shares
between its hosts for one run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from toolkit.spec import ManagedFile


@dataclass
class HostRecord:
    files: dict[str, ManagedFile] = field(default_factory=dict)  # operation hash -> file
    notes: dict[str, None] = field(default_factory=dict)  # ordered, each note once
    checks: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # a deploy that raised while preparing
    prepare_seconds: float = 0.0
    # operation hash -> the name this host's deploy gave it (pyinfra keeps one set of names per
    # hash for all hosts, and hosts whose phases differ share hashes for other operations)
    op_names: dict[str, str] = field(default_factory=dict)
    # operation hash -> what an effective-state check found (toolkit/effective.py), shown as
    # the operation's text where a file's change shows its diff
    details: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)  # left by identity (`recording`): two empty records are otherwise equal
class RunRecord:
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)  # one role's cross-host values

    def host(self, name: str) -> HostRecord:
        return self.hosts.setdefault(name, HostRecord())


_active: list[RunRecord] = []


@contextlib.contextmanager
def recording() -> Iterator[RunRecord]:
    """The record every role writes to while the block runs (the runner opens one per batch)."""
    record = RunRecord()
    _active.append(record)
    try:
        yield record
    finally:
        _active.remove(record)


def current() -> RunRecord:
    """The run's record; outside a run (a unit test driving one operation) a throwaway one."""
    if not _active:
        _active.append(RunRecord())
    return _active[-1]


def host(name: str) -> HostRecord:
    return current().host(name)
