"""Facts of the firewall role: what the kernel holds of gpuinfra's table, and what was loaded."""

from __future__ import annotations

import hashlib

from pyinfra.api import FactBase

from toolkit.facts import lines_of

# `nft -s`: stateless listing (no counter values), so only the rules themselves are compared.
LIST_TABLE = "nft -s list table inet gpuinfra"
DIGEST = "sha256sum | cut -c1-64"
# What sha256sum prints for no bytes: nft lists nothing when there is no such table (a table's
# listing is never empty, it holds at least `table inet gpuinfra {` and `}`).
NOTHING = hashlib.sha256(b"").hexdigest()


class LoadedTable(FactBase):
    """{"live": digest of the table in the kernel now (None when there is none), "file": digest
    of the file content last loaded, "listing": digest of the table right after that load}."""

    def command(self, record: str) -> str:
        # `live` is followed by sha256sum's own line ("<digest>  -") of nft's own bytes: no
        # `cut`, no command substitution and no `cat` (the record is read by the shell). The
        # load's `$(...)` and printf give back those bytes: a listing ends in one newline.
        return f"printf 'live '; {LIST_TABLE} 2>/dev/null | sha256sum; {lines_of(record)}"

    @staticmethod
    def default() -> dict[str, str | None]:
        return {"live": None, "file": None, "listing": None}

    def process(self, output: list[str]) -> dict[str, str | None]:
        state = self.default()
        for line in output:
            words = line.split()
            if len(words) > 1 and words[0] in state:
                state[words[0]] = words[1]
        if state["live"] == NOTHING:
            state["live"] = None
        return state


class BaseChains(FactBase):
    """Every base chain of the ruleset (a chain on a hook), by table, from `nft list chains`
    (no rules, no counters): `[("inet gpuinfra", "input", "input", "drop")]` as (table, chain,
    hook, policy)."""

    @staticmethod
    def default():
        return []

    def command(self) -> str:
        return "nft list chains 2>/dev/null || true"

    def process(self, output: list[str]) -> list[tuple[str, str, str, str]]:
        chains: list[tuple[str, str, str, str]] = []
        table = chain = ""
        for line in output:
            words = line.replace(";", " ").split()
            if words[:1] == ["table"] and len(words) >= 3:
                table = f"{words[1]} {words[2]}"
            elif words[:1] == ["chain"] and len(words) >= 2:
                chain = words[1]
            elif "hook" in words and words.index("hook") + 1 < len(words):
                hook = words[words.index("hook") + 1]
                policy = words[words.index("policy") + 1] if "policy" in words[:-1] else "accept"
                chains.append((table, chain, hook, policy))
        return chains
