"""What Prometheus scrapes, derived from the inventory: one job per exporter kind."""

from __future__ import annotations

from dataclasses import dataclass

from inventory.model import Cluster
from inventory.topology import (
    ETCD_EVENTS_METRICS_PORT,
    ETCD_METRICS_PORT,
    HAPROXY_STATS_PORT,
    NODE_EXPORTER_PORT,
)

PROMETHEUS_PORT = 9090


@dataclass(frozen=True)
class Target:
    address: str  # host:port as Prometheus dials it
    host: str  # inventory name, the `host` label every alert names
    group: str  # the host's groups joined by ",", the `group` label


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: tuple[Target, ...]
    metrics_path: str = "/metrics"


def _targets(cluster: Cluster, names: list[str], port: int) -> tuple[Target, ...]:
    # FQDNs: the base role puts every host in /etc/hosts (and the dns role in the zone), so the
    # `instance` label reads as a name, not an address.
    return tuple(
        Target(f"{cluster.fqdn(name)}:{port}", name, ",".join(cluster.hosts[name].groups))
        for name in names
    )


def scrape_jobs(
    cluster: Cluster, dcgm_port: int, events_members: list[str] | None = None
) -> list[ScrapeJob]:
    """Jobs in a fixed order; a job whose group is empty is left out (no empty target lists).
    `events_members`: the hosts of the etcd role's Events cluster (none when it is off)."""
    jobs = [
        ScrapeJob("node", _targets(cluster, list(cluster.hosts), NODE_EXPORTER_PORT)),
        ScrapeJob("etcd", _targets(cluster, cluster.in_group("etcd"), ETCD_METRICS_PORT)),
        ScrapeJob("etcd-events", _targets(cluster, events_members or [], ETCD_EVENTS_METRICS_PORT)),
        ScrapeJob(
            "haproxy", _targets(cluster, cluster.in_group("loadbalancer"), HAPROXY_STATS_PORT)
        ),
        # NVIDIA's DCGM exporter arrives with the GPU operator/Kubernetes; the job waits for it.
        ScrapeJob("dcgm", _targets(cluster, cluster.in_group("gpu_worker"), dcgm_port)),
        ScrapeJob("prometheus", _targets(cluster, cluster.in_group("monitoring"), PROMETHEUS_PORT)),
    ]
    return [job for job in jobs if job.targets]
