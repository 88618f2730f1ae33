"""HAProxy on each load balancer: running, listening, its live config valid, every API server a
backend it checks."""

from __future__ import annotations

from inventory.topology import HAPROXY_STATS_PORT

SOCKET = "/run/haproxy/admin.sock"


def test_haproxy_is_running_and_enabled(host):
    service = host.service("haproxy")
    assert service.is_running
    assert service.is_enabled


def test_haproxy_listens_on_the_api_port(host, ctx):
    assert host.socket(f"tcp://0.0.0.0:{ctx.cluster.api.port}").is_listening


def test_haproxy_listens_on_the_stats_port(host):
    assert host.socket(f"tcp://0.0.0.0:{HAPROXY_STATS_PORT}").is_listening


def test_live_config_passes_haproxy_check(host):
    result = host.run("haproxy -c -f /etc/haproxy/haproxy.cfg")
    assert result.rc == 0, result.stderr


def test_every_control_plane_node_is_a_checked_backend(host, ctx):
    out = host.check_output(f'echo "show stat" | socat stdio {SOCKET}')
    header = out.splitlines()[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","), strict=False)) for line in out.splitlines()[1:]]
    servers = {
        row["svname"]: row
        for row in rows
        if row.get("pxname") == "kube-apiserver" and row["svname"] not in ("BACKEND", "FRONTEND")
    }
    expected = {backend.name for backend in ctx.topology.api_backends}
    assert set(servers) == expected
    # A server without a health check reports "no check": it would never leave rotation.
    unchecked = [name for name, row in servers.items() if row["status"] == "no check"]
    assert unchecked == []


def test_prometheus_metrics_are_served(host):
    out = host.check_output(f"curl -fsS http://127.0.0.1:{HAPROXY_STATS_PORT}/metrics")
    assert "haproxy_process_" in out
