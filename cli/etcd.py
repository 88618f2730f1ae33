"""`gpuinfra etcd ...`: day-2 operations on the external etcd cluster."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from cli.consoles import DeferredConsole
from cli.errors import UserError, changing, day2_call, load_cluster, reporting
from cli.exitcodes import ExitCode
from cli.options import BreakLockOpt, ClusterArg, FormatOpt, OnlyOpt, OutputFormat, SkipOpt
from cli.steps import chosen_steps, flow_help, progress, ran_alone
from day2.flows import ETCD_REPLACE, ETCD_RESTORE, ETCD_ROTATE_CA

app = typer.Typer(help="Day-2 operations on the external etcd cluster.", no_args_is_help=True)
console = DeferredConsole(highlight=False)

HEALTH_EXIT = {"healthy": ExitCode.OK, "degraded": ExitCode.DEGRADED, "lost": ExitCode.UNHEALTHY}


_load = load_cluster


def _call(work):
    from day2.etcd import EtcdOperationError, EtcdRefused

    return day2_call(work, EtcdOperationError, (EtcdRefused,))


def _json(data) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _size(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def _confirm(yes: bool, question: str) -> None:
    """Ask before a destructive day-2 command (unless --yes); a "no" ends it with exit 0."""
    if not yes and not typer.confirm(question, default=False, err=True):
        raise typer.Exit(ExitCode.OK)


EventsOpt = Annotated[
    bool,
    typer.Option("--events", help="The Events cluster (etcd.events) instead of the main one."),
]


def _which(events: bool):
    from roles.etcd.clusters import EVENTS, MAIN

    return EVENTS if events else MAIN


@app.command()
def status(
    cluster: ClusterArg, output: FormatOpt = OutputFormat.table, events: EventsOpt = False
) -> None:
    """Members, leader, health, DB size against the quota, alarms, WAL fsync p99, cert expiry.
    Exit 0 healthy, 5 a member down (quorum kept), 6 quorum lost."""
    from day2.etcd import status as cluster_status

    with reporting():
        loaded = _load(cluster)
    etcd = _which(events)
    result = _call(lambda: cluster_status(loaded, etcd))
    if output is OutputFormat.json:
        _json(asdict(result))
    else:
        from rich.table import Table

        table = Table(title=f"{etcd.title} {result.cluster}: {result.health}")
        for column in ("member", "address", "state", "leader", "db", "in use", "fsync p99",
                       "detail"):  # fmt: skip
            table.add_column(column)
        for m in result.members:
            fsync = "-" if m.wal_fsync_p99_ms is None else f"<= {m.wal_fsync_p99_ms:g} ms"
            table.add_row(m.name, m.address, m.state, "*" if m.leader else "", _size(m.db_size),
                          _size(m.db_size_in_use), fsync, m.error or "")  # fmt: skip
        console.print(table)
        console.print(
            f"healthy {result.healthy_members}/{len(result.members)} (quorum {result.quorum}), "
            f"leader {result.leader or 'none'}, quota {_size(result.quota_bytes)}, "
            f"alarms {', '.join(result.alarms) or 'none'}",
            markup=False,
        )
        soonest = result.certificates[0] if result.certificates else None
        if soonest:
            console.print(
                f"certificates: soonest expiry {soonest.name} in {soonest.days_left} days",
                markup=False,
            )
    raise typer.Exit(HEALTH_EXIT[result.health])


@app.command()
def certs(cluster: ClusterArg, output: FormatOpt = OutputFormat.table) -> None:
    """Expiry of every etcd certificate. Exit 5 when one expires within 30 days, 6 if expired."""
    from roles.etcd.pki import expiry_report

    with reporting():
        loaded = _load(cluster)
        report = expiry_report(loaded)
        if not report:
            raise UserError(f"no etcd PKI in {loaded.state_dir}: run `gpuinfra apply` first")
    if output is OutputFormat.json:
        _json([asdict(e) | {"status": e.status} for e in report])
    else:
        from rich.table import Table

        table = Table(title=f"etcd certificates of {loaded.cluster.name}")
        for column in ("certificate", "expires", "days left", "status", "serial"):
            table.add_column(column)
        for e in report:
            table.add_row(e.name, e.not_after, str(e.days_left), e.status, e.serial[:16])
        console.print(table)
    statuses = {e.status for e in report}
    code = ExitCode.UNHEALTHY if "expired" in statuses else ExitCode.OK
    if code is ExitCode.OK and "expiring" in statuses:
        code = ExitCode.DEGRADED
    raise typer.Exit(code)


@app.command("check-disk")
def check_disk(
    cluster: ClusterArg,
    max_ms: Annotated[
        float | None,
        typer.Option(
            "--max-ms",
            min=0.001,
            help="p99 limit in ms, above 0 [default: fsync_p99_max_ms].",
        ),
    ] = None,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """etcd's fio fdatasync test on every member's data directory. Exit 6 if one fails."""
    from day2.etcd import check_disk as run_check

    with reporting():
        loaded = _load(cluster)
    results = _call(lambda: run_check(loaded, max_ms))
    if output is OutputFormat.json:
        _json([asdict(r) for r in results])
    else:
        from rich.table import Table

        table = Table(title="etcd disk gate (fio fdatasync p99)")
        for column in ("member", "path", "p99", "limit", "result", "detail"):
            table.add_column(column)
        for r in results:
            p99 = "-" if r.p99_ms is None else f"{r.p99_ms:.3f} ms"
            table.add_row(r.host, r.path, p99, f"{r.limit_ms:g} ms", r.status, r.detail)
        console.print(table)
    failed = [r for r in results if r.status != "pass"]
    raise typer.Exit(ExitCode.UNHEALTHY if failed else ExitCode.OK)


@app.command()
def snapshot(
    cluster: ClusterArg,
    out: Annotated[Path | None, typer.Option("--out", help="Where to write it.")] = None,
    output: FormatOpt = OutputFormat.table,
    events: EventsOpt = False,
) -> None:
    """Take a snapshot on a healthy member and copy it to this machine (mode 0600)."""
    import time

    from day2.etcd import snapshot as take
    from toolkit.statefiles import ETCD_SNAPSHOTS

    with reporting():
        loaded = _load(cluster)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"{loaded.cluster.name}-events" if events else loaded.cluster.name
    target = out or loaded.state_dir / ETCD_SNAPSHOTS / f"{name}-{stamp}.db"
    result = _call(lambda: take(loaded, target, _which(events)))
    if output is OutputFormat.json:
        _json(asdict(result))
    else:
        console.print(
            f"snapshot from {result.member}: {result.path} ({_size(result.size)}, revision "
            f"{result.revision}, {result.keys} keys) in {result.seconds:.1f}s",
            markup=False,
        )


# The help of a flow's command ends with its steps, listed from the flow that runs them.
RESTORE_HELP = flow_help(
    ETCD_RESTORE,
    "Rebuild the whole cluster from a snapshot, staged on every member first.",
    (
        "Members are stopped and swapped only when every member staged it; the old data is "
        "kept until the restored cluster is healthy and put back if it does not become "
        "healthy. Refused (exit 2) while a kube-apiserver runs or a member's data disk "
        "is not mounted."
    ),
)


@app.command(help=RESTORE_HELP)
def restore(
    cluster: ClusterArg,
    snapshot_file: Annotated[Path, typer.Argument(help="A snapshot from `etcd snapshot`.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    skip: SkipOpt = None,
    only: OnlyOpt = None,
    break_lock: BreakLockOpt = False,
    output: FormatOpt = OutputFormat.table,
) -> None:
    from day2.etcd import restore as rebuild

    with reporting():
        loaded = _load(cluster)
        if not snapshot_file.is_file():
            raise UserError(f"{snapshot_file}: no such snapshot file")
        steps = chosen_steps(ETCD_RESTORE, skip, only)
    with changing(loaded, break_lock=break_lock) as loaded:
        _confirm(yes, f"Replace the data of every etcd member of {loaded.cluster.name}?")
        result = _call(
            lambda: rebuild(loaded, snapshot_file, skip=steps, only=only, progress=progress)
        )
    if only:
        ran_alone(ETCD_RESTORE, only, output, result.seconds)
        return
    if output is OutputFormat.json:
        _json(asdict(result))
    else:
        console.print(
            f"restored {len(result.members)} members from {result.snapshot} in "
            f"{result.seconds:.1f}s; cluster {result.health}",
            markup=False,
        )
    raise typer.Exit(HEALTH_EXIT[result.health])


REPLACE_HELP = flow_help(
    ETCD_REPLACE,
    "Replace a member by a new one on the same host, joined as a learner.",
    (
        "The old data is set aside and deleted only once the new member is promoted and the "
        "cluster healthy; nothing is changed when etcd there does not stop. etcd there cannot "
        "be started until the new member is added (a fence drop-in). Refused (exit 2) when its "
        "data disk is not mounted. --events: the host's member of the Events cluster."
    ),
)


@app.command("replace", help=REPLACE_HELP)
def replace_member(
    cluster: ClusterArg,
    member: Annotated[str, typer.Argument(help="The etcd host to remove and add back.")],
    override_gate: Annotated[
        bool, typer.Option("--override-gate", help="Rejoin even if its disk fails the gate.")
    ] = False,
    discard_old_data: Annotated[
        bool,
        typer.Option(
            "--discard-old-data",
            help="Delete the old data once etcd stopped instead of keeping it until the new "
            "member is healthy (a data disk too full to hold both).",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    events: EventsOpt = False,
    skip: SkipOpt = None,
    only: OnlyOpt = None,
    break_lock: BreakLockOpt = False,
    output: FormatOpt = OutputFormat.table,
) -> None:
    from day2.etcd import replace

    etcd = _which(events)
    with reporting():
        loaded = _load(cluster)
        steps = chosen_steps(ETCD_REPLACE, skip, only)
    with changing(loaded, break_lock=break_lock) as loaded:
        _confirm(
            yes,
            f"Remove {member} from {etcd.title} and add it back with an empty data directory?",
        )
        result = _call(
            lambda: replace(
                loaded,
                member,
                override_gate=override_gate,
                discard_old_data=discard_old_data,
                etcd=etcd,
                skip=steps,
                only=only,
                progress=progress,
            )
        )
    if only:
        ran_alone(ETCD_REPLACE, only, output, result.seconds)
        return
    if output is OutputFormat.json:
        _json(asdict(result))
    else:
        gate = result.gate.detail if result.gate else "not run"
        console.print(
            f"{result.member}: member {result.old_id} replaced by {result.new_id} in "
            f"{result.seconds:.1f}s (disk gate: {gate})",
            markup=False,
        )


@app.command("rotate-certs")
def rotate_certs(
    cluster: ClusterArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    break_lock: BreakLockOpt = False,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """New member and client certificates (same CA), rolled out one member at a time."""
    from day2.etcd import rotate_certs as rotate

    with reporting():
        loaded = _load(cluster)
    with changing(loaded, break_lock=break_lock) as loaded:
        _confirm(yes, "Rotate every etcd certificate?")
        result = _call(lambda: rotate(loaded))
    if output is OutputFormat.json:
        _json(asdict(result))
    else:
        for name, state in result.apply_status.items():
            console.print(f"{name}: {state} {result.apply_errors.get(name, '')}", markup=False)
        console.print(f"rotated in {result.seconds:.1f}s; cluster {result.health}", markup=False)
    if result.apply_errors:
        raise typer.Exit(ExitCode.ERROR)
    raise typer.Exit(HEALTH_EXIT[result.health])


ROTATE_CA_HELP = flow_help(
    ETCD_ROTATE_CA,
    "Replace the etcd CA in three rolled-out steps; resumes a stopped run.",
    (
        "Trust old and new CA, reissue every certificate from the new one, drop the old one: "
        "each step an apply with members restarting one at a time and a healthy cluster after "
        "it. The steps a stopped run finished are reported as already done."
    ),
)


@app.command("rotate-ca", help=ROTATE_CA_HELP)
def rotate_ca(
    cluster: ClusterArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    skip: SkipOpt = None,
    only: OnlyOpt = None,
    break_lock: BreakLockOpt = False,
    output: FormatOpt = OutputFormat.table,
) -> None:
    from day2.etcd import rotate_ca as rotate

    with reporting():
        loaded = _load(cluster)
        steps = chosen_steps(ETCD_ROTATE_CA, skip, only)
    with changing(loaded, break_lock=break_lock) as loaded:
        _confirm(yes, f"Replace the etcd CA of {loaded.cluster.name} (three rolling restarts)?")
        result = _call(lambda: rotate(loaded, skip=steps, only=only, progress=progress))
    if only:
        ran_alone(ETCD_ROTATE_CA, only, output, result.seconds)
        return
    if output is OutputFormat.json:
        _json(asdict(result))
    else:
        for step in result.steps:
            console.print(
                f"{step.step}: {len(step.apply_status)} hosts applied in {step.seconds:.1f}s; "
                f"cluster {step.health}",
                markup=False,
            )
        console.print(
            f"CA {result.old_ca_serial} replaced by {result.new_ca_serial} in "
            f"{result.seconds:.1f}s",
            markup=False,
        )
