"""Options shared by several commands, as Annotated aliases, their parsers, and the
process-wide CLI state.

Every option that parses a value is checked here or by typer's own types and ranges: a bad
value is a `typer.BadParameter`, which the app prints as one line with exit code 2.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


_COUNT = re.compile(r"^\d+$")
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")


def parse_count_or_percent(value: str | None, option: str) -> str | None:
    """`N` (a whole number >= 1) or `P%` (0 < P <= 100), returned as given."""
    if value is None:
        return None
    text = value.strip()
    if _COUNT.match(text) and int(text) >= 1:
        return text
    percent = _PERCENT.match(text)
    if percent and 0 < float(percent.group(1)) <= 100:
        return text
    raise typer.BadParameter(
        f"expected a whole number >= 1 or a percentage in (0, 100]%, got {value!r}",
        param_hint=option,
    )


def parse_shard(value: str | None) -> tuple[int, int] | None:
    """ "I/N" with 0 <= I < N."""
    if value is None:
        return None
    index, _, count = value.partition("/")
    if not (index.strip().isdigit() and count.strip().isdigit()):
        raise typer.BadParameter(f"expected I/N, e.g. 0/4 (got {value!r})", param_hint="--shard")
    shard = int(index), int(count)
    if not 0 <= shard[0] < shard[1]:
        raise typer.BadParameter(f"index must be in 0..N-1 (got {value!r})", param_hint="--shard")
    return shard


def _batch(value: str | None) -> str | None:
    return parse_count_or_percent(value, "--batch")


def _rate(value: str | None) -> str | None:
    from toolkit.pacing import Rate, RateInvalid

    if value is not None:
        try:
            Rate.parse(value)
        except RateInvalid as exc:
            raise typer.BadParameter(str(exc), param_hint="--rate") from None
    return value


def _shard(value: str | None) -> str | None:
    parse_shard(value)
    return value


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
LimitOpt = Annotated[
    str | None, typer.Option("--limit", help="Host or group names, comma-separated.")
]
RolesOpt = Annotated[str | None, typer.Option("--roles", help="Role names, comma-separated.")]
ParallelOpt = Annotated[
    int | None, typer.Option("--parallel", min=1, help="Hosts worked on at once [default: all].")
]
ShardOpt = Annotated[
    str | None,
    typer.Option(
        "--shard",
        callback=_shard,
        help="I/N: only shard I (0-based) of N, hosts split by name order; one CI runner each.",
    ),
]
BatchOpt = Annotated[
    str | None,
    typer.Option(
        "--batch",
        callback=_batch,
        help="Roll in steps of N hosts or P%, by each group's policy (etcd together, API "
        "servers, load balancers and DNS servers one at a time).",
    ),
]
RateOpt = Annotated[
    str | None,
    typer.Option(
        "--rate",
        callback=_rate,
        help="N/INTERVAL: at most N workers start per interval (5/30s).",
    ),
]
FailPercentOpt = Annotated[
    float | None,
    typer.Option("--fail-percent", min=0, max=100, help="Stop batches past this failure %."),
]
SkipOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--skip",
        metavar="STEP",
        help="Leave out a step marked (--skip) in the list above; repeat for more.",
    ),
]
OnlyOpt = Annotated[
    str | None,
    typer.Option(
        "--only",
        metavar="STEP",
        help="Run only this step, one marked (--only) in the list above.",
    ),
]
BreakLockOpt = Annotated[
    bool,
    typer.Option(
        "--break-lock",
        help="Take over a lock record left by an apply on another controller that no "
        "longer runs; never a lock a live apply holds.",
    ),
]
ConnectTimeoutOpt = Annotated[
    int,
    typer.Option("--connect-timeout", min=1, max=600, help="Seconds to wait for each SSH connect."),
]


class State:
    verbose: bool = False


state = State()
