"""`gpuinfra render`: every managed file of every host, written offline for review and tests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cli.errors import reporting
from cli.options import ClusterArg


def render(
    cluster: ClusterArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder: OUT/<host>/<absolute path>.")],
) -> None:
    """Render every configuration file of every host into a folder, without connecting."""
    from inventory.loader import load
    from roles.render import render_cluster

    with reporting():
        loaded = load(cluster)
    result = render_cluster(loaded, out)
    Console(highlight=False).print(
        f"rendered {result.files} files for {result.hosts} hosts into {out}", markup=False
    )
