"""The dns role offline: zones, serials, the transfer key, primary/secondary configuration and
every host's resolver, rendered from the sample and small clusters."""

from __future__ import annotations

import base64
import datetime
import stat

import pytest

from engine.context import host_contexts, host_files, load
from roles.dns.facts import ServedSerials
from roles.dns.files import (
    KEY_FILE,
    LOCAL_FILE,
    OPTIONS_FILE,
    RESOLV_CONF,
    client_files,
    render_zone,
    server_files,
    zones,
)
from roles.dns.operations import primary_zone, zone_served
from roles.dns.secrets import next_serial, tsig_secret, zone_serial
from tests.helpers import files_of
from tests.unit.conftest import SAMPLE
from tests.unit.fake_host import commands
from toolkit import clock

DAY = datetime.date(2026, 11, 21)


def contexts(loaded):
    return {ctx.name: ctx for ctx in host_contexts(loaded)}


@pytest.fixture
def two_dns(small_cluster, load_small):
    small_cluster["hosts"]["mon-1"]["groups"] = ["monitoring", "dns"]
    return contexts(load_small())


@pytest.mark.parametrize(
    ("previous", "expected"),
    [
        (None, 2026112100),  # first serial of the day
        (2025010107, 2026112100),  # an older day: today's first
        (2026112100, 2026112101),  # the same day: the next one
        (2026112199, 2026112200),  # past 99 changes a day it still only grows
        (2030010100, 2030010101),  # a serial from the future (clock skew) is never undercut
    ],
)
def test_next_serial_always_grows(previous, expected):
    assert next_serial(previous, DAY) == expected


def test_zone_serial_changes_only_with_the_records(tmp_path):
    first = zone_serial(tmp_path, "example.test", "digest-a", lambda: DAY)
    later = DAY + datetime.timedelta(3)
    assert zone_serial(tmp_path, "example.test", "digest-a", lambda: later) == first
    second = zone_serial(tmp_path, "example.test", "digest-b", lambda: DAY)
    assert second == first + 1
    assert zone_serial(tmp_path, "other.test", "digest-b", lambda: DAY) == 2026112100


def test_the_date_is_read_only_for_a_new_serial(tmp_path):
    """The drift fast path keys a zone's host on its inputs while the clock cannot change the
    zone (toolkit/clock.py): the serial of unchanged records must not read the date."""
    with clock.watching() as new:
        zone_serial(tmp_path, "example.test", "digest-a")
    assert new.until is not None
    with clock.watching() as unchanged:
        zone_serial(tmp_path, "example.test", "digest-a")
    assert unchanged.until is None


def test_tsig_key_is_made_once_and_kept_private(tmp_path):
    secret = tsig_secret(tmp_path)
    assert len(base64.b64decode(secret)) == 32
    assert tsig_secret(tmp_path) == secret
    (path,) = (tmp_path / "dns").glob("*.secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "dns").stat().st_mode) == 0o700


def test_key_file_is_secret_and_only_in_the_key_file(two_dns):
    ctx = two_dns["dns-1"]
    secret = tsig_secret(ctx.loaded.state_dir)
    files = server_files(ctx)
    key = next(f for f in files if f.path == KEY_FILE)
    assert key.secret and key.mode == "0640" and key.group == "bind"
    assert secret in key.content and "algorithm hmac-sha256;" in key.content
    assert [f.path for f in host_files(ctx) if secret in f.content] == [KEY_FILE]


def test_primary_serves_zones_and_transfers_only_to_secondaries_with_the_key(two_dns):
    primary = files_of(two_dns["dns-1"].loaded, "dns-1")
    local = primary[LOCAL_FILE]
    assert local.count("type primary;") == 2  # small.test and 0.0.10.in-addr.arpa
    assert 'allow-transfer { !{ !secondaries; any; }; key "gpuinfra-transfer"; };' in local
    assert 'acl "secondaries" {\n\t10.0.0.51;\n};' in local
    assert "also-notify { 10.0.0.51; };" in local
    assert "/etc/bind/zones/db.small.test" in primary
    assert "/etc/bind/zones/db.0.0.10.in-addr.arpa" in primary


def test_secondary_copies_from_the_primary_and_writes_no_zone(two_dns):
    secondary = files_of(two_dns["mon-1"].loaded, "mon-1")
    local = secondary[LOCAL_FILE]
    assert local.count("type secondary;") == 2 and "type primary" not in local
    assert 'primaries { 10.0.0.41 key "gpuinfra-transfer"; };' in local
    assert 'file "/var/lib/bind/db.small.test";' in local
    assert not [path for path in secondary if path.startswith("/etc/bind/zones/")]


def test_recursion_only_for_cluster_networks_and_queries_for_admins_too(two_dns):
    options = files_of(two_dns["dns-1"].loaded, "dns-1")[OPTIONS_FILE]
    cluster_acl = options.split('acl "cluster" {')[1].split("};")[0].split()
    assert cluster_acl == ["10.0.0.0/24;", "10.128.0.0/12;", "10.96.0.0/16;"]
    assert 'acl "admin" {\n\t192.0.2.0/24;\n};' in options
    assert "allow-recursion { cluster; };" in options
    assert "allow-query { cluster; admin; localhost; };" in options
    assert "allow-transfer { none; };" in options
    assert "forwarders" not in options


def test_forwarders_are_configurable(small_cluster, load_small):
    small_cluster["group_vars"] = {"dns": {"dns": {"forwarders": ["192.0.2.53"]}}}
    options = files_of(load_small(), "dns-1")[OPTIONS_FILE]
    assert "forwarders {\n\t\t192.0.2.53;\n\t};" in options


def records(zone_text: str) -> set[tuple[str, str, str]]:
    """(name, type, value) of every record line of a rendered zone."""
    found = set()
    for line in zone_text.splitlines():
        if line and not line.startswith((";", "$", "\t", "@")):
            name, _, kind, value = line.split(None, 3)
            found.add((name, kind, value))
    return found


def test_zone_records_cover_hosts_api_srv_and_ptr():
    ctx = contexts(load(SAMPLE))["dns-1"]
    by_zone = {zone.name: render_zone(ctx, zone).content for zone in zones(ctx)}
    forward = records(by_zone["sample.gpu.internal"])
    for name, host in ctx.cluster.hosts.items():
        assert (name, "A", str(host.address)) in forward
    assert ("api", "A", "10.40.0.10") in forward
    srv = {(name, value) for name, kind, value in forward if kind == "SRV"}
    assert len(srv) == 10
    assert ("_etcd-client-ssl._tcp", "0 0 2379 etcd-3.sample.gpu.internal.") in srv
    assert (
        "@\tIN\tNS\tdns-1.sample.gpu.internal.\n@\tIN\tNS\tdns-2.sample.gpu.internal."
        in (by_zone["sample.gpu.internal"])
    )
    reverse = records(by_zone["10.40.10.in-addr.arpa"])
    assert ("11", "PTR", "gpu-1.sample.gpu.internal.") in reverse


def test_rendering_twice_is_identical_and_a_record_change_bumps_the_serial(
    small_cluster, write_cluster
):
    path = write_cluster(small_cluster)
    ctx = contexts(load(path))["dns-1"]
    forward = zones(ctx)[0]
    first = render_zone(ctx, forward)
    assert render_zone(ctx, forward) == first
    small_cluster["hosts"]["cpu-1"]["address"] = "10.0.0.72"
    path.write_text(path.read_text().replace("10.0.0.71", "10.0.0.72"))
    changed = contexts(load(path))["dns-1"]
    second = render_zone(changed, zones(changed)[0])
    assert second.serial == first.serial + 1
    assert f"\t\t{second.serial}\t; serial" in second.content


def test_every_host_resolves_through_the_dns_servers(two_dns):
    for ctx in two_dns.values():
        resolv = files_of(ctx.loaded, ctx.name)[RESOLV_CONF]
        lines = [line for line in resolv.splitlines() if not line.startswith("#")]
        assert lines == [
            "search small.test",
            "nameserver 10.0.0.41",
            "nameserver 10.0.0.51",
            "options timeout:2 attempts:2",
        ]


def test_no_dns_servers_leaves_the_resolver_alone(small_cluster, load_small):
    del small_cluster["hosts"]["dns-1"]
    ctx = contexts(load_small())["cpu-1"]
    assert client_files(ctx) == []


def test_config_files_are_checked_before_going_live(two_dns):
    checks = {f.path: f.check for f in server_files(two_dns["dns-1"])}
    assert checks[LOCAL_FILE] == "named-checkconf -z {path}"
    assert checks[OPTIONS_FILE] == "named-checkconf {path}"
    assert checks["/etc/bind/zones/db.small.test"] == "named-checkzone small.test {path}"


def test_secondary_writes_no_zone_file():
    yielded, noops = commands(
        primary_zone, {}, zone="small.test", content=None, dest="", check="", group="root"
    )
    assert yielded == [] and "transfer" in noops[0]


@pytest.mark.parametrize(
    ("served", "secondary", "expected"),
    [
        (2026112100, True, []),
        (2026112000, False, ["wait"]),  # the primary: reloaded, wait for the new serial
        (2026112000, True, ["rndc retransfer small.test", "wait"]),
        (2026112105, True, ["rndc retransfer small.test", "wait"]),  # a higher one: still ours
        (None, True, ["wait"]),  # not answering yet: a transfer may still be on its way
    ],
)
def test_zone_served_retransfers_on_a_secondary_and_waits(served, secondary, expected):
    yielded, _ = commands(
        zone_served, {ServedSerials: {} if served is None else {"small.test": served}},
        zone="small.test", serial=2026112100, secondary=secondary, zones=("small.test",),
    )  # fmt: skip
    assert [c if c.startswith("rndc") else "wait" for c in yielded] == expected
    if yielded:
        assert "grep -qx 2026112100" in yielded[-1]


def test_served_serials_fact_reads_each_zone_from_one_dig():
    fact = ServedSerials()
    command = fact.command(zones=("small.test", "0.18.198.in-addr.arpa"))
    assert command.count("dig ") == 1
    assert "small.test SOA 0.18.198.in-addr.arpa SOA" in command
    answer = [
        "small.test.\t300\tIN\tSOA\tdns-1.small.test. hostmaster.small.test. 2026112103 3600 "
        "600 1209600 300",
        "0.18.198.in-addr.arpa.\t300\tIN\tSOA\tdns-1.small.test. hostmaster.small.test. "
        "2026112101 3600 600 1209600 300",
    ]
    assert fact.process(answer) == {"small.test": 2026112103, "0.18.198.in-addr.arpa": 2026112101}
    # a zone the server does not answer is absent; so is everything when no server answers
    assert fact.process(answer[1:]) == {"0.18.198.in-addr.arpa": 2026112101}
    assert fact.process([";; communications error to 127.0.0.1#53: connection refused"]) == {}
    # pyinfra answers an empty output (dig not installed yet) with the default, not process()
    assert fact.default() == {}
