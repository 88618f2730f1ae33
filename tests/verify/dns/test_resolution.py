"""Name resolution seen from every host: its resolver names the cluster's DNS servers, and each
of them answers every host's A and PTR record, the API name and etcd's SRV records."""

from __future__ import annotations

import pytest

from inventory.topology import ETCD_CLIENT_PORT, ETCD_PEER_PORT
from roles.dns.files import MAX_NAMESERVERS

# Every host resolves through the cluster DNS (the dns role's client phase targets all hosts).
TARGET_GROUPS = None


def dns_servers(topology) -> list[str]:
    return [name for name in (topology.dns_primary, *topology.dns_secondaries) if name]


def dig(host, server: str, query: str) -> list[str]:
    output = host.check_output(f"dig +short +time=3 +tries=2 @{server} {query}")
    return [line for line in output.splitlines() if not line.startswith(";")]


def test_resolver_uses_the_cluster_servers(host, cluster, topology) -> None:
    resolv = host.file("/etc/resolv.conf").content_string.splitlines()
    servers = [line.split()[1] for line in resolv if line.startswith("nameserver ")]
    expected = [str(cluster.cluster.hosts[n].address) for n in dns_servers(topology)]
    assert servers == expected[:MAX_NAMESERVERS]
    assert f"search {cluster.cluster.domain}" in resolv


@pytest.mark.parametrize("record", ["A", "PTR"])
def test_every_server_answers_every_host(host, cluster, topology, record: str) -> None:
    wrong = {}
    for server in dns_servers(topology):
        address = str(cluster.cluster.hosts[server].address)
        for name, entry in cluster.cluster.hosts.items():
            fqdn = cluster.cluster.fqdn(name)
            if record == "A":
                query, expected = f"{fqdn} A", [str(entry.address)]
            else:
                query, expected = f"-x {entry.address}", [f"{fqdn}."]
            answer = dig(host, address, query)
            if answer != expected:
                wrong[f"{server}: {query}"] = answer
    assert not wrong, f"wrong answers: {wrong}"


def test_api_name_resolves_to_the_api_address(host, cluster, topology) -> None:
    answer = host.check_output(f"dig +short +time=3 +tries=2 api.{cluster.cluster.domain}")
    assert answer.splitlines()[-1:] == [topology.api_address]


@pytest.mark.parametrize(
    ("service", "port"),
    [("_etcd-server-ssl._tcp", ETCD_PEER_PORT), ("_etcd-client-ssl._tcp", ETCD_CLIENT_PORT)],
)
def test_etcd_srv_records_list_every_member(host, cluster, service: str, port: int) -> None:
    domain = cluster.cluster.domain
    answer = host.check_output(f"dig +short +time=3 +tries=2 SRV {service}.{domain}")
    targets = sorted(line for line in answer.splitlines() if not line.startswith(";"))
    members = cluster.cluster.in_group("etcd")
    assert targets == sorted(f"0 0 {port} {cluster.cluster.fqdn(m)}." for m in members)


def test_zone_transfer_without_the_key_is_refused(host, cluster, topology) -> None:
    """No host, secondaries included, gets the zone without the TSIG key."""
    if topology.dns_primary is None:
        pytest.skip("the cluster has no DNS server")
    primary = str(cluster.cluster.hosts[topology.dns_primary].address)
    output = host.check_output(
        f"dig +time=3 +tries=1 @{primary} AXFR {cluster.cluster.domain} || true"
    )
    assert "Transfer failed" in output
    assert "\tIN\tA\t" not in output  # not a single record leaked
