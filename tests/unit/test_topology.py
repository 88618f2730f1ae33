"""The topology derived from the sample: etcd, API, DNS records and firewall peer sets."""

from __future__ import annotations

from engine.context import load, topology_of
from tests.unit.conftest import SAMPLE


def sample_topology():
    return topology_of(load(SAMPLE))


def test_etcd_initial_cluster_and_endpoints():
    topology = sample_topology()
    assert topology.etcd_initial_cluster.split(",")[0] == "etcd-1=https://10.40.1.11:2380"
    assert len(topology.etcd_initial_cluster.split(",")) == 5
    assert topology.etcd_client_endpoints[-1] == "https://10.40.1.15:2379"


def test_api_goes_through_the_vip_to_every_control_plane_node():
    topology = sample_topology()
    assert topology.api_address == "10.40.0.10"
    assert topology.api_endpoint == "api.sample.gpu.internal:6443"
    assert [b.name for b in topology.api_backends] == [f"cp-{i}" for i in range(1, 6)]


def test_single_balancer_without_vip_serves_the_api(loaded):
    topology = topology_of(loaded)
    assert topology.api_address == "10.0.0.31"


def test_dns_records_cover_every_host_the_api_and_etcd_srv():
    loaded = load(SAMPLE)
    topology = topology_of(loaded)
    a_records = {r.name: r.value for r in topology.forward_records if r.type == "A"}
    assert set(loaded.cluster.hosts) <= set(a_records)
    assert a_records["api"] == "10.40.0.10"
    srv = [r for r in topology.forward_records if r.type == "SRV"]
    assert len(srv) == 10
    assert "0 0 2380 etcd-1.sample.gpu.internal." in {r.value for r in srv}
    ptr = [r for records in topology.reverse_zones.values() for r in records]
    assert len(ptr) == 28
    assert "1.40.10.in-addr.arpa" in topology.reverse_zones
    assert topology.dns_primary == "dns-1" and topology.dns_secondaries == ("dns-2",)


def test_etcd_ports_only_from_their_peers():
    topology = sample_topology()
    rules = {r.port: r for r in topology.rules_for(["etcd"])}
    assert set(rules[2380].sources) == {f"10.40.1.1{i}" for i in range(1, 6)}
    assert set(rules[2379].sources) == {f"10.40.1.1{i}" for i in range(1, 6)} | {
        f"10.40.2.1{i}" for i in range(1, 6)
    }
    workers = {r.port for r in topology.rules_for(["gpu_worker"])}
    assert 2379 not in workers and 2380 not in workers
    assert 10250 in workers


def test_ssh_from_admin_and_node_networks_everywhere():
    topology = sample_topology()
    ssh = next(r for r in topology.rules_for(["cpu_worker"]) if r.port == 22)
    assert ssh.sources == ("10.10.0.0/24", "10.40.0.0/16")


def test_etcd_member_name_override(small_cluster, load_small):
    small_cluster["hosts"]["etcd-1"]["etcd"] = {"member_name": "etcd1"}
    topology = topology_of(load_small())
    assert topology.etcd_initial_cluster.startswith("etcd1=https://10.0.0.11:2380,")
