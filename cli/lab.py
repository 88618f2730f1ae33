"""`gpuinfra lab`: boot real Debian hosts on this machine with systemd-nspawn."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.consoles import DeferredConsole
from cli.errors import UserError, reporting, stderr
from cli.exitcodes import ExitCode
from cli.options import FormatOpt, OutputFormat
from lab.errors import LabError, LabInvalid, LabMissingTool, LabNotRoot
from lab.naming import DEFAULT_NAME
from lab.topology import (
    DEFAULT_PARALLEL,
    generic_topology,
    named_topology,
    parse_disks,
    parse_size,
)

if TYPE_CHECKING:
    from lab import lifecycle

app = typer.Typer(
    help="A multi-host lab of real Debian 13 hosts on this machine.", no_args_is_help=True
)
console = DeferredConsole(highlight=False)
progress_console = DeferredConsole(stderr=True, highlight=False)


class TopologyName(StrEnum):
    default = "default"
    scale = "scale"


NameOpt = Annotated[
    str, typer.Option("--name", "-n", help="Lab name: labs with different names never collide.")
]
HostArg = Annotated[str, typer.Argument(help="A host of the lab, e.g. etcd-1.", show_default=False)]


@contextmanager
def lab_errors() -> Iterator[None]:
    """LabError -> one line on stderr: exit 2 for what the operator must fix first, else 1."""
    with reporting():
        try:
            yield
        except (LabInvalid, LabNotRoot, LabMissingTool) as exc:
            raise UserError(str(exc), ExitCode.BAD_INPUT) from exc
        except LabError as exc:
            raise UserError(str(exc), ExitCode.ERROR) from exc
        except KeyboardInterrupt:
            # Everything the lab does is resumable: say how, without a traceback.
            stderr.print("interrupted: rerun the command to resume, or `gpuinfra lab down`")
            raise typer.Exit(130) from None


@app.command()
def up(
    name: NameOpt = DEFAULT_NAME,
    hosts: Annotated[
        int | None, typer.Option("--hosts", help="Boot N plain cpu_worker hosts (scale work).")
    ] = None,
    topology: Annotated[
        TopologyName | None,
        typer.Option(help="default: 13 hosts, every group; scale: 100 hosts, HA everywhere."),
    ] = None,
    disk: Annotated[
        list[str] | None,
        typer.Option("--disk", help="HOST=SIZE: a block device /dev/vdb for HOST (repeatable)."),
    ] = None,
    inventory: Annotated[
        Path | None,
        typer.Option(help="Where to write cluster.yml (default: inventory/NAME/cluster.yml)."),
    ] = None,
    parallel: Annotated[
        int, typer.Option(min=1, help="Hosts booting at the same time.")
    ] = DEFAULT_PARALLEL,
    layer: Annotated[
        Path | None,
        typer.Option(help="A folder from `lab save-layer`: every host starts from that state."),
    ] = None,
    kubernetes: Annotated[
        bool | None,
        typer.Option(
            "--kubernetes/--no-kubernetes",
            help="Run Kubernetes on the lab's nodes, built on this machine (a new lab does).",
            show_default=False,
        ),
    ] = None,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """Boot the lab's hosts (or resume a partial lab) and write its cluster inventory."""
    with lab_errors():
        if hosts is not None and topology is not None:
            raise UserError("use either --hosts or --topology, not both")
        chosen = None
        if hosts is not None:
            chosen = generic_topology(hosts)
        elif topology is not None or disk:
            chosen = named_topology((topology or TopologyName.default).value)
        if disk:
            if chosen is None:
                raise UserError("--disk needs --hosts or --topology")
            chosen = chosen.with_disks(parse_disks(disk))
        total = len(chosen.hosts) if chosen else None
        with _boot_progress(total, enabled=output is OutputFormat.table) as on_host:
            from lab import lifecycle

            result = lifecycle.up(
                name,
                chosen,
                inventory_path=inventory,
                parallel=parallel,
                progress=on_host,
                layer=layer,
                kubernetes=kubernetes,
            )
    if output is OutputFormat.json:
        typer.echo(json.dumps(asdict(result), default=str, indent=2))
        return
    if result.rootfs_build_seconds is not None:
        console.print(f"built the Debian 13 root in {result.rootfs_build_seconds:.0f} s")
    console.print(
        f"lab {result.name}: {result.hosts} hosts answer SSH ({len(result.started)} booted, "
        f"{len(result.already_running)} already running) in {result.seconds:.1f} s; "
        f"subnet {result.subnet}",
        markup=False,
    )
    console.print(f"inventory: {result.inventory_path}", markup=False)


@contextmanager
def _boot_progress(total: int | None, *, enabled: bool) -> Iterator[lifecycle.Progress | None]:
    if not enabled or not progress_console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("booting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=progress_console.get(), transient=True) as bar:
        task = bar.add_task("boot", total=total)

        def on_host(host: str, event: str) -> None:
            if event in ("ready", "running"):
                bar.advance(task)

        yield on_host


@app.command()
def down(name: NameOpt = DEFAULT_NAME) -> None:
    """Remove everything the lab made: hosts, mounts, loop devices, links, nft table, state."""
    with lab_errors():
        from lab import lifecycle

        result = lifecycle.down(name)
    if not result.removed:
        console.print(f"lab {name}: nothing to remove", markup=False)
        return
    console.print(f"lab {name} removed: {', '.join(result.removed)}", markup=False)
    if result.killed:
        console.print(f"{len(result.killed)} hosts ignored SIGTERM and were killed", markup=False)


@app.command()
def status(name: NameOpt = DEFAULT_NAME, output: FormatOpt = OutputFormat.table) -> None:
    """Hosts, addresses, whether each is up, and the memory each uses."""
    with lab_errors():
        from lab import lifecycle

        result = lifecycle.status(name)
    if output is OutputFormat.json:
        typer.echo(json.dumps(asdict(result), indent=2))
        return
    from rich.table import Table

    table = Table(title=f"lab {result.name} ({result.subnet} on {result.bridge})")
    for column in ("host", "address", "groups", "state", "memory"):
        table.add_column(column, justify="right" if column == "memory" else "left")
    for host in result.hosts:
        table.add_row(
            host.name,
            host.address,
            ", ".join(host.groups),
            _state_word(host),
            f"{host.memory_bytes / 2**20:.0f} MiB" if host.memory_bytes else "-",
        )
    console.print(table)
    up_count = sum(1 for host in result.hosts if host.ssh and not host.partitioned)
    console.print(f"{up_count} of {len(result.hosts)} hosts up; inventory: {result.inventory_path}")


def _state_word(host: lifecycle.HostStatus) -> str:
    if not host.running:
        return "stopped"
    if host.partitioned:
        return "partitioned"
    return "up" if host.ssh else "booting"


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(
    host: HostArg,
    command: Annotated[
        list[str] | None, typer.Argument(help="Remote command; a shell without one.")
    ] = None,
    name: NameOpt = DEFAULT_NAME,
) -> None:
    """Open ssh to a lab host (strict host-key checking, the lab's own key)."""
    with lab_errors():
        from lab import lifecycle

        argv = lifecycle.ssh_argv(name, host, command or [], batch=bool(command))
    os.execvp(argv[0], argv)


@app.command()
def stop(host: HostArg, name: NameOpt = DEFAULT_NAME) -> None:
    """Power a host off; it stays off (no reboot) until `lab start`."""
    with lab_errors():
        from lab import lifecycle

        was_running = lifecycle.stop_host(name, host)
    console.print(f"{host}: {'stopped' if was_running else 'was not running'}", markup=False)


@app.command()
def start(host: HostArg, name: NameOpt = DEFAULT_NAME) -> None:
    """Boot a stopped host and wait until it answers SSH."""
    with lab_errors():
        from lab import lifecycle

        already = lifecycle.start_host(name, host)
    console.print(f"{host}: {'already running' if already else 'up'}", markup=False)


@app.command("save-layer")
def save_layer(
    host: HostArg,
    out: Annotated[Path, typer.Option("--out", help="New folder to write the layer to.")],
    name: NameOpt = DEFAULT_NAME,
) -> None:
    """Power HOST off and save its changes as a layer for `lab up --layer` (scale benchmarks:
    hosts that start converged). SSH host keys, machine id and host name are left out."""
    with lab_errors():
        from lab import lifecycle

        saved = lifecycle.save_layer(name, host, out)
    console.print(f"saved {host} as a layer in {saved}", markup=False)


@app.command()
def partition(host: HostArg, name: NameOpt = DEFAULT_NAME) -> None:
    """Cut a host off the network (it keeps running); undo with `lab heal`."""
    with lab_errors():
        from lab import lifecycle

        lifecycle.partition(name, host, partitioned=True)
    console.print(f"{host}: partitioned", markup=False)


@app.command()
def heal(host: HostArg, name: NameOpt = DEFAULT_NAME) -> None:
    """Restore a partitioned host's network."""
    with lab_errors():
        from lab import lifecycle

        lifecycle.partition(name, host, partitioned=False)
    console.print(f"{host}: network restored", markup=False)


@app.command("attach-disk")
def attach_disk(
    host: HostArg,
    size: Annotated[str, typer.Argument(help="Size, e.g. 2G.", show_default=False)],
    name: NameOpt = DEFAULT_NAME,
) -> None:
    """Give a host a block device, /dev/vdb inside (a running host reboots to see it)."""
    with lab_errors():
        from lab import lifecycle

        device = lifecycle.attach_disk(name, host, parse_size(size))
    console.print(f"{host}: /dev/vdb is {device} on this machine", markup=False)


@app.command("fleet")
def fleet_command(
    nodes: Annotated[
        int,
        typer.Option("--nodes", min=0, help="The fleet's size: creates or deletes to reach it."),
    ],
    name: NameOpt = DEFAULT_NAME,
    output: FormatOpt = OutputFormat.table,
) -> None:
    """Simulated GPU nodes on the lab's real cluster (kwok on this machine; `lab down` stops it):
    Ready, leased and tainted as the inventory's GPU workers, dealt round its teams."""
    with lab_errors():
        from lab import fleet

        result = fleet.scale(name, nodes)
    if output is OutputFormat.json:
        typer.echo(json.dumps(asdict(result), indent=2))
        return
    console.print(
        f"lab {result.name}: {result.nodes} simulated nodes ({result.created} created, "
        f"{result.deleted} deleted); created in {result.create_seconds:.1f} s, all Ready with a "
        f"Lease in {result.ready_seconds:.1f} s",
        markup=False,
    )
