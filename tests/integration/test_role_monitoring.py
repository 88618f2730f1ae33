"""The monitoring role on the default lab: node exporter on every host, Prometheus on mon-1
scraping them all, its rules loaded, alerts firing from real conditions (a powered-off host,
a GPU health textfile written the way `gpuinfra health` writes it), and Alertmanager delivering
an alert to a webhook, firing then resolved."""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from gpuhealth.report import to_prometheus
from gpuhealth.results import CheckResult, NodeReport, Verdict
from lab.state import read_state
from roles.monitoring.dashboards import DASHBOARDS
from tests.integration.conftest import LabCluster
from tests.integration.test_role_loadbalancer import (
    apply_roles,
    eventually,
    gpuinfra,
    pending_changes,
)

ROLES = "base,loadbalancer,monitoring"
PROMETHEUS_HOST = "mon-1"

pytestmark = pytest.mark.integration


def api(lab: LabCluster, path: str, **params: str) -> dict:
    """GET Prometheus's HTTP API on the monitoring host."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    url = shlex.quote(f"http://127.0.0.1:9090/api/v1/{path}{query}")
    body = json.loads(lab.ssh(PROMETHEUS_HOST, f"curl -fsS {url}").stdout)
    assert body["status"] == "success", body
    return body["data"]


def node_targets(lab: LabCluster) -> dict[str, str]:
    """{host label: health} of the node exporter targets."""
    targets = api(lab, "targets", state="active")["activeTargets"]
    return {t["labels"]["host"]: t["health"] for t in targets if t["labels"]["job"] == "node"}


def alert_states(lab: LabCluster, name: str) -> Callable[[], dict[str, str]]:
    def states() -> dict[str, str]:
        alerts = api(lab, "alerts")["alerts"]
        return {a["labels"]["host"]: a["state"] for a in alerts if a["labels"]["alertname"] == name}

    return states


def test_plan_after_apply_has_no_changes(converged):
    assert pending_changes(converged, ROLES) == {}


def test_prometheus_is_ready(converged):
    converged.ssh(PROMETHEUS_HOST, "curl -fsS http://127.0.0.1:9090/-/ready")


def test_live_config_and_rules_pass_promtool(converged):
    converged.ssh(PROMETHEUS_HOST, "promtool check config /etc/prometheus/prometheus.yml")
    converged.ssh(PROMETHEUS_HOST, "promtool check rules /etc/prometheus/gpuinfra-alerts.yml")
    converged.ssh(PROMETHEUS_HOST, "amtool check-config /etc/prometheus/alertmanager.yml")


def test_alertmanager_is_ready_and_prometheus_sends_to_it(converged):
    lab = converged
    lab.ssh(PROMETHEUS_HOST, "curl -fsS http://127.0.0.1:9093/-/ready")
    eventually(
        lambda: [
            am["url"]
            for am in api(lab, "alertmanagers")["activeAlertmanagers"]
            if am["url"].startswith("http://127.0.0.1:9093/")
        ],
        "Prometheus sends to the Alertmanager on its host",
    )


def test_every_node_exporter_is_up(converged):
    lab = converged
    eventually(
        lambda: node_targets(lab) == {host: "up" for host in lab.hosts},
        "every node exporter target up",
    )


def test_alert_rules_are_loaded(converged):
    groups = api(converged, "rules")["groups"]
    names = {rule["name"] for group in groups for rule in group["rules"]}
    assert {"NodeDown", "EtcdFsyncSlow", "EtcdDbNearQuota", "GpuHealthFailed"} <= names


def test_dropped_series_never_reach_the_database(converged):
    lab = converged
    eventually(
        lambda: api(lab, "query", query='count(node_load1{job="node",host!=""})')["result"],
        "node_load1 scraped",
    )
    # host!="": only targets from our configuration (Debian's default one scraped localhost
    # without labels until the role replaced it; its last samples linger for five minutes).
    dropped = api(lab, "query", query='count(go_goroutines{job="node",host!=""})')["result"]
    assert dropped == []


def test_gpu_health_textfile_reaches_prometheus_and_alerts(converged):
    """A failed verdict written into gpu-1's textfile directory (what `gpuinfra health` does on a
    GPU node; the lab has no GPU to fail) must show up and fire GpuHealthFailed."""
    lab = converged
    textfile = "/var/lib/prometheus/node-exporter/gpu_health.prom"
    metrics = (
        "# TYPE gpuinfra_gpu_health_verdict gauge\n"
        'gpuinfra_gpu_health_verdict{backend="integration-test"} 2\n'
    )
    lab.ssh("gpu-1", f"printf %s {shlex.quote(metrics)} > {textfile}")
    try:
        eventually(
            lambda: alert_states(lab, "GpuHealthFailed")().get("gpu-1") == "firing",
            "GpuHealthFailed firing for gpu-1",
        )
    finally:
        lab.ssh("gpu-1", f"rm -f {textfile}")


def test_a_powered_off_host_is_down_and_node_down_pends(converged):
    lab = converged
    host = "cpu-1"
    eventually(lambda: node_targets(lab).get(host) == "up", f"{host} up first")
    stop = gpuinfra("lab", "stop", host, "--name", lab.name)
    assert stop.returncode == 0, stop.stderr
    try:
        eventually(
            lambda: api(lab, "query", query=f'up{{job="node",host="{host}"}} == 0')["result"],
            f"up == 0 for {host}",
        )
        eventually(
            lambda: alert_states(lab, "NodeDown")().get(host) in ("pending", "firing"),
            f"NodeDown pending for {host}",
        )
    finally:
        start = gpuinfra("lab", "start", host, "--name", lab.name)
        assert start.returncode == 0, start.stderr
    eventually(lambda: node_targets(lab).get(host) == "up", f"{host} up again", seconds=120)


@contextmanager
def webhook_receiver(address: str) -> Iterator[tuple[str, list[dict]]]:
    """An HTTP server on the lab's gateway address (lab hosts reach the machine there) that
    keeps every JSON body POSTed to it: the receiver an operator's pager would be."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length", 0))
            received.append(json.loads(self.rfile.read(length)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((address, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_address[1]}/alerts", received
    finally:
        server.shutdown()
        server.server_close()


def delivered(received: list[dict], alertname: str, host: str) -> list[str]:
    """The statuses Alertmanager delivered for one alert of one host, in order."""
    return [
        alert["status"]
        for body in list(received)
        for alert in body.get("alerts", [])
        if alert["labels"].get("alertname") == alertname and alert["labels"].get("host") == host
    ]


def test_an_alert_reaches_the_webhook_firing_then_resolved(converged):
    """mon-1's Alertmanager routes to a webhook (monitoring.alert_webhooks, Alertmanager's
    grouping shortened for the test): a failed GPU verdict on gpu-1 is delivered firing, and
    resolved once the verdict is gone. The inventory and mon-1 are put back afterwards."""
    lab = converged
    gateway = str(read_state(lab.name).gateway)
    textfile = "/var/lib/prometheus/node-exporter/gpu_health.prom"
    metrics = (
        "# TYPE gpuinfra_gpu_health_verdict gauge\n"
        'gpuinfra_gpu_health_verdict{backend="integration-test"} 2\n'
    )
    original = lab.inventory_path.read_text()
    with webhook_receiver(gateway) as (url, received):
        data = yaml.safe_load(original)
        everyone = data.setdefault("group_vars", {}).setdefault("all", {})
        everyone.setdefault("monitoring", {}).update(
            alert_webhooks=[url], alert_group_wait="1s", alert_group_interval="5s"
        )
        lab.inventory_path.write_text(yaml.safe_dump(data, sort_keys=False))
        try:
            apply_roles(lab, "monitoring")
            lab.ssh("gpu-1", f"printf %s {shlex.quote(metrics)} > {textfile}")
            try:
                eventually(
                    lambda: "firing" in delivered(received, "GpuHealthFailed", "gpu-1"),
                    "GpuHealthFailed delivered firing for gpu-1",
                    seconds=180,
                )
            finally:
                lab.ssh("gpu-1", f"rm -f {textfile}")
            eventually(
                lambda: "resolved" in delivered(received, "GpuHealthFailed", "gpu-1"),
                "GpuHealthFailed delivered resolved for gpu-1",
                seconds=240,
            )
        finally:
            lab.inventory_path.write_text(original)
            apply_roles(lab, "monitoring")


def _series(lab: LabCluster, expr: str) -> list:
    return api(lab, "query", query=expr)["result"]


def test_every_dashboard_panel_reads_series_prometheus_has(converged):
    """Grafana is not here to draw them, so each dashboard is read as Grafana would query it:
    its host variable's selector, then every panel's PromQL with `$host` as every host, each
    returns series from the lab's Prometheus. A threshold (`== 1`, `> 0`) is left off: a panel
    that shows nothing while all is well still reads a metric that exists. gpu-1 has no GPU:
    its textfile is written with `gpuhealth.report.to_prometheus`, as `gpuinfra health` writes
    it; DCGM's exporter does not run, so its panel shows the target down (`up` 0), a series.
    The control: a metric no exporter has returns none through the same query path.
    One lab limit, checked rather than assumed: the lab's roots are overlayfs, which node
    exporter leaves out of its filesystem metrics (its default --collector.filesystem.fs-types-
    exclude), so the root filesystem panel reads nothing there; its metrics must still exist
    for the hosts' other file systems, and mon-1's root must be overlayfs."""
    lab = converged
    textfile = "/var/lib/prometheus/node-exporter/gpu_health.prom"
    check = CheckResult(
        "matmul", Verdict.ok, "712 TFLOP/s", ">= 593 TFLOP/s", gpu=0, value=712.0,
        unit="TFLOP/s",
    )  # fmt: skip
    report = NodeReport("gpu-1", [check], "integration-test", time.time(), 1.5)
    lab.ssh("gpu-1", f"printf %s {shlex.quote(to_prometheus(report))} > {textfile}")
    root = lab.ssh(PROMETHEUS_HOST, "stat -f -c %T /").stdout.strip()
    root_is_overlay = root == "overlayfs"
    try:
        assert _series(lab, 'gpuinfra_no_such_metric{host=~".+"}') == []
        for name, build in DASHBOARDS.items():
            board = build(lab.loaded.cluster)
            (variable,) = [v for v in board["templating"]["list"] if v["name"] == "host"]
            selector = re.fullmatch(r"label_values\((.+), host\)", variable["query"]).group(1)
            hosts = eventually(lambda s=selector: _series(lab, f"count by (host) ({s})"),
                               f"{name}: the host variable's {selector}")  # fmt: skip
            assert hosts, name
            for panel in board["panels"]:
                for target in panel["targets"]:
                    expr = re.sub(r"\s*(==|>)\s*[0-9.]+$", "", target["expr"])
                    expr = expr.replace('"$host"', '".+"')
                    if 'mountpoint="/"' in expr and root_is_overlay:
                        expr = expr.replace('mountpoint="/",', "")
                    eventually(
                        lambda e=expr: _series(lab, e),
                        f"{name}: panel {panel['title']!r} ({expr})",
                        seconds=120,
                    )
    finally:
        lab.ssh("gpu-1", f"rm -f {textfile}")
