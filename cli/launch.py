"""The `gpuinfra` command. A plain `gpuinfra drift CLUSTER` sends its probes to the hosts first,
before typer, pydantic and the inventory are imported (engine/fingerprint/ send_early): the
hosts answer while the rest of the command starts. When the inventory and the code are as the
last apply left them and every host answers as its record says, that is drift's answer
(fingerprint.settled): the command never loads the inventory, and never imports typer or
pydantic."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["apply"]:
        # The code an apply records its hosts under, read before the inventory or any role is
        # imported (engine/fingerprint/recording.py checks at the end that it is still the code
        # on disk).
        from engine.fingerprint import code_digest

        code_digest()
    if sys.argv[1:3] == ["drift", "--job-shard"]:
        # A pod of `drift --job` (engine/fleetshard.py): no inventory, typer or pydantic.
        from engine.fleetshard import main as shard

        sys.exit(shard(sys.argv[3:]))
    if sys.argv[1:2] == ["drift"]:
        from engine.fingerprint import send_early

        send_early(sys.argv[2:])
        answer_settled(sys.argv[2:])
    from cli.main import app

    app()


def answer_settled(args: list[str]) -> None:
    """Exit with drift's answer when fingerprint.settled has it; return otherwise (nothing
    printed or written)."""
    from engine import fingerprint

    plain = fingerprint.plain_drift(args)
    found = fingerprint.settled() if plain is not None else None
    if plain is None or found is None:
        return
    from pathlib import Path

    from cli.exitcodes import ExitCode
    from cli.output import emit, exit_code, write_reports
    from engine.drift import merged_report
    from engine.reports import Mode, RunReport

    fast = found.result
    exact = RunReport(cluster=found.cluster, mode=Mode.drift)
    report = merged_report(found.cluster, found.hosts, [], fast, exact, fast.started)
    try:
        write_reports(
            report,
            Path(plain.report) if plain.report else None,
            Path(plain.junit) if plain.junit else None,
        )
        emit(report, plain.output, show_diff=True)
    except Exception as exc:  # as the command line reports it (cli/main.py OneLineErrors)
        from cli.errors import stderr

        message = f"error: unexpected {type(exc).__name__}: {exc} (--verbose shows the traceback)"
        stderr.print(message, markup=False)
        sys.exit(ExitCode.ERROR)
    sys.exit(exit_code(report))
