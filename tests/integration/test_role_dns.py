"""The dns role on the lab: dns-1 is the primary, mon-1 the secondary (default lab topology).
Every host resolves hosts, the API and etcd's SRV records through them; transfers need the
secondary's address and the TSIG key; recursion is refused outside the cluster networks; a hand
edit of a zone file is drift; a record change reaches the secondary with a higher serial."""

from __future__ import annotations

import json

import pytest
import yaml

from cli.exitcodes import ExitCode
from tests.integration.roles_helpers import apply_roles, gpuinfra, pending

pytestmark = pytest.mark.integration
ROLES = "base,firewall,dns"
PRIMARY, SECONDARY = "dns-1", "mon-1"
KEY = "/etc/bind/gpuinfra-transfer.key"


def dig(lab, host: str, query: str) -> str:
    return lab.ssh(host, f"dig +short +time=3 +tries=2 {query}").stdout.strip()


def soa_serial(lab, host: str, server: str, zone: str) -> int:
    return int(dig(lab, host, f"@{server} SOA {zone}").split()[2])


def test_plan_after_apply_has_no_changes(converged):
    result = gpuinfra("plan", str(converged.inventory_path), "--roles", ROLES, "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    assert pending(json.loads(result.stdout)) == {}


def test_every_host_resolves_every_host_through_the_cluster_dns(converged):
    lab = converged
    domain = lab.loaded.cluster.domain
    names = " ".join(f"{name}.{domain}" for name in lab.hosts)
    expected = [lab.address(name) for name in lab.hosts]
    for host in lab.hosts:
        # No @server: dig reads /etc/resolv.conf, which the role points at dns-1 and mon-1.
        answers = dig(lab, host, " ".join(f"{n} A" for n in names.split())).split()
        assert answers == expected, host
        ptr = dig(lab, host, f"-x {lab.address('cpu-1')}")
        assert ptr == f"cpu-1.{domain}.", host


def test_api_and_etcd_srv_records(converged):
    lab = converged
    domain = lab.loaded.cluster.domain
    assert dig(lab, "cpu-1", f"api.{domain}") == lab.address("lb-1")
    for service, port in (("_etcd-server-ssl._tcp", 2380), ("_etcd-client-ssl._tcp", 2379)):
        targets = sorted(dig(lab, "cp-1", f"SRV {service}.{domain}").splitlines())
        assert targets == [f"0 0 {port} etcd-{i}.{domain}." for i in range(1, 6)]


def test_secondary_holds_the_primary_serial_and_answers_alone(converged):
    lab = converged
    domain = lab.loaded.cluster.domain
    primary, secondary = lab.address(PRIMARY), lab.address(SECONDARY)
    assert soa_serial(lab, "cpu-1", primary, domain) == soa_serial(lab, "cpu-1", secondary, domain)
    lab.ssh(PRIMARY, "systemctl stop named")
    try:
        assert dig(lab, "cpu-1", f"@{secondary} etcd-3.{domain}") == lab.address("etcd-3")
        # The resolver fails over: the primary is listed first, and it is down (dig says so on
        # lines of its own before the answer).
        answer = dig(lab, "gpu-1", f"etcd-3.{domain}").splitlines()
        assert answer[-1] == lab.address("etcd-3")
        assert "connection refused" in answer[0]
    finally:
        lab.ssh(PRIMARY, "systemctl start named")


def test_zone_transfer_needs_a_secondary_and_the_key(converged):
    lab = converged
    domain, primary = lab.loaded.cluster.domain, lab.address(PRIMARY)
    transfer = f"dig +time=3 +tries=1 @{primary} AXFR {domain}"
    assert "Transfer failed" in lab.ssh("cpu-1", transfer).stdout  # not a secondary, no key
    assert "Transfer failed" in lab.ssh(SECONDARY, transfer).stdout  # a secondary, no key
    assert "Transfer failed" in lab.ssh(PRIMARY, f"{transfer} -k {KEY}").stdout  # key, wrong host
    signed = lab.ssh(SECONDARY, f"{transfer} -k {KEY}").stdout
    assert f"etcd-1.{domain}." in signed and "XFR size" in signed


def test_recursion_is_refused_outside_the_cluster_networks(converged):
    """The lab's hosts and the controller all sit in the node network, so a query from outside
    the cluster networks is made on the server itself from 127.0.0.1: loopback is allowed to
    query (allow-query has localhost) but is in none of node/pod/service, so it must not
    recurse: REFUSED. The same name asked from a cluster address is recursed (the lab has no
    route to the root servers, so SERVFAIL, but not REFUSED)."""
    lab = converged
    outside = lab.ssh(PRIMARY, "dig -b 127.0.0.1 @127.0.0.1 +time=3 +tries=1 example.org A")
    assert "status: REFUSED" in outside.stdout
    primary = lab.address(PRIMARY)
    inside = lab.ssh("cpu-1", f"dig @{primary} +time=10 +tries=1 example.org A", check=False)
    assert "status: REFUSED" not in inside.stdout
    assert "status:" in inside.stdout, inside.stdout  # an answer came (SERVFAIL or NOERROR)
    # The cluster's own zone is answered to loopback: refusal is for recursion only.
    own = f"-b 127.0.0.1 @127.0.0.1 dns-1.{lab.loaded.cluster.domain}"
    assert dig(lab, PRIMARY, own) == primary


def test_drift_reports_a_hand_edited_zone_and_apply_restores_it(converged, tmp_path):
    lab = converged
    zone_file = f"/etc/bind/zones/db.{lab.loaded.cluster.domain}"
    lab.ssh(PRIMARY, f"echo 'rogue IN A 10.9.9.9' >> {zone_file}")
    report_path = tmp_path / "drift.json"
    result = gpuinfra("drift", str(lab.inventory_path), "--roles", ROLES,
                      "--report", str(report_path))  # fmt: skip
    assert result.returncode == ExitCode.DRIFT, result.stdout[-3000:]
    report = json.loads(report_path.read_text())
    changes = pending(report)
    assert list(changes) == [PRIMARY]
    assert f"DNS server | Write zone {lab.loaded.cluster.domain}" in changes[PRIMARY]
    diffs = [op["diff"] or "" for op in report["hosts"][PRIMARY]["operations"] if op["changed"]]
    assert any("-rogue IN A 10.9.9.9" in diff for diff in diffs)

    apply_roles(lab.inventory_path, "dns", "--limit", PRIMARY)
    assert "rogue" not in lab.ssh(PRIMARY, f"cat {zone_file}").stdout


def test_a_record_change_reaches_the_secondary_with_a_higher_serial(converged):
    """A second inventory beside the lab's (same state directory, so the same key and serial
    history) with another TTL: the zone changes, its serial grows, the secondary follows."""
    lab = converged
    domain = lab.loaded.cluster.domain
    before = soa_serial(lab, "cpu-1", lab.address(SECONDARY), domain)
    data = yaml.safe_load(lab.inventory_path.read_text())
    data.setdefault("group_vars", {}).setdefault("dns", {})["dns"] = {"ttl": 600}
    changed = lab.inventory_path.with_name("cluster-ttl.yml")
    changed.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        apply_roles(changed, "dns", "--limit", "dns")
        after = soa_serial(lab, "cpu-1", lab.address(SECONDARY), domain)
        assert after > before
        answer = lab.ssh("cpu-1", f"dig +noall +answer @{lab.address(SECONDARY)} cp-1.{domain}")
        assert answer.stdout.split()[1:] == ["600", "IN", "A", lab.address("cp-1")]
    finally:
        apply_roles(lab.inventory_path, "dns", "--limit", "dns")
    assert soa_serial(lab, "cpu-1", lab.address(SECONDARY), domain) > after
