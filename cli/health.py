"""`gpuinfra health`: GPU health checks on a node and across the fleet."""

from __future__ import annotations

import typer

app = typer.Typer(help="GPU health: passive and active checks, fleet sampling, cordoning.", no_args_is_help=True)
