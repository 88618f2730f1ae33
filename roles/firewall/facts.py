"""Facts of the firewall role: what the kernel holds of gpuinfra's table, and what was loaded."""

from __future__ import annotations

from pyinfra.api import FactBase

# `nft -s`: stateless listing (no counter values), so only the rules themselves are compared.
LIST_TABLE = "nft -s list table inet gpuinfra"
DIGEST = "sha256sum | cut -c1-64"


class LoadedTable(FactBase):
    """{"live": digest of the table in the kernel now (None when there is none), "file": digest
    of the file content last loaded, "listing": digest of the table right after that load}."""

    def command(self, record: str) -> str:
        return (
            f"if out=$({LIST_TABLE} 2>/dev/null); then "
            f"printf 'live %s\\n' \"$(printf '%s\\n' \"$out\" | {DIGEST})\"; fi; "
            f"cat {record} 2>/dev/null || true"
        )

    @staticmethod
    def default() -> dict[str, str | None]:
        return {"live": None, "file": None, "listing": None}

    def process(self, output: list[str]) -> dict[str, str | None]:
        state = self.default()
        for line in output:
            key, _, value = line.strip().partition(" ")
            if key in state and value:
                state[key] = value
        return state
