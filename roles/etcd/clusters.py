"""The etcd clusters the role runs on the etcd hosts: the main store and, with etcd.events on,
the Events cluster beside it, each described once so its files, deploy and day-2 use treat
both alike.

The Events cluster has a member on every etcd host, with its own ports, unit, member names,
initial cluster token, data directory (on the same data disk), certificates and snapshots. Its
server certificates come from the same CA and it trusts the same CA bundle as the main
members: kube-apiserver reaches `--etcd-servers-overrides` with its one set of etcd client TLS
settings (--etcd-cafile, --etcd-certfile, --etcd-keyfile), so both clusters must accept the same
client certificate and be verified by the same CA.
"""

from __future__ import annotations

from dataclasses import dataclass

from inventory.model import LoadedCluster
from inventory.topology import (
    ETCD_CLIENT_PORT,
    ETCD_EVENTS_CLIENT_PORT,
    ETCD_EVENTS_METRICS_PORT,
    ETCD_EVENTS_PEER_PORT,
    ETCD_METRICS_PORT,
    ETCD_PEER_PORT,
)
from roles.etcd.config import EtcdConfig
from toolkit.spec import host_config

PKI = "/etc/etcd/pki"
SBIN = "/usr/local/sbin"
SYSTEMD = "/etc/systemd/system"


@dataclass(frozen=True)
class EtcdCluster:
    """One etcd cluster on the etcd hosts, and where each of its pieces lives on a member."""

    name: str  # the systemd unit and the prefix of the cluster's scripts and units
    title: str  # how units and logs name it
    client_port: int
    peer_port: int
    metrics_port: int
    # After the member's name and the cluster token: two clusters never share a member name.
    suffix: str = ""
    # Below etcd.data_dir and etcd.backup_dir ("" for the main cluster: the folders themselves).
    subdir: str = ""
    # Before "server" and "peer" in the certificates' names.
    pki_prefix: str = ""

    @property
    def unit_file(self) -> str:
        return f"{SYSTEMD}/{self.name}.service"

    @property
    def initial_state_env(self) -> str:
        """Read by the unit when present: "existing" there makes a new member join (`gpuinfra
        etcd replace` writes the main cluster's; docs/roles/etcd.md the Events cluster's)."""
        return f"/etc/etcd/initial-cluster-state{self.suffix}.env"

    @property
    def etcdctl_env(self) -> str:
        return f"/etc/etcd/etcdctl{self.suffix}.env"

    @property
    def wait_healthy(self) -> str:
        return f"{SBIN}/{self.name}-wait-healthy"

    @property
    def restart_member(self) -> str:
        return f"{SBIN}/{self.name}-restart-member"

    @property
    def backup(self) -> str:
        return f"{SBIN}/{self.name}-backup"

    @property
    def backup_unit(self) -> str:
        return f"{SYSTEMD}/{self.name}-backup.service"

    @property
    def backup_timer(self) -> str:
        return f"{SYSTEMD}/{self.name}-backup.timer"

    @property
    def local_endpoint(self) -> str:
        """The member's own client URL on the host: scripts and day-2 commands use it."""
        return f"https://127.0.0.1:{self.client_port}"

    def cert(self, kind: str) -> str:
        """The path of a member's certificate on the host, `kind` server or peer."""
        return f"{PKI}/{self.pki_prefix}{kind}"

    def pki_stem(self, host: str, kind: str) -> str:
        """The certificate's stem in the controller's PKI (roles/etcd/pki.py)."""
        return f"{host}/{self.pki_prefix}{kind}"

    def data_dir(self, cfg: EtcdConfig) -> str:
        return f"{cfg.data_dir}/{self.subdir}" if self.subdir else cfg.data_dir

    def backup_dir(self, cfg: EtcdConfig) -> str:
        return f"{cfg.backup_dir}/{self.subdir}" if self.subdir else cfg.backup_dir

    def member_name(self, loaded: LoadedCluster, host: str) -> str:
        return f"{loaded.cluster.etcd_member(host)}{self.suffix}"

    def token(self, loaded: LoadedCluster) -> str:
        return f"{loaded.cluster.name}-etcd{self.suffix}"

    def peer_url(self, loaded: LoadedCluster, host: str) -> str:
        return f"https://{loaded.cluster.hosts[host].address}:{self.peer_port}"

    def client_endpoints(self, loaded: LoadedCluster) -> list[str]:
        cluster = loaded.cluster
        return [
            f"https://{cluster.hosts[host].address}:{self.client_port}"
            for host in cluster.in_group("etcd")
        ]

    def initial_cluster(self, loaded: LoadedCluster) -> str:
        return ",".join(
            f"{self.member_name(loaded, host)}={self.peer_url(loaded, host)}"
            for host in loaded.cluster.in_group("etcd")
        )


MAIN = EtcdCluster("etcd", "etcd", ETCD_CLIENT_PORT, ETCD_PEER_PORT, ETCD_METRICS_PORT)
EVENTS = EtcdCluster(
    "etcd-events",
    "etcd Events",
    ETCD_EVENTS_CLIENT_PORT,
    ETCD_EVENTS_PEER_PORT,
    ETCD_EVENTS_METRICS_PORT,
    suffix="-events",
    subdir="events",
    pki_prefix="events-",
)


def cluster_settings(loaded: LoadedCluster) -> EtcdConfig:
    """The settings of the first member: PKI lifetimes and the Events cluster are one value for
    the whole cluster (`events_agree` in role.py refuses members that differ on the latter)."""
    members = loaded.cluster.in_group("etcd")
    return host_config(loaded, members[0], "etcd", EtcdConfig) if members else EtcdConfig()


def clusters(cfg: EtcdConfig) -> tuple[EtcdCluster, ...]:
    """The clusters these settings run: the main one, then the Events cluster when on."""
    return (MAIN, EVENTS) if cfg.events.enabled else (MAIN,)


def events_members(loaded: LoadedCluster) -> list[str]:
    """The hosts running an Events member (every etcd host, or none): monitoring scrapes them."""
    return loaded.cluster.in_group("etcd") if cluster_settings(loaded).events.enabled else []


def events_endpoints(loaded: LoadedCluster) -> list[str]:
    """The Events cluster's client URLs, for kube-apiserver's --etcd-servers-overrides; none
    when it is off."""
    return EVENTS.client_endpoints(loaded) if cluster_settings(loaded).events.enabled else []
