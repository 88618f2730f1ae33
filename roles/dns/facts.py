"""Facts of the dns role."""

from __future__ import annotations

from pyinfra.api import FactBase


class ServedSerial(FactBase):
    """The SOA serial the local Bind9 serves for a zone, or None (not running, no zone)."""

    def command(self, zone: str) -> str:
        return f"dig +short +norecurse +time=2 +tries=1 @127.0.0.1 SOA {zone} 2>/dev/null || true"

    def process(self, output: list[str]) -> int | None:
        for line in output:
            fields = line.split()
            if len(fields) == 7 and fields[2].isdigit():
                return int(fields[2])
        return None
