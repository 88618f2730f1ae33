"""`gpuinfra inventory`: validate, show and import cluster inventories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.consoles import DeferredConsole
from cli.errors import UserError, reporting
from cli.options import ClusterArg, FormatOpt, OutputFormat

app = typer.Typer(help="Validate, show and import cluster inventories.", no_args_is_help=True)
console = DeferredConsole(highlight=False)


@app.command()
def validate(cluster: ClusterArg) -> None:
    """Check a cluster inventory without connecting to anything; exit 2 on any problem."""
    from engine.context import load

    with reporting():
        loaded = load(cluster)
    # Plain text, not rich: one line however long the path (no wrap at the terminal's width),
    # and no 20 ms of CPU to import rich for it.
    typer.echo(f"{loaded.source}: valid ({len(loaded.cluster.hosts)} hosts)")


@app.command()
def show(cluster: ClusterArg, output: FormatOpt = OutputFormat.table) -> None:
    """Show hosts, groups and the derived topology (endpoints, DNS, firewall peers)."""
    from engine.context import load, topology_of

    with reporting():
        loaded = load(cluster)
    model = loaded.cluster
    topology = topology_of(loaded)
    if output is OutputFormat.json:
        document = {
            "cluster": model.model_dump(mode="json"),
            "topology": {
                "etcd_initial_cluster": topology.etcd_initial_cluster,
                "etcd_client_endpoints": list(topology.etcd_client_endpoints),
                "api_endpoint": topology.api_endpoint,
                "api_address": topology.api_address,
                "api_backends": [b.__dict__ for b in topology.api_backends],
                "dns_primary": topology.dns_primary,
                "dns_secondaries": list(topology.dns_secondaries),
                "forward_records": [r.__dict__ for r in topology.forward_records],
                "reverse_zones": {
                    zone: [r.__dict__ for r in records]
                    for zone, records in topology.reverse_zones.items()
                },
                "firewall": {
                    group: [{**r.__dict__, "sources": list(r.sources)} for r in rules]
                    for group, rules in topology.firewall.items()
                },
            },
        }
        typer.echo(json.dumps(document, indent=2))
        return
    from rich.table import Table

    hosts = Table(title=f"{model.name} ({model.domain}, {model.os})")
    for column in ("host", "address", "groups", "gpu", "etcd disk"):
        hosts.add_column(column)
    for name, host in model.hosts.items():
        gpu = f"{host.gpu.count}x {host.gpu.model}" if host.gpu else ""
        disk = host.etcd.disk or "" if host.etcd else ""
        hosts.add_row(name, str(host.address), ", ".join(host.groups), gpu, disk)
    console.print(hosts)
    endpoints = Table(title="topology", show_header=False)
    endpoints.add_row("API", f"{topology.api_endpoint} -> {topology.api_address or '-'}")
    endpoints.add_row(
        "API backends", ", ".join(f"{b.name}:{b.port}" for b in topology.api_backends)
    )
    endpoints.add_row("etcd endpoints", ", ".join(topology.etcd_client_endpoints))
    endpoints.add_row(
        "DNS",
        f"primary {topology.dns_primary or '-'}, "
        f"secondaries {', '.join(topology.dns_secondaries) or '-'}",
    )
    console.print(endpoints)
    firewall = Table(title="firewall: inbound accepted per group (everything else dropped)")
    for column in ("group", "port", "from", "why"):
        firewall.add_column(column)
    for group, rules in topology.firewall.items():
        for rule in rules:
            firewall.add_row(
                group, f"{rule.port}/{rule.protocol}", ", ".join(rule.sources), rule.description
            )
    console.print(firewall)


@app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="Ansible inventory: INI or YAML file, or folder.")],
    out: Annotated[
        Path | None,
        typer.Option(help="Cluster file to write [default: inventory/NAME/cluster.yml]."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Cluster name [default: folder name].")] = None,
    node_network: Annotated[
        str | None, typer.Option(help="Node network CIDR [default: smallest covering the hosts].")
    ] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing cluster file.")] = False,
) -> None:
    """Import a Kubespray/DeepOps Ansible inventory and write a cluster file."""
    import yaml

    from inventory.ansible_import import import_ansible

    with reporting():
        if not path.exists():
            raise UserError(f"{path}: no such file or directory")
        result = import_ansible(path, name=name, node_network=node_network)
        target = out or Path("inventory") / result.data["name"] / "cluster.yml"
        if target.exists() and not force:
            raise UserError(f"{target}: exists; pass --force to overwrite it")
        target.parent.mkdir(parents=True, exist_ok=True)
        header = f"# Imported by gpuinfra from {path}; review before use.\n"
        target.write_text(header + yaml.safe_dump(result.data, sort_keys=False))
    console.print(f"wrote {target} ({len(result.data['hosts'])} hosts)", markup=False)
    for line in result.unmapped:
        console.print(f"  not mapped: {line}", markup=False)
