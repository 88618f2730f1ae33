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
        # `live` is followed by sha256sum's own line ("<digest>  -"): no `cut` process and no
        # command substitution around it; the digest is of the same bytes as the listing's.
        return (
            f"if out=$({LIST_TABLE} 2>/dev/null); then "
            f"printf 'live '; printf '%s\\n' \"$out\" | sha256sum; fi; "
            f"cat {record} 2>/dev/null || true"
        )

    @staticmethod
    def default() -> dict[str, str | None]:
        return {"live": None, "file": None, "listing": None}

    def process(self, output: list[str]) -> dict[str, str | None]:
        state = self.default()
        for line in output:
            words = line.split()
            if len(words) > 1 and words[0] in state:
                state[words[0]] = words[1]
        return state
