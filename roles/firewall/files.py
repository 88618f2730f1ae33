"""Files the firewall role manages on every host: gpuinfra's nftables table and its loading."""

from __future__ import annotations

from dataclasses import dataclass

from inventory.topology import FirewallRule, collapse_sources, host_rules_key
from roles.firewall.config import FirewallConfig
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

TABLE_FILE = "/etc/nftables.d/gpuinfra.nft"
NFTABLES_CONF = "/etc/nftables.conf"
SERVICE_DROPIN = "/etc/systemd/system/nftables.service.d/50-gpuinfra.conf"
# `nft -c` builds the whole transaction in the kernel and commits nothing: a file it accepts
# loads, a file it refuses never goes live.
NFT_CHECK = "nft -c -f {path}"


@dataclass(frozen=True)
class RenderedRule:
    match: str  # nftables match expression, without the verdict
    description: str


def host_rules(ctx: HostContext) -> list[FirewallRule]:
    """The topology's rules for the host's groups, then the inventory's extra rules."""
    cfg = ctx.config(FirewallConfig)
    rules = ctx.topology.rules_for([*ctx.host.groups, host_rules_key(ctx.name)])
    rules += [
        FirewallRule(
            extra.description,
            extra.port,
            extra.protocol,
            collapse_sources(str(source) for source in extra.sources),
        )
        for extra in cfg.extra_rules
    ]
    return rules


def nft_match(rule: FirewallRule) -> str:
    """The nftables expression matching a rule's traffic: sources, then protocol and port."""
    if len(rule.sources) == 1:
        sources = f"ip saddr {rule.sources[0]}"
    else:
        sources = "ip saddr { " + ", ".join(rule.sources) + " }"
    if rule.port is None:
        return f"{sources} ip protocol {rule.protocol}"
    return f"{sources} {rule.protocol} dport {rule.port}"


def render_table(ctx: HostContext) -> str:
    cfg = ctx.settings["firewall"]
    rules = [
        # A double quote would end the nftables comment string early.
        RenderedRule(nft_match(rule), rule.description.replace('"', "'"))
        for rule in host_rules(ctx)
    ]
    return render_template("firewall/gpuinfra.nft.j2", cfg=cfg, rules=rules)


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    return [
        # The table first: nftables.conf includes it, and its check needs it in place.
        ManagedFile("firewall", TABLE_FILE, render_table(ctx), check=NFT_CHECK),
        ManagedFile(
            "firewall",
            NFTABLES_CONF,
            render_template("firewall/nftables.conf.j2", table_file=TABLE_FILE),
            mode="0755",
            check=NFT_CHECK,
        ),
        ManagedFile(
            "firewall", SERVICE_DROPIN, render_template("firewall/nftables.service.conf.j2")
        ),
    ]
