"""A stand-in for pyinfra's current host, so an operation's decisions run against given facts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyinfra.context import ctx_host


class FakeHost:
    def __init__(self, facts: dict[type, Any], name: str = "fake-host"):
        self.name = name
        self.facts = facts
        self.noops: list[str] = []

    def get_fact(self, fact: type, **kwargs: Any) -> Any:
        return self.facts[fact]

    def noop(self, message: str) -> None:
        self.noops.append(message)


@contextmanager
def fake_host(facts: dict[type, Any]) -> Iterator[FakeHost]:
    host = FakeHost(facts)
    with ctx_host.use(host):
        yield host


class KeyedHost(FakeHost):
    """Facts keyed by their arguments, so a lookup of the wrong path (or with a wrong argument)
    fails instead of getting someone else's answer; `asked` lists every lookup."""

    def __init__(self, facts: dict[tuple, Any], name: str = "cp-1"):
        super().__init__(facts, name)  # type: ignore[arg-type]
        self.asked: list[tuple] = []

    def get_fact(self, fact: type, **kwargs: Any) -> Any:
        key = (fact, tuple(sorted(kwargs.items())))
        self.asked.append(key)
        return self.facts[key]


@contextmanager
def keyed_host(facts: dict[tuple, Any]) -> Iterator[KeyedHost]:
    host = KeyedHost(facts)
    with ctx_host.use(host):
        yield host


def commands(operation, facts: dict[type, Any], **arguments: Any) -> tuple[list, list[str]]:
    """The commands an operation yields for these facts, and its no-op messages."""
    with fake_host(facts) as host:
        return [str(c) for c in operation._inner(**arguments)], host.noops
