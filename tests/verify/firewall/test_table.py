"""gpuinfra's nftables table on every host: loaded, filtering, persisted for boot, and holding
every rule the topology and the inventory give the host."""

from __future__ import annotations

from roles.firewall.config import FirewallConfig
from roles.firewall.files import host_rules, nft_match


def live_table(host) -> str:
    return host.check_output("nft list table inet gpuinfra")


def test_table_is_loaded_with_the_configured_policy(host, ctx) -> None:
    cfg = ctx.config(FirewallConfig)
    policy = "drop" if cfg.enabled else "accept"
    assert f"type filter hook input priority filter; policy {policy};" in live_table(host)


def test_replies_and_loopback_are_accepted(host) -> None:
    table = live_table(host)
    assert "ct state established,related accept" in table
    assert 'iif "lo" accept' in table


def test_every_rule_of_the_host_is_live(host, ctx) -> None:
    """Each rule as the role renders it (sources, protocol, port) with its comment."""
    lines = [line.strip() for line in live_table(host).splitlines()]
    missing = [
        rule.description
        for rule in host_rules(ctx)
        if f"{nft_match(rule)} accept" not in {line.split(" comment ")[0] for line in lines}
    ]
    assert not missing, f"rules not in the live table: {missing}"


def test_live_table_is_what_gpuinfra_loaded(host) -> None:
    """A rule added or removed by hand changes the kernel's table but no file: the digest of
    the live table must still be the one recorded right after gpuinfra's last load."""
    live = host.check_output("nft -s list table inet gpuinfra | sha256sum | cut -c1-64")
    recorded = host.file("/var/lib/gpuinfra/firewall.loaded").content_string
    assert f"listing {live}" in recorded.splitlines()


def test_nftables_loads_the_table_at_boot(host) -> None:
    assert host.service("nftables").is_enabled
    boot_config = host.file("/etc/nftables.conf").content_string
    assert 'include "/etc/nftables.d/gpuinfra.nft"' in boot_config


def test_boot_and_stop_never_flush_other_tables(host) -> None:
    """Docker's and kube-proxy's tables must survive nftables.service starting and stopping."""
    conf = [
        line
        for line in host.file("/etc/nftables.conf").content_string.splitlines()
        if not line.lstrip().startswith("#")
    ]
    assert not [line for line in conf if "flush" in line]
    stop = host.check_output("systemctl show --property=ExecStop nftables")
    assert "delete table inet gpuinfra" in stop and "flush" not in stop
