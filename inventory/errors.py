"""Inventory errors: each names the file, the key path and what is wrong, on one line."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def display_path(path: Path) -> str:
    """A path as the operator typed it: relative to the working directory when inside it."""
    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class InventoryError:
    source: Path
    key: str  # dotted key path, e.g. hosts.etcd-4.address; empty for whole-file problems
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = display_path(self.source)
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class InventoryInvalid(Exception):
    """Raised with every problem found, so an operator fixes them all in one pass."""

    def __init__(self, errors: list[InventoryError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))
