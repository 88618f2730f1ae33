"""The firewall role offline: peer sets from the topology, the rendered table, its loading
decisions, validation of its settings."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest

from engine.context import host_contexts, load, topology_of
from inventory.errors import InventoryInvalid
from inventory.topology import collapse_sources
from roles.firewall.facts import NOTHING, LoadedTable
from roles.firewall.files import NFTABLES_CONF, TABLE_FILE, host_rules, managed_files
from roles.firewall.operations import content_digest, table_loaded
from tests.unit.conftest import SAMPLE
from tests.unit.fake_host import commands


def contexts(loaded):
    return {ctx.name: ctx for ctx in host_contexts(loaded)}


def table(ctx) -> str:
    return next(f.content for f in managed_files(ctx) if f.path == TABLE_FILE)


def test_collapse_sources_drops_covered_entries_and_keeps_neighbours():
    assert collapse_sources(["10.0.0.0/24", "10.0.0.7", "192.0.2.1/32", "10.0.0.0/24"]) == (
        "10.0.0.0/24",
        "192.0.2.1",
    )
    assert collapse_sources(["10.0.0.12", "10.0.0.11"]) == ("10.0.0.11", "10.0.0.12")


def test_dns_and_api_admit_pods_and_admins():
    topology = topology_of(load(SAMPLE))
    dns = [r for r in topology.rules_for(["dns"]) if r.port == 53]
    assert {r.protocol for r in dns} == {"tcp", "udp"}
    assert all(r.sources == ("10.10.0.0/24", "10.40.0.0/16", "10.128.0.0/12") for r in dns)
    api = next(r for r in topology.rules_for(["control_plane"]) if r.port == 6443)
    assert "10.128.0.0/12" in api.sources


def test_vrrp_only_between_two_balancers(loaded):
    sample = topology_of(load(SAMPLE))
    vrrp = [r for r in sample.rules_for(["loadbalancer"]) if r.protocol == "vrrp"]
    assert len(vrrp) == 1 and vrrp[0].port is None
    assert vrrp[0].sources == ("10.40.3.11", "10.40.3.12")
    single = topology_of(loaded)
    assert not [r for r in single.rules_for(["loadbalancer"]) if r.protocol == "vrrp"]


def test_exporters_and_kubelet_from_monitoring():
    topology = topology_of(load(SAMPLE))
    gpu = {r.port: r.sources for r in topology.rules_for(["gpu_worker"])}
    assert gpu[9400] == ("10.40.3.31",)  # DCGM exporter
    assert gpu[9100] == ("10.40.3.31",)
    assert "10.40.3.31" in gpu[10250] and "10.40.2.11" in gpu[10250]


def test_table_replaces_only_its_own_table_and_drops_by_default():
    ctx = host_contexts(load(SAMPLE))[0]
    text = table(ctx)
    statements = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert statements[:2] == ["table inet gpuinfra {}", "delete table inet gpuinfra"]
    assert "policy drop;" in text
    for managed in managed_files(ctx):
        code = [line for line in managed.content.splitlines() if not line.startswith("#")]
        assert not [line for line in code if "flush" in line], managed.path
    conf = next(f for f in managed_files(ctx) if f.path == NFTABLES_CONF)
    assert f'include "{TABLE_FILE}"' in conf.content
    assert conf.check == "nft -c -f {path}"


def test_etcd_ports_reach_only_etcd_hosts():
    by_name = contexts(load(SAMPLE))
    etcd = table(by_name["etcd-1"])
    assert "tcp dport 2380 accept" in etcd
    peer_line = next(line for line in etcd.splitlines() if "dport 2380" in line)
    assert "10.40.1.11, 10.40.1.12" in peer_line and "10.40.2." not in peer_line
    for worker in ("gpu-1", "cpu-1"):
        text = table(by_name[worker])
        assert "dport 2379" not in text and "dport 2380" not in text


def test_extra_rules_per_group_and_host(small_cluster, load_small):
    small_cluster["group_vars"] = {
        "cpu_worker": {"firewall": {"extra_rules": [{"port": 30080, "sources": ["0.0.0.0/0"]}]}}
    }
    small_cluster["hosts"]["gpu-1"]["vars"] = {
        "firewall": {
            "extra_rules": [
                {"port": 8472, "protocol": "udp", "sources": ["10.0.0.0/24"],
                 "description": "VXLAN"}
            ]
        }
    }  # fmt: skip
    by_name = contexts(load_small())
    assert 'ip saddr 0.0.0.0/0 tcp dport 30080 accept comment "extra rule' in table(
        by_name["cpu-1"]
    )
    assert 'ip saddr 10.0.0.0/24 udp dport 8472 accept comment "VXLAN"' in table(by_name["gpu-1"])
    assert "30080" not in table(by_name["gpu-1"])
    assert [r.port for r in host_rules(by_name["gpu-1"]) if r.port == 8472] == [8472]


def test_disabled_firewall_keeps_the_rules_but_accepts(small_cluster, load_small):
    small_cluster["group_vars"] = {"all": {"firewall": {"enabled": False}}}
    ctx = contexts(load_small())["etcd-1"]
    text = table(ctx)
    assert "policy accept;" in text and "tcp dport 2380 accept" in text


def test_no_admin_networks_with_the_firewall_enabled_is_refused(small_cluster, load_small):
    del small_cluster["networks"]["admin"]
    with pytest.raises(InventoryInvalid) as caught:
        load_small()
    keys = [error.key for error in caught.value.errors]
    assert keys == ["networks.admin"]
    assert "firewall" in str(caught.value)
    small_cluster["group_vars"] = {"all": {"firewall": {"enabled": False}}}
    load_small()  # explicitly off: accepted


def test_unknown_extra_rule_key_is_named(small_cluster, load_small):
    small_cluster["group_vars"] = {
        "etcd": {"firewall": {"extra_rules": [{"port": 1, "sources": ["10.0.0.1"], "prot": 1}]}}
    }
    with pytest.raises(InventoryInvalid) as caught:
        load_small()
    assert [e.key for e in caught.value.errors] == ["group_vars.etcd.firewall.extra_rules.0.prot"]


CONTENT = "table inet gpuinfra {}\n"
LOADED = {"live": "aaa", "file": content_digest(CONTENT), "listing": "aaa"}


@pytest.mark.parametrize(
    ("state", "loads"),
    [
        (LOADED, False),
        ({**LOADED, "live": "bbb"}, True),  # a rule added with `nft add rule`
        ({**LOADED, "file": "old"}, True),  # the file changed since the last load
        ({**LOADED, "live": None}, True),  # no table in the kernel (never loaded, flushed)
        (LoadedTable.default(), True),  # a fresh host
    ],
)
def test_table_is_loaded_when_the_kernel_or_the_file_differs(state, loads):
    yielded, noops = commands(table_loaded, {LoadedTable: state}, path=TABLE_FILE, content=CONTENT)
    assert bool(yielded) is loads and bool(noops) is not loads
    if loads:
        assert any(f"nft -f {TABLE_FILE}" in c for c in yielded)
        assert any(content_digest(CONTENT) in c for c in yielded)


def test_loaded_table_fact_reads_live_and_recorded_digests():
    fact = LoadedTable()
    assert fact.process(["live abc", "file def", "listing abc"]) == {
        "live": "abc",
        "file": "def",
        "listing": "abc",
    }
    assert fact.process(["file def"])["live"] is None
    # nft lists nothing when the kernel has no such table: sha256sum's digest of no bytes
    assert fact.process([f"live {NOTHING}  -", "file def"])["live"] is None


@pytest.mark.skipif(
    shutil.which("nft") is None or os.geteuid() != 0, reason="needs nft and root (kernel check)"
)
def test_rendered_tables_pass_nft_check(tmp_path):
    """`nft -c` asks the kernel to build the transaction and commits nothing."""
    for ctx in host_contexts(load(SAMPLE))[:12]:
        path = tmp_path / f"{ctx.name}.nft"
        path.write_text(table(ctx))
        result = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, f"{ctx.name}: {result.stderr}"


def test_loaded_table_fact_and_load_record_agree_with_this_machines_sh(tmp_path):
    """The fact's command and the load command run by this machine's sh, with a stand-in for
    `nft` (a script that prints a fixed listing: the kernel's table cannot be changed by a unit
    test; the firewall lab tests run the real one): right after a load the live digest is the
    recorded listing's, both the digest of the listing's bytes, and a rule added afterwards
    makes them differ. Before the first load the stand-in lists nothing, as nft does for a
    table the kernel does not have."""
    listing = 'table inet gpuinfra {\n\tchain input {\n\t\tiifname "lo" accept\n\t}\n}\n'
    bin_dir, record = tmp_path / "bin", tmp_path / "firewall.loaded"
    bin_dir.mkdir()
    nft = bin_dir / "nft"
    nft.write_text(
        f'#!/bin/sh\n[ "$1" = -f ] && cp {tmp_path / "file"} {tmp_path / "listing"} && exit 0\n'
        f"cat {tmp_path / 'listing'} 2>/dev/null\n"
    )
    nft.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(command: str) -> list[str]:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    fact = LoadedTable()
    (tmp_path / "file").write_text(listing)
    assert fact.process(run(fact.command(record=str(record)))) == LoadedTable.default()
    yielded, _ = commands(table_loaded, {LoadedTable: LoadedTable.default()}, path=TABLE_FILE,
                          content=CONTENT, record=str(record))  # fmt: skip
    for command in yielded:
        run(command)
    state = fact.process(run(fact.command(record=str(record))))
    digest = hashlib.sha256(listing.encode()).hexdigest()
    assert state == {"live": digest, "file": content_digest(CONTENT), "listing": digest}
    (tmp_path / "listing").write_text(listing.replace('"lo" accept', '"lo" accept\n\t\tdrop'))
    changed = fact.process(run(fact.command(record=str(record))))
    assert changed["live"] != changed["listing"] == digest
