"""Grafana dashboards as JSON models: node overview, etcd and GPU health, for operators who run
Grafana. Each reads a Prometheus data source picked from a dashboard variable on import."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inventory.model import Cluster

SCHEMA_VERSION = 39  # Grafana 10/11 dashboard JSON
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_WIDTH, PANEL_HEIGHT = 12, 8


def _panel(
    index: int, title: str, exprs: dict[str, str], unit: str = "short", kind: str = "timeseries"
) -> dict[str, Any]:
    """One panel, two per row; exprs maps a legend format to its PromQL."""
    return {
        "id": index + 1,
        "type": kind,
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {
            "x": (index % 2) * PANEL_WIDTH,
            "y": (index // 2) * PANEL_HEIGHT,
            "w": PANEL_WIDTH,
            "h": PANEL_HEIGHT,
        },
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend}
            for n, (legend, expr) in enumerate(exprs.items())
        ],
    }


def _dashboard(
    cluster: Cluster, uid: str, title: str, panels: list[tuple], host_query: str
) -> dict[str, Any]:
    return {
        "uid": f"{cluster.name}-{uid}"[:40],
        "title": f"{cluster.name}: {title}",
        "tags": ["gpuinfra", cluster.name],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "host",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": host_query,
                    "includeAll": True,
                    "multi": True,
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "panels": [_panel(index, *spec) for index, spec in enumerate(panels)],
    }


def node_overview(cluster: Cluster) -> dict[str, Any]:
    host = 'host=~"$host"'
    return _dashboard(
        cluster,
        "nodes",
        "Node overview",
        [
            ("Up", {"{{host}}": f'up{{job="node",{host}}}'}),
            (
                "CPU busy",
                {
                    "{{host}}": f'1 - avg by (host) (rate(node_cpu_seconds_total{{mode="idle",'
                    f"{host}}}[5m]))"
                },
                "percentunit",
            ),
            (
                "Memory used",
                {
                    "{{host}}": f"1 - node_memory_MemAvailable_bytes{{{host}}} "
                    f"/ node_memory_MemTotal_bytes{{{host}}}"
                },
                "percentunit",
            ),
            (
                "Root filesystem used",
                {
                    "{{host}}": f'1 - node_filesystem_avail_bytes{{mountpoint="/",{host}}} '
                    f'/ node_filesystem_size_bytes{{mountpoint="/",{host}}}'
                },
                "percentunit",
            ),
            (
                "Network received",
                {
                    "{{host}} {{device}}": "rate(node_network_receive_bytes_total"
                    f'{{{host},device!="lo"}}[5m])'
                },
                "Bps",
            ),
            ("Load (1 min)", {"{{host}}": f"node_load1{{{host}}}"}),
            (
                "Failed units",
                {"{{host}} {{name}}": f'node_systemd_unit_state{{state="failed",{host}}} == 1'},
            ),
        ],
        'label_values(up{job="node"}, host)',
    )


def etcd(cluster: Cluster) -> dict[str, Any]:
    host = 'host=~"$host"'
    return _dashboard(
        cluster,
        "etcd",
        "etcd",
        [
            ("Has leader", {"{{host}}": f"etcd_server_has_leader{{{host}}}"}),
            (
                "Leader changes (1 h)",
                {"{{host}}": f"increase(etcd_server_leader_changes_seen_total{{{host}}}[1h])"},
            ),
            (
                "WAL fsync p99 (limit 10 ms)",
                {
                    "{{host}}": "histogram_quantile(0.99, sum by (host, le) "
                    f"(rate(etcd_disk_wal_fsync_duration_seconds_bucket{{{host}}}[5m])))"
                },
                "s",
            ),
            (
                "Backend commit p99",
                {
                    "{{host}}": "histogram_quantile(0.99, sum by (host, le) "
                    f"(rate(etcd_disk_backend_commit_duration_seconds_bucket{{{host}}}[5m])))"
                },
                "s",
            ),
            (
                "Database size / quota",
                {
                    "{{host}}": f"etcd_mvcc_db_total_size_in_bytes{{{host}}} "
                    f"/ etcd_server_quota_backend_bytes{{{host}}}"
                },
                "percentunit",
            ),
            (
                "Failed proposals",
                {"{{host}}": f"rate(etcd_server_proposals_failed_total{{{host}}}[5m])"},
            ),
        ],
        'label_values(up{job="etcd"}, host)',
    )


def gpu_health(cluster: Cluster) -> dict[str, Any]:
    host = 'host=~"$host"'
    return _dashboard(
        cluster,
        "gpu-health",
        "GPU health",
        [
            (
                "Node verdict (0 ok, 1 degraded, 2 failed, -1 nothing checked)",
                {"{{host}}": f"gpuinfra_gpu_health_verdict{{{host}}}"},
            ),
            (
                "Checks not ok",
                {
                    "{{host}} {{check}} gpu {{gpu}}": "gpuinfra_gpu_health_check_verdict"
                    f"{{{host}}} > 0"
                },
            ),
            (
                "Since the last check run",
                {"{{host}}": f"time() - gpuinfra_gpu_health_last_run_timestamp_seconds{{{host}}}"},
                "s",
            ),
            (
                "Check duration",
                {"{{host}}": f"gpuinfra_gpu_health_duration_seconds{{{host}}}"},
                "s",
            ),
            (
                "Measured values",
                {
                    "{{host}} {{check}} gpu {{gpu}} ({{unit}})": "gpuinfra_gpu_health_check_value"
                    f"{{{host}}}"
                },
            ),
            ("DCGM exporter up", {"{{host}}": f'up{{job="dcgm",{host}}}'}),
        ],
        'label_values(up{job="node",group=~".*gpu_worker.*"}, host)',
    )


DASHBOARDS: dict[str, Callable[[Cluster], dict[str, Any]]] = {
    "node-overview": node_overview,
    "etcd": etcd,
    "gpu-health": gpu_health,
}
