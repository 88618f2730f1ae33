"""The `gpuinfra` command. A plain `gpuinfra drift CLUSTER` sends its probes to the hosts first,
before typer, pydantic and the inventory are imported (roles/fingerprint.py send_early): the
hosts answer while the rest of the command starts."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["drift"]:
        from roles.fingerprint import send_early

        send_early(sys.argv[2:])
    from cli.main import app

    app()
