"""`gpuinfra lab`: boot real Debian hosts on this machine with systemd-nspawn."""

from __future__ import annotations

import typer

app = typer.Typer(help="A multi-host lab of real Debian 13 hosts on this machine.", no_args_is_help=True)
