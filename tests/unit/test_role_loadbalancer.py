"""The loadbalancer role offline: haproxy.cfg and keepalived rendered from inventories."""

from __future__ import annotations

import functools

import pytest

from engine.context import load
from inventory.errors import InventoryInvalid
from roles.loadbalancer.files import (
    HAPROXY_CONFIG,
    KEEPALIVED_CHECK,
    KEEPALIVED_CONFIG,
    uses_keepalived,
)
from tests.helpers import files_of as shared_files_of
from tests.unit.conftest import SAMPLE

files_of = functools.partial(shared_files_of, contents=False)  # their checks are tested too


def two_balancers(small_cluster: dict) -> dict:
    small_cluster["hosts"]["lb-2"] = {"address": "10.0.0.32", "groups": ["loadbalancer"]}
    small_cluster["api"] = {"vip": "10.0.0.5"}
    return small_cluster


def test_haproxy_balances_every_control_plane_node_with_checks():
    loaded = load(SAMPLE)
    config = files_of(loaded, "lb-1")[HAPROXY_CONFIG]
    text = config.content
    assert config.check == "haproxy -c -q -f {path}"
    assert "    bind :6443\n" in text
    assert "    http-check send meth GET uri /readyz\n" in text  # the default
    assert "    default-server check check-ssl verify none inter 2s fall 3 rise 2\n" in text
    for name in loaded.cluster.in_group("control_plane"):
        address = loaded.cluster.hosts[name].address
        assert f"    server {name} {address}:6443\n" in text
    assert text.count("    server ") == len(loaded.cluster.in_group("control_plane"))


def test_haproxy_exposes_the_admin_socket_and_prometheus_metrics():
    text = files_of(load(SAMPLE), "lb-1")[HAPROXY_CONFIG].content
    assert "stats socket /run/haproxy/admin.sock mode 660 level admin" in text
    assert "    bind :8404\n" in text
    assert "http-request use-service prometheus-exporter if { path /metrics }" in text


def test_haproxy_only_on_balancers():
    loaded = load(SAMPLE)
    assert HAPROXY_CONFIG not in files_of(loaded, "cp-1")
    assert KEEPALIVED_CONFIG not in files_of(loaded, "mon-1")


def test_readyz_health_check_is_an_https_probe(small_cluster, load_small):
    small_cluster["group_vars"] = {"loadbalancer": {"loadbalancer": {"health_check": "readyz"}}}
    text = files_of(load_small(), "lb-1")[HAPROXY_CONFIG].content
    assert "http-check send meth GET uri /readyz" in text
    assert "default-server check check-ssl verify none inter 2s fall 3 rise 2" in text
    assert "tcp-check" not in text
    # The control: "tcp" still renders the connect check.
    small_cluster["group_vars"] = {"loadbalancer": {"loadbalancer": {"health_check": "tcp"}}}
    text = files_of(load_small(), "lb-1")[HAPROXY_CONFIG].content
    assert "    option tcp-check\n" in text and "/readyz" not in text


def test_one_balancer_has_no_keepalived(loaded):
    assert not uses_keepalived(loaded.cluster)
    files = files_of(loaded, "lb-1")
    assert KEEPALIVED_CONFIG not in files
    assert KEEPALIVED_CHECK not in files


def test_two_balancers_share_the_vip_by_priority(small_cluster, write_cluster):
    loaded = load(write_cluster(two_balancers(small_cluster)))
    first = files_of(loaded, "lb-1")[KEEPALIVED_CONFIG]
    second = files_of(loaded, "lb-2")[KEEPALIVED_CONFIG]
    assert first.check == "keepalived --config-test --use-file {path}"
    assert first.secret and first.mode == "0640"
    assert "priority 150\n" in first.content
    assert "priority 140\n" in second.content
    assert "unicast_src_ip 10.0.0.31\n" in first.content
    assert "unicast_peer {\n        10.0.0.32\n    }" in first.content
    assert "unicast_peer {\n        10.0.0.31\n    }" in second.content
    assert "10.0.0.5/24 dev eth0\n" in first.content
    assert "track_script {\n        check_haproxy\n    }" in first.content

    def shared(text: str) -> list[str]:
        return [
            line
            for line in text.splitlines()
            if line.strip().split(" ")[0] in ("virtual_router_id", "auth_pass", "advert_int")
        ]

    assert shared(first.content) == shared(second.content)
    assert len(shared(first.content)) == 3


def test_track_script_probes_the_api_port(small_cluster, write_cluster):
    loaded = load(write_cluster(two_balancers(small_cluster)))
    script = files_of(loaded, "lb-1")[KEEPALIVED_CHECK]
    assert script.mode == "0755"
    assert script.content.startswith("#!/bin/bash\n")
    assert "/dev/tcp/127.0.0.1/6443" in script.content


def test_vrrp_settings_from_the_inventory(small_cluster, load_small):
    small_cluster = two_balancers(small_cluster)
    small_cluster["group_vars"] = {
        "loadbalancer": {
            "loadbalancer": {
                "vrrp_interface": "bond0",
                "virtual_router_id": 77,
                "vrrp_password": "s3cret",
            }
        }
    }
    text = files_of(load_small(), "lb-2")[KEEPALIVED_CONFIG].content
    assert "interface bond0\n" in text
    assert "virtual_router_id 77\n" in text
    assert "auth_pass s3cret\n" in text
    assert "10.0.0.5/24 dev bond0\n" in text


@pytest.mark.parametrize(
    ("setting", "value"),
    [("check_fall", 0), ("health_check", "http"), ("vrrp_password", "longer-than-8")],
)
def test_invalid_settings_name_the_key(small_cluster, load_small, setting, value):
    small_cluster["group_vars"] = {"loadbalancer": {"loadbalancer": {setting: value}}}
    with pytest.raises(InventoryInvalid) as excinfo:
        load_small()
    assert [e.key for e in excinfo.value.errors] == [
        f"group_vars.loadbalancer.loadbalancer.{setting}"
    ]
