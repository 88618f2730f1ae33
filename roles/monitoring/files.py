"""Files the monitoring role manages: node exporter's settings on every host, Prometheus's
configuration and alert rules on the monitoring hosts, Grafana dashboards for the cluster."""

from __future__ import annotations

import json

from inventory.model import LoadedCluster
from inventory.sizing import cluster_sizing, explicit_or
from roles.monitoring.config import MonitoringConfig
from roles.monitoring.dashboards import DASHBOARDS
from roles.monitoring.kubernetes import cluster_objects, credential_files, metrics_access
from roles.monitoring.targets import PROMETHEUS_PORT, scrape_jobs
from toolkit.spec import HostContext, ManagedFile, default_settings, provided, settings_of
from toolkit.templates import render_template

# Series kept or dropped per scrape job, by the role that deploys the exporters (the DCGM
# keep-list): job name -> Prometheus metric_relabel rules on __name__.
metric_rules = provided("fleet_policy", "metric_rules")
# The etcd role's Events cluster members (etcd.events), scraped as a job of their own.
events_members = provided("etcd", "events_members")

NODE_EXPORTER_DEFAULTS = "/etc/default/prometheus-node-exporter"
PROMETHEUS_DEFAULTS = "/etc/default/prometheus"
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
# Not under a rules/ glob: the staged copy that promtool checks must not be loaded as a rule file.
ALERT_RULES = "/etc/prometheus/gpuinfra-alerts.yml"
PROMETHEUS_DATA = "/var/lib/prometheus/metrics2/"
ALERTMANAGER_DEFAULTS = "/etc/default/prometheus-alertmanager"
ALERTMANAGER_CONFIG = "/etc/prometheus/alertmanager.yml"
ALERTMANAGER_PORT = 9093
# Silences and the notification log (the package makes it, owned by its user).
ALERTMANAGER_DATA = "/var/lib/prometheus/alertmanager"
DASHBOARD_DIR = "grafana"
# Missed passive GPU checks before their metrics count as stale (the writer stopped).
GPU_HEALTH_STALE_RUNS = 3


def textfile_dir(ctx: HostContext) -> str:
    """Where gpu_health writes its .prom file on this host: node exporter reads the same place."""
    cfg = ctx.settings_of("gpu_health")
    return cfg.textfile_dir


def node_exporter_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = ctx.config(MonitoringConfig)
    content = render_template(
        "monitoring/prometheus-node-exporter.default.j2",
        cfg=cfg,
        textfile_dir=textfile_dir(ctx),
        units_regex="(" + "|".join(cfg.systemd_units) + ")[.]service",
    )
    return [ManagedFile("monitoring", NODE_EXPORTER_DEFAULTS, content)]


def gpu_health_stale_seconds(loaded: LoadedCluster) -> int:
    """Age past which GPU health metrics are stale: a few runs of the slowest configured node."""
    intervals = [
        settings_of(loaded, name, "gpu_health").passive_interval_s
        for name in loaded.cluster.in_group("gpu_worker")
    ]
    default = default_settings("gpu_health").passive_interval_s
    return GPU_HEALTH_STALE_RUNS * max(intervals or [default])


def scrape_interval(loaded: LoadedCluster, cfg: MonitoringConfig) -> str:
    """The inventory's scrape_interval, or the one the fleet's scrape budget allows."""
    derived = f"{cluster_sizing(loaded.cluster).scrape_interval_s}s"
    return explicit_or(cfg.scrape_interval, derived)


def prometheus_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = ctx.config(MonitoringConfig)
    defaults = render_template(
        "monitoring/prometheus.default.j2",
        cfg=cfg,
        config=PROMETHEUS_CONFIG,
        data=PROMETHEUS_DATA,
        port=PROMETHEUS_PORT,
    )
    rules = render_template(
        "monitoring/gpuinfra-alerts.yml.j2",
        cfg=cfg,
        gpu_health_stale_s=gpu_health_stale_seconds(ctx.loaded),
    )
    config = render_template(
        "monitoring/prometheus.yml.j2",
        cfg=cfg,
        scrape_interval=scrape_interval(ctx.loaded, cfg),
        cluster=ctx.cluster,
        jobs=scrape_jobs(
            ctx.cluster,
            cfg.dcgm_exporter_port,
            events_members(ctx.loaded),
            kubernetes_endpoints(ctx.loaded),
        ),
        job_rules=metric_rules(ctx.loaded),
        rules=ALERT_RULES,
        alertmanager=f"127.0.0.1:{ALERTMANAGER_PORT}",
        drop_regex="|".join(cfg.drop_metrics),
    )
    # Rules first: promtool checks the configuration together with the rule files it names,
    # and the Kubernetes credentials it points at.
    return [
        ManagedFile("monitoring", PROMETHEUS_DEFAULTS, defaults),
        *credential_files(ctx.loaded),
        ManagedFile("monitoring", ALERT_RULES, rules, check="promtool check rules {path}"),
        ManagedFile("monitoring", PROMETHEUS_CONFIG, config, check="promtool check config {path}"),
        *alertmanager_files(ctx),
    ]


def kubernetes_endpoints(loaded: LoadedCluster) -> tuple:
    """What the kubernetes role offers to scrape; none without Kubernetes."""
    access = metrics_access(loaded)
    return () if access is None else access.endpoints


def alertmanager_files(ctx: HostContext) -> list[ManagedFile]:
    """Alertmanager beside Prometheus: its arguments, and its routes to the inventory's
    webhooks (a secret: a chat or pager webhook URL carries its token)."""
    cfg = ctx.config(MonitoringConfig)
    defaults = render_template(
        "monitoring/prometheus-alertmanager.default.j2",
        config=ALERTMANAGER_CONFIG,
        data=ALERTMANAGER_DATA,
        port=ALERTMANAGER_PORT,
    )
    routes = render_template(
        "monitoring/alertmanager.yml.j2",
        cfg=cfg,
        cluster=ctx.cluster,
        receiver="webhooks" if cfg.alert_webhooks else "kept",
    )
    return [
        ManagedFile("monitoring", ALERTMANAGER_DEFAULTS, defaults),
        ManagedFile(
            "monitoring",
            ALERTMANAGER_CONFIG,
            routes,
            mode="0640",
            group="prometheus",
            secret=True,
            check="amtool check-config {path}",
        ),
    ]


def cluster_files(loaded: LoadedCluster) -> dict[str, str]:
    """Grafana dashboards (JSON models, importable as they are) for clusters with a monitoring
    host: node overview, etcd and GPU health; and where Kubernetes runs, the kubelets' metrics
    for Prometheus' user (applied by the kubernetes role)."""
    if not loaded.cluster.in_group("monitoring"):
        return {}
    return {
        f"{DASHBOARD_DIR}/{name}.json": json.dumps(build(loaded.cluster), indent=2) + "\n"
        for name, build in DASHBOARDS.items()
    } | cluster_objects(loaded)
