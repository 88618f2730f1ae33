"""Defaults of the monitoring role; group_vars/host vars under `monitoring:` override them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from inventory.grammar import UnitName, Url


class MonitoringConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Prometheus's own default; long-term history belongs in remote storage, not on one node.
    retention_time: str = Field("15d", pattern=r"^\d+[smhdwy]$")
    # Cap on disk use as well (e.g. "50GB"): the oldest blocks go first. None: time only.
    retention_size: str | None = Field(None, pattern=r"^\d+(B|KB|MB|GB|TB|PB|EB)$")
    # None: derived from the fleet's size (inventory/sizing.py): 15 s, which resolves a 1-minute
    # rate with four samples, until one Prometheus's samples/s budget needs up to 60 s.
    scrape_interval: str | None = Field(None, pattern=r"^\d+[smh]$")
    evaluation_interval: str = Field("15s", pattern=r"^\d+[smh]$")
    # How long a host's node exporter must be unreachable before NodeDown fires: longer than a
    # reboot's blip, short enough to page before a job notices.
    node_down_for: str = Field("2m", pattern=r"^\d+[smh]$")
    # Node exporter collectors that only add series on this fleet: no btrfs/zfs/xfs/bcache/nfs
    # filesystems, no IPVS (kube-proxy runs iptables/nftables), and power/tape/fibre channel
    # stats nobody alerts on. Collectors GPU nodes need (infiniband, hwmon, edac) stay on.
    disabled_collectors: list[UnitName] = Field(
        default_factory=lambda: [
            "arp",
            "bcache",
            "btrfs",
            "fibrechannel",
            "ipvs",
            "nfs",
            "nfsd",
            "powersupplyclass",
            "rapl",
            "tapestats",
            "xfs",
            "zfs",
        ]
    )
    # Debian turns the systemd collector on, one series per unit and state (400+ per host):
    # only the units the cluster depends on are kept, so NodeServiceFailed has what it needs.
    systemd_units: list[UnitName] = Field(
        default_factory=lambda: [
            "chrony",
            "containerd",
            "docker",
            "etcd",
            "haproxy",
            "keepalived",
            "kubelet",
            "named",
            "nvidia-fabricmanager",
            "prometheus",
            "prometheus-alertmanager",
            "prometheus-node-exporter",
            "ssh",
        ]
    )
    # Series dropped at scrape time (metric_relabel_configs): the exporters' own Go runtime and
    # HTTP handler internals, and per-CPU guest time (no VMs run on these nodes).
    drop_metrics: list[str] = Field(
        default_factory=lambda: [
            "go_.*",
            "promhttp_.*",
            "process_.*",
            "node_cpu_guest_seconds_total",
            "node_scrape_collector_.*",
            "etcd_debugging_.*",
            "grpc_server_handled_total",
            "grpc_server_msg_.*",
        ]
    )
    # Where Alertmanager (beside Prometheus on the monitoring host) sends alerts, firing and
    # resolved: webhook URLs (a pager's or chat's incoming webhook, an on-call bridge). None:
    # alerts are only seen in Alertmanager and Prometheus, which no one watches at 3 a.m.
    alert_webhooks: list[Url] = Field(default_factory=list)
    # Alertmanager's own defaults: wait before a group's first notification so alerts that fire
    # together go out as one; between updates of a group (new alerts, resolutions); and before
    # the same notification is sent again.
    alert_group_wait: str = Field("30s", pattern=r"^\d+[smh]$")
    alert_group_interval: str = Field("5m", pattern=r"^\d+[smh]$")
    alert_repeat_interval: str = Field("4h", pattern=r"^\d+[smh]$")
    # NVIDIA's DCGM exporter default port, scraped on GPU workers (installed with Kubernetes).
    dcgm_exporter_port: int = Field(9400, ge=1, le=65535)
