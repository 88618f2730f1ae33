"""Rich consoles made on first use: importing rich costs about 20 ms of CPU, which a command that
prints nothing through it (`--help`, a valid `inventory validate`) should not pay."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


class DeferredConsole:
    """Stands for `rich.console.Console(**options)`, built on the first attribute read.

    Like a console made at import, it writes to whatever sys.stdout/sys.stderr is when it
    prints (a CliRunner's capture included)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def get(self) -> Console:
        """The console itself, for what rich checks by type (a Progress bar's `console=`)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)
