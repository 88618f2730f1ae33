"""The firewall role's deploy: nftables, gpuinfra's table checked then loaded, boot persistence."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, systemd

from roles.firewall.config import FirewallConfig
from roles.firewall.facts import BaseChains
from roles.firewall.files import SERVICE_DROPIN, TABLE_FILE, managed_files
from roles.firewall.operations import table_loaded
from toolkit.effective import nothing_overrides, ours_or_declared, unit_dropins
from toolkit.operations import put_file, service_running
from toolkit.spec import HostContext


@deploy("Firewall")
def apply(ctx: HostContext) -> None:
    apt.packages(name="Install nftables", packages=["nftables"], no_recommends=True)
    files = managed_files(ctx)
    written = {f.path: put_file(f) for f in files}
    systemd.daemon_reload(
        name="Reload systemd for the nftables drop-in", _if=written[SERVICE_DROPIN].did_change
    )
    # Enabled for boot; starting it loads /etc/nftables.conf, which only includes our table.
    service_running(name="Run nftables", unit="nftables")
    table = next(f for f in files if f.path == TABLE_FILE)
    table_loaded(name="Load the gpuinfra table", path=TABLE_FILE, content=table.content)
    cfg = ctx.config(FirewallConfig)
    chains = host.get_fact(BaseChains)
    nothing_overrides("Check that no other table filters input", other_tables(chains, cfg))
    allowed = ours_or_declared(ctx)
    unit_dropins("Check the drop-ins of nftables", ("nftables",), allowed)


# The hooks a packet for this host passes before or as it reaches gpuinfra's input chain.
INPUT_HOOKS = ("ingress", "prerouting", "input")


def other_tables(chains: list[tuple[str, str, str, str]], cfg: FirewallConfig) -> list[str]:
    """A finding for each base chain on an input path in a table neither gpuinfra's nor
    declared: its rules can drop what gpuinfra's table accepts."""
    allowed = {"inet gpuinfra", *cfg.foreign_tables}
    return [
        f"nftables: table {table} filters {hook} (chain {chain}, policy {policy}) beside "
        "gpuinfra's (remove it, or declare it in firewall.foreign_tables)"
        for table, chain, hook, policy in chains
        if hook in INPUT_HOOKS and table not in allowed
    ]
