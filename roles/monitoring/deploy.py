"""The monitoring role's deploys: node exporter on every host, Prometheus and Alertmanager on
its group."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, files, server

from inventory.topology import NODE_EXPORTER_PORT
from roles.monitoring.files import (
    ALERT_RULES,
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_DEFAULTS,
    ALERTMANAGER_PORT,
    NODE_EXPORTER_DEFAULTS,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DEFAULTS,
    node_exporter_files,
    prometheus_files,
    textfile_dir,
)
from roles.monitoring.kubernetes import (
    certificate_signed,
    client_key,
    current_certificate,
    metrics_access,
)
from roles.monitoring.targets import PROMETHEUS_PORT
from toolkit.operations import put_file, restart_if_running, service_running, wait_for
from toolkit.spec import HostContext

ALERTMANAGER_UNIT = "prometheus-alertmanager"


@deploy("Node exporter")
def apply_node_exporter(ctx: HostContext) -> None:
    apt.packages(
        name="Install node exporter", packages=["prometheus-node-exporter"], no_recommends=True
    )
    # gpu_health's timer writes its .prom file here; node exporter only reads it.
    files.directory(
        name="Create the textfile collector directory",
        path=textfile_dir(ctx),
        user="root",
        group="root",
        mode="0755",
    )
    written = {f.path: put_file(f) for f in node_exporter_files(ctx)}
    service_running(name="Run node exporter", unit="prometheus-node-exporter")
    changed = written[NODE_EXPORTER_DEFAULTS].did_change
    # Arguments are only read at start: a reload would keep the old collectors.
    restart_if_running(
        name="Restart node exporter for new arguments",
        unit="prometheus-node-exporter",
        _if=changed,
    )
    server.shell(
        name="Wait for node exporter to serve metrics",
        commands=[
            wait_for(f"curl -fsS -o /dev/null http://127.0.0.1:{NODE_EXPORTER_PORT}/metrics")
        ],
        _if=changed,
    )


@deploy("Prometheus")
def apply_prometheus(ctx: HostContext) -> None:
    # Alertmanager's package first too: its configuration is checked with its amtool.
    apt.packages(
        name="Install Prometheus and Alertmanager",
        packages=["prometheus", "prometheus-alertmanager"],
        no_recommends=True,
    )
    access = metrics_access(ctx.loaded)
    if access is not None and current_certificate(ctx.loaded, client_key(ctx.loaded)) is None:
        # Before the configuration, whose check needs the files it names.
        certificate_signed(
            name="Have Prometheus' Kubernetes client certificate signed (on the first "
            "control-plane node, through the certificates API)",
            signer=access.signer,
            kubeconfig=access.admin_kubeconfig,
            cluster_ca=access.cluster_ca,
            state_dir=str(ctx.loaded.state_dir),
        )
    # Rules are written (and checked) before the configuration that loads them.
    written = {f.path: put_file(f) for f in prometheus_files(ctx)}
    arguments, rules, config = (
        written[PROMETHEUS_DEFAULTS],
        written[ALERT_RULES],
        written[PROMETHEUS_CONFIG],
    )
    service_running(name="Run Prometheus", unit="prometheus")
    # Retention and listen address are flags: only a restart applies them. Scrape targets and
    # rules are re-read on SIGHUP, which keeps the in-memory head block and running queries.
    restart_if_running(
        name="Restart Prometheus for new arguments",
        unit="prometheus",
        _if=arguments.did_change,
    )
    restart_if_running(
        name="Reload Prometheus for new targets or rules",
        unit="prometheus",
        reload=True,
        _if=lambda: not arguments.did_change() and (rules.did_change() or config.did_change()),
    )
    server.shell(
        name="Wait for Prometheus to be ready",
        commands=[wait_for(f"curl -fsS -o /dev/null http://127.0.0.1:{PROMETHEUS_PORT}/-/ready")],
        _if=lambda: arguments.did_change() or rules.did_change() or config.did_change(),
    )
    alertmanager_arguments, routes = written[ALERTMANAGER_DEFAULTS], written[ALERTMANAGER_CONFIG]
    service_running(name="Run Alertmanager", unit=ALERTMANAGER_UNIT)
    restart_if_running(
        name="Restart Alertmanager for new arguments",
        unit=ALERTMANAGER_UNIT,
        _if=alertmanager_arguments.did_change,
    )
    # Routes and receivers are re-read on SIGHUP, keeping the alerts it holds.
    restart_if_running(
        name="Reload Alertmanager for new routes",
        unit=ALERTMANAGER_UNIT,
        reload=True,
        _if=lambda: not alertmanager_arguments.did_change() and routes.did_change(),
    )
    server.shell(
        name="Wait for Alertmanager to be ready",
        commands=[wait_for(f"curl -fsS -o /dev/null http://127.0.0.1:{ALERTMANAGER_PORT}/-/ready")],
        _if=lambda: alertmanager_arguments.did_change() or routes.did_change(),
    )
