"""Prometheus on the monitoring hosts: ready, its files valid, scraping every configured target,
and sending its alerts to the Alertmanager beside it."""

from __future__ import annotations

import json

from roles.monitoring.config import MonitoringConfig
from roles.monitoring.files import (
    ALERT_RULES,
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_PORT,
    PROMETHEUS_CONFIG,
)
from roles.monitoring.targets import PROMETHEUS_PORT, scrape_jobs
from toolkit.spec import provided

TARGET_GROUPS = ("monitoring",)


def test_prometheus_is_running_and_enabled(host):
    service = host.service("prometheus")
    assert service.is_running
    assert service.is_enabled


def test_prometheus_is_ready(host):
    assert host.run(f"curl -fsS http://127.0.0.1:{PROMETHEUS_PORT}/-/ready").rc == 0


def test_live_rules_pass_promtool(host):
    result = host.run(f"promtool check rules {ALERT_RULES}")
    assert result.rc == 0, result.stdout + result.stderr


def test_live_config_passes_promtool(host):
    result = host.run(f"promtool check config {PROMETHEUS_CONFIG}")
    assert result.rc == 0, result.stdout + result.stderr


def test_alertmanager_is_running_ready_and_its_config_valid(host):
    service = host.service("prometheus-alertmanager")
    assert service.is_running and service.is_enabled
    assert host.run(f"curl -fsS http://127.0.0.1:{ALERTMANAGER_PORT}/-/ready").rc == 0
    result = host.run(f"amtool check-config {ALERTMANAGER_CONFIG}")
    assert result.rc == 0, result.stdout + result.stderr


def test_alerts_go_to_the_alertmanager_on_this_host(host):
    body = json.loads(
        host.check_output(f"curl -fsS http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/alertmanagers")
    )
    urls = [am["url"] for am in body["data"]["activeAlertmanagers"]]
    assert any(url.startswith(f"http://127.0.0.1:{ALERTMANAGER_PORT}/") for url in urls), urls


def test_every_configured_target_is_scraped(host, ctx):
    cfg = ctx.config(MonitoringConfig)
    body = json.loads(
        host.check_output(f"curl -fsS http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/targets")
    )
    active = {(t["labels"]["job"], t["labels"]["host"]) for t in body["data"]["activeTargets"]}
    expected = {
        (job.name, target.host)
        for job in scrape_jobs(
            ctx.cluster, cfg.dcgm_exporter_port, provided("etcd", "events_members")(ctx.loaded)
        )
        for target in job.targets
    }
    assert sorted(expected - active) == []


def test_every_node_exporter_is_up(host, ctx):
    body = json.loads(
        host.check_output(f"curl -fsS http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/targets")
    )
    health = {
        t["labels"]["host"]: t["health"]
        for t in body["data"]["activeTargets"]
        if t["labels"]["job"] == "node"
    }
    down = sorted(name for name in ctx.cluster.hosts if health.get(name) != "up")
    assert down == []
