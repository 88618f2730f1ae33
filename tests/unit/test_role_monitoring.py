"""The monitoring role offline: node exporter arguments, Prometheus configuration and rules,
Grafana dashboards, all parsed back from what is rendered."""

from __future__ import annotations

import functools
import json
import shlex

import pytest
import yaml

from engine.context import cluster_files, host_contexts, load
from inventory.errors import InventoryInvalid
from roles.monitoring.files import (
    ALERT_RULES,
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_DEFAULTS,
    NODE_EXPORTER_DEFAULTS,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DEFAULTS,
    prometheus_files,
)
from roles.monitoring.targets import scrape_jobs
from tests.helpers import files_of as shared_files_of
from tests.unit.conftest import SAMPLE


def context(loaded, host: str):
    return next(c for c in host_contexts(loaded) if c.name == host)


files_of = functools.partial(shared_files_of, contents=False)


def arguments(text: str) -> list[str]:
    """The ARGS="..." line of a /etc/default file, split the way systemd splits $ARGS."""
    line = next(line for line in text.splitlines() if line.startswith("ARGS="))
    return shlex.split(line.removeprefix("ARGS="))[0].split()


def prometheus_config(loaded) -> dict:
    return yaml.safe_load(files_of(loaded, "mon-1")[PROMETHEUS_CONFIG].content)


def alert_rules(loaded) -> dict[str, dict]:
    rules = yaml.safe_load(files_of(loaded, "mon-1")[ALERT_RULES].content)
    return {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}


def test_node_exporter_on_every_host():
    loaded = load(SAMPLE)
    for name in loaded.cluster.hosts:
        args = arguments(files_of(loaded, name)[NODE_EXPORTER_DEFAULTS].content)
        assert "--web.listen-address=:9100" in args
        assert "--no-collector.zfs" in args
        assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in args


def test_textfile_directory_follows_gpu_health(small_cluster, load_small):
    small_cluster["group_vars"] = {
        "gpu_worker": {"gpu_health": {"textfile_dir": "/srv/node-exporter/textfile"}}
    }
    loaded = load_small()
    gpu = arguments(files_of(loaded, "gpu-1")[NODE_EXPORTER_DEFAULTS].content)
    cpu = arguments(files_of(loaded, "cpu-1")[NODE_EXPORTER_DEFAULTS].content)
    assert "--collector.textfile.directory=/srv/node-exporter/textfile" in gpu
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in cpu


def test_systemd_collector_keeps_only_cluster_units():
    args = arguments(files_of(load(SAMPLE), "etcd-1")[NODE_EXPORTER_DEFAULTS].content)
    include = next(a for a in args if a.startswith("--collector.systemd.unit-include="))
    assert "|etcd|" in include and include.endswith(")[.]service")
    assert "\\" not in include


def test_prometheus_only_on_the_monitoring_group():
    loaded = load(SAMPLE)
    assert PROMETHEUS_CONFIG in files_of(loaded, "mon-1")
    assert PROMETHEUS_CONFIG not in files_of(loaded, "etcd-1")


def test_rules_are_checked_and_written_before_the_config_that_loads_them():
    loaded = load(SAMPLE)
    files = prometheus_files(context(loaded, "mon-1"))
    paths = [f.path for f in files]
    assert paths.index(ALERT_RULES) < paths.index(PROMETHEUS_CONFIG)
    checks = {f.path: f.check for f in files}
    assert checks[ALERT_RULES] == "promtool check rules {path}"
    assert checks[PROMETHEUS_CONFIG] == "promtool check config {path}"
    assert prometheus_config(loaded)["rule_files"] == [ALERT_RULES]


def test_scrape_jobs_cover_the_inventory():
    loaded = load(SAMPLE)
    cluster = loaded.cluster
    config = prometheus_config(loaded)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # The sample runs the etcd role's Events cluster (etcd.events): a job of its own.
    assert list(jobs) == [
        "node", "etcd", "etcd-events", "haproxy",
        # The cluster's own endpoints, over HTTPS (tests/unit/test_monitoring_kubernetes.py).
        "kubernetes-apiservers", "kubelet", "kube-scheduler", "kube-controller-manager",
        "dcgm", "prometheus",
    ]  # fmt: skip

    def targets(job: str) -> dict[str, dict]:
        return {static["targets"][0]: static["labels"] for static in jobs[job]["static_configs"]}

    node = targets("node")
    assert len(node) == len(cluster.hosts)
    for name, host in cluster.hosts.items():
        assert node[f"{name}.sample.gpu.internal:9100"] == {
            "host": name,
            "group": ",".join(host.groups),
        }
    assert set(targets("etcd")) == {
        f"{n}.sample.gpu.internal:2381" for n in cluster.in_group("etcd")
    }
    assert set(targets("etcd-events")) == {
        f"{n}.sample.gpu.internal:2384" for n in cluster.in_group("etcd")
    }
    assert set(targets("haproxy")) == {
        f"{n}.sample.gpu.internal:8404" for n in cluster.in_group("loadbalancer")
    }
    assert set(targets("dcgm")) == {
        f"{n}.sample.gpu.internal:9400" for n in cluster.in_group("gpu_worker")
    }
    assert config["global"]["external_labels"] == {"cluster": "sample"}


def test_unused_series_are_dropped_at_scrape_time():
    """Every job ends with the role's drop rule; the DCGM and etcd jobs (both etcd clusters')
    first apply the fleet policy's rules for their exporters (tests/unit/test_fleet_policy.py
    checks what they keep)."""
    config = prometheus_config(load(SAMPLE))
    for job in config["scrape_configs"]:
        *first, relabel = job["metric_relabel_configs"]
        assert relabel["action"] == "drop"
        assert relabel["source_labels"] == ["__name__"]
        assert "go_.*" in relabel["regex"].split("|")
        expected = {"dcgm": ["keep"], "etcd": ["drop"], "etcd-events": ["drop"]}
        expected = expected.get(job["job_name"], [])
        assert [rule["action"] for rule in first] == expected


def test_groups_without_hosts_get_no_job(small_cluster, load_small):
    del small_cluster["hosts"]["gpu-1"]
    loaded = load_small()
    jobs = [job.name for job in scrape_jobs(loaded.cluster, 9400)]
    assert jobs == ["node", "etcd", "haproxy", "prometheus"]


def test_alert_rules_hold_the_etcd_limits():
    rules = alert_rules(load(SAMPLE))
    assert {
        "NodeDown",
        "EtcdNoLeader",
        "EtcdFsyncSlow",
        "EtcdDbNearQuota",
        "HAProxyBackendDown",
        "GpuHealthFailed",
        "GpuHealthStale",
    } <= set(rules)
    fsync = " ".join(rules["EtcdFsyncSlow"]["expr"].split())
    assert fsync.startswith("histogram_quantile(0.99,")
    assert "rate(etcd_disk_wal_fsync_duration_seconds_bucket[5m])" in fsync
    assert fsync.endswith("> 0.010")
    assert rules["EtcdDbNearQuota"]["expr"] == (
        "etcd_mvcc_db_total_size_in_bytes / etcd_server_quota_backend_bytes > 0.8"
    )
    assert rules["NodeDown"]["expr"] == 'up{job="node"} == 0'
    assert "{{ $labels.host }}" in rules["NodeDown"]["annotations"]["summary"]
    assert all(rule["labels"]["severity"] in ("warning", "critical") for rule in rules.values())


def test_gpu_alerts_read_gpu_health_metrics(small_cluster, load_small):
    small_cluster["hosts"]["gpu-1"]["vars"] = {"gpu_health": {"passive_interval_s": 600}}
    rules = alert_rules(load_small())
    assert rules["GpuHealthFailed"]["expr"] == "gpuinfra_gpu_health_verdict == 2"
    assert rules["GpuHealthStale"]["expr"] == (
        "time() - gpuinfra_gpu_health_last_run_timestamp_seconds > 1800"
    )


def test_retention_and_alert_delay_from_the_inventory(small_cluster, load_small):
    small_cluster["group_vars"] = {
        "monitoring": {
            "monitoring": {"retention_time": "30d", "retention_size": "50GB", "node_down_for": "5m"}
        }
    }
    loaded = load_small()
    args = arguments(files_of(loaded, "mon-1")[PROMETHEUS_DEFAULTS].content)
    assert "--storage.tsdb.retention.time=30d" in args
    assert "--storage.tsdb.retention.size=50GB" in args
    assert alert_rules(loaded)["NodeDown"]["for"] == "5m"


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("retention_time", "a month"),
        ("retention_size", "50G"),
        ("dcgm_exporter_port", 0),
        ("alert_webhooks", ["hooks.example.com/x"]),
        ("alert_webhooks", ["https://hooks.example.com/$(reboot)"]),
        ("alert_group_interval", "soon"),
    ],
)
def test_invalid_settings_name_the_key(small_cluster, load_small, setting, value):
    small_cluster["group_vars"] = {"monitoring": {"monitoring": {setting: value}}}
    with pytest.raises(InventoryInvalid) as excinfo:
        load_small()
    # A list's item is named by its index as well (alert_webhooks.0).
    keys = [e.key.removesuffix(".0") for e in excinfo.value.errors]
    assert keys == [f"group_vars.monitoring.monitoring.{setting}"]


def test_grafana_dashboards_are_valid_json():
    rendered = cluster_files(load(SAMPLE))
    names = {"grafana/node-overview.json", "grafana/etcd.json", "grafana/gpu-health.json"}
    assert names <= set(rendered)
    for name in names:
        dashboard = json.loads(rendered[name])
        assert dashboard["title"].startswith("sample: ")
        assert dashboard["panels"]
        for panel in dashboard["panels"]:
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])
            assert panel["datasource"]["uid"] == "${datasource}"
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids))


def test_gpu_dashboard_uses_gpu_health_metrics():
    dashboard = json.loads(cluster_files(load(SAMPLE))["grafana/gpu-health.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    assert "gpuinfra_gpu_health_verdict" in exprs
    assert "gpuinfra_gpu_health_last_run_timestamp_seconds" in exprs


def test_no_dashboards_without_a_monitoring_host(small_cluster, load_small):
    del small_cluster["hosts"]["mon-1"]
    rendered = cluster_files(load_small())
    assert not [name for name in rendered if name.startswith("grafana/")]


def test_prometheus_sends_alerts_to_alertmanager_on_its_host():
    config = prometheus_config(load(SAMPLE))
    (target,) = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert target == "127.0.0.1:9093"
    args = arguments(files_of(load(SAMPLE), "mon-1")[ALERTMANAGER_DEFAULTS].content)
    assert "--web.listen-address=127.0.0.1:9093" in args
    assert "--cluster.listen-address=" in args  # one instance: no gossip port


def test_alerts_go_to_the_inventorys_webhooks_firing_and_resolved(small_cluster, load_small):
    hooks = ["https://pager.example.com/hook/abc", "http://198.18.0.1:9099/alerts"]
    small_cluster["group_vars"] = {
        "all": {"monitoring": {"alert_webhooks": hooks, "alert_group_wait": "5s"}}
    }
    managed = files_of(load_small(), "mon-1")[ALERTMANAGER_CONFIG]
    routes = yaml.safe_load(managed.content)
    assert routes["route"]["receiver"] == "webhooks"
    assert routes["route"]["group_wait"] == "5s" and routes["route"]["group_interval"] == "5m"
    (receiver,) = routes["receivers"]
    assert receiver["webhook_configs"] == [{"url": url, "send_resolved": True} for url in hooks]
    # A webhook URL carries its token: never shown in a diff, readable by Alertmanager only.
    assert managed.secret and managed.mode == "0640" and managed.group == "prometheus"
    assert managed.check == "amtool check-config {path}"


def test_without_webhooks_alerts_stay_in_alertmanager():
    routes = yaml.safe_load(files_of(load(SAMPLE), "mon-1")[ALERTMANAGER_CONFIG].content)
    assert routes["receivers"] == [{"name": routes["route"]["receiver"]}]
