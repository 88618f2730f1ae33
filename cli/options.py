"""Options shared by several commands, as Annotated aliases, and the process-wide CLI state."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


ClusterArg = Annotated[
    Path,
    typer.Argument(
        help="Cluster file, a folder holding cluster.yml, or an Ansible inventory (INI or YAML).",
        show_default=False,
    ),
]
FormatOpt = Annotated[
    OutputFormat, typer.Option("--format", "-f", help="table for people, json for machines.")
]


class State:
    verbose: bool = False


state = State()
