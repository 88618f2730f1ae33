"""Each DNS server: Bind9 runs a configuration it accepts, serves the zones at the primary's
serial, transfers only to secondaries holding the key, and recurses only for the cluster."""

from __future__ import annotations

import pytest

from roles.dns.files import KEY_FILE, zones

TARGET_GROUPS = ("dns",)


def effective_config(host) -> str:
    """named-checkconf -p (the configuration as named reads it) on one line, whitespace
    collapsed, without the key's secret: a failing assertion prints what it compared."""
    printed = host.check_output("named-checkconf -p /etc/bind/named.conf | grep -v secret")
    return " ".join(printed.split())


def soa_serial(host, server: str, zone: str) -> int | None:
    answer = host.run(f"dig +short +norecurse +time=3 +tries=2 @{server} SOA {zone}").stdout
    fields = answer.split()
    return int(fields[2]) if len(fields) == 7 else None


def test_named_runs_a_valid_configuration(host) -> None:
    assert host.service("named").is_running
    assert host.service("named").is_enabled
    assert host.run("named-checkconf -z /etc/bind/named.conf").rc == 0


def test_transfer_key_is_private(host) -> None:
    key = host.file(KEY_FILE)
    assert key.mode == 0o640 and key.user == "root" and key.group == "bind"


def test_zones_are_served_at_the_primary_serial(host, ctx) -> None:
    primary = str(ctx.cluster.hosts[ctx.topology.dns_primary].address)
    behind = {}
    for zone in zones(ctx):
        here, there = soa_serial(host, "127.0.0.1", zone.name), soa_serial(host, primary, zone.name)
        if here is None or here != there:
            behind[zone.name] = (here, there)
    assert not behind, f"zone serials (here, primary): {behind}"


def test_answers_are_authoritative(host, ctx) -> None:
    flags = host.check_output(f"dig +norecurse +time=3 @127.0.0.1 SOA {ctx.cluster.domain}")
    assert " aa" in flags.split("flags:")[1].split(";")[0]


def test_signed_transfer_only_on_a_secondary(host, ctx) -> None:
    """With the key: a secondary's address gets the zone, the primary's own address does not
    (the key alone is not enough)."""
    primary = str(ctx.cluster.hosts[ctx.topology.dns_primary].address)
    output = host.check_output(
        f"dig +time=3 +tries=1 -k {KEY_FILE} @{primary} AXFR {ctx.cluster.domain} || true"
    )
    if ctx.name == ctx.topology.dns_primary:
        assert "Transfer failed" in output
    else:
        assert "XFR size" in output and "Transfer failed" not in output


def test_recursion_is_refused_outside_the_cluster_networks(host, ctx) -> None:
    """A source outside node/pod/service is made on the server itself: 127.0.0.1 may query
    (allow-query has localhost) but is no cluster network, so a name outside the cluster's
    zones is REFUSED rather than looked up. In the lab the controller and every host sit in the
    node network, so no other source outside the cluster networks exists there."""
    outside = host.check_output("dig -b 127.0.0.1 +time=3 +tries=1 @127.0.0.1 example.org A")
    assert "status: REFUSED" in outside


def test_recursion_is_configured_for_the_cluster_networks_only(host, ctx) -> None:
    """The effective configuration (named-checkconf -p) allows recursion for the "cluster" ACL,
    and that ACL holds exactly the node, pod and service networks."""
    config = host.check_output("named-checkconf -p /etc/bind/named.conf")
    assert 'allow-recursion {\n\t\t"cluster";\n\t};' in config
    acl = config.split('acl "cluster" {')[1].split("};")[0].split()
    networks = ctx.cluster.networks
    assert sorted(item.rstrip(";") for item in acl) == sorted(
        str(net) for net in (networks.node, networks.pod, networks.service)
    )


@pytest.mark.parametrize(
    "statement",
    ['allow-transfer { "none"; };', 'allow-query-cache { "cluster"; };', "version none;"],
)
def test_global_options_lock_the_server_down(host, statement: str) -> None:
    assert statement in effective_config(host)
