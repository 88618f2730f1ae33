"""What Prometheus scrapes, derived from the inventory: one job per exporter kind."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from inventory.model import Cluster
from inventory.topology import (
    ETCD_EVENTS_METRICS_PORT,
    ETCD_METRICS_PORT,
    HAPROXY_STATS_PORT,
    NODE_EXPORTER_PORT,
)

PROMETHEUS_PORT = 9090
# Prometheus' credentials for the Kubernetes endpoints (roles/monitoring/kubernetes.py).
CREDENTIALS_DIR = "/etc/prometheus/kubernetes"
CLIENT_KEY = f"{CREDENTIALS_DIR}/client.key"
CLIENT_CERT = f"{CREDENTIALS_DIR}/client.crt"
CLUSTER_CA = f"{CREDENTIALS_DIR}/ca.crt"


class KubernetesEndpoint(Protocol):
    """One of the endpoints the kubernetes role offers (its metrics.MetricsEndpoint)."""

    job: str
    hosts: tuple[str, ...]
    port: int
    ca_signed: bool


@dataclass(frozen=True)
class Target:
    address: str  # host:port as Prometheus dials it
    host: str  # inventory name, the `host` label every alert names
    group: str  # the host's groups joined by ",", the `group` label


@dataclass(frozen=True)
class ClientTls:
    """A job's TLS: the client certificate Prometheus shows, and the CA it checks the server's
    against (None: the server's certificate is self-signed, nothing to check it against)."""

    cert_file: str
    key_file: str
    ca_file: str | None


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: tuple[Target, ...]
    metrics_path: str = "/metrics"
    tls: ClientTls | None = None  # over HTTPS with a client certificate; None: plain HTTP


def _targets(cluster: Cluster, names: list[str], port: int) -> tuple[Target, ...]:
    # FQDNs: the base role puts every host in /etc/hosts (and the dns role in the zone), so the
    # `instance` label reads as a name, not an address.
    return tuple(
        Target(f"{cluster.fqdn(name)}:{port}", name, ",".join(cluster.hosts[name].groups))
        for name in names
    )


def scrape_jobs(
    cluster: Cluster,
    dcgm_port: int,
    events_members: list[str] | None = None,
    kubernetes: Sequence[KubernetesEndpoint] = (),
) -> list[ScrapeJob]:
    """Jobs in a fixed order; a job whose group is empty is left out (no empty target lists).
    `events_members`: the hosts of the etcd role's Events cluster (none when it is off);
    `kubernetes`: the cluster's own endpoints (API servers, kubelets, scheduler, controller
    manager: roles/kubernetes/metrics.py), over HTTPS with Prometheus' client certificate."""
    jobs = [
        ScrapeJob("node", _targets(cluster, list(cluster.hosts), NODE_EXPORTER_PORT)),
        ScrapeJob("etcd", _targets(cluster, cluster.in_group("etcd"), ETCD_METRICS_PORT)),
        ScrapeJob("etcd-events", _targets(cluster, events_members or [], ETCD_EVENTS_METRICS_PORT)),
        ScrapeJob(
            "haproxy", _targets(cluster, cluster.in_group("loadbalancer"), HAPROXY_STATS_PORT)
        ),
        *(
            ScrapeJob(
                endpoint.job,
                _targets(cluster, list(endpoint.hosts), endpoint.port),
                tls=ClientTls(CLIENT_CERT, CLIENT_KEY, CLUSTER_CA if endpoint.ca_signed else None),
            )
            for endpoint in kubernetes
        ),
        # NVIDIA's DCGM exporter arrives with the GPU operator/Kubernetes; the job waits for it.
        ScrapeJob("dcgm", _targets(cluster, cluster.in_group("gpu_worker"), dcgm_port)),
        ScrapeJob("prometheus", _targets(cluster, cluster.in_group("monitoring"), PROMETHEUS_PORT)),
    ]
    return [job for job in jobs if job.targets]
