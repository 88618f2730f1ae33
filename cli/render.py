"""`gpuinfra render`: every managed file of every host, written offline for review and tests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.errors import reporting, stderr
from cli.options import ClusterArg


def render(
    cluster: ClusterArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder: OUT/<host>/<absolute path>.")],
) -> None:
    """Render every configuration file of every host into a folder, without connecting.

    Reads the cluster's .state/ and never writes it: secrets only apply generates (etcd
    certificates and keys, the TSIG key, the keepalived password) are placeholders until then."""
    from engine.context import load
    from engine.render import render_cluster
    from inventory.model import StateAccess

    with reporting():
        loaded = load(cluster).with_state_access(StateAccess.placeholder)
    result = render_cluster(loaded, out)
    if result.placeholders:
        where = loaded.state_dir
        why = "no controller state at" if not where.exists() else "secrets missing from"
        stderr.print(
            f"note: {why} {where}: {len(result.placeholders)} files hold placeholders for "
            "generated secrets (etcd certificates and keys, TSIG key, keepalived password); "
            "`gpuinfra apply` creates them",
            markup=False,
        )
    from rich.console import Console

    Console(highlight=False).print(
        f"rendered {result.files} files for {result.hosts} hosts into {out}", markup=False
    )
