"""Files the etcd role manages: certificates, the unit, etcdctl's settings, backups."""

from __future__ import annotations

from inventory.model import LoadedCluster
from inventory.topology import ETCD_CLIENT_PORT, ETCD_METRICS_PORT, ETCD_PEER_PORT
from roles.etcd.config import EtcdConfig, quota_backend_bytes
from roles.etcd.pki import KeyPair, ensure_pki, trusted_cas
from roles.etcd.release import binary_dir
from toolkit.spec import HostContext, ManagedFile, host_config
from toolkit.templates import render_template

PKI = "/etc/etcd/pki"
ETCDCTL_ENV = "/etc/etcd/etcdctl.env"
UNIT = "/etc/systemd/system/etcd.service"
DATA_UNIT = "/etc/systemd/system/etcd-data.service"
# Written by `gpuinfra etcd replace` (and removed after): joins an existing cluster.
INITIAL_STATE_ENV = "/etc/etcd/initial-cluster-state.env"
WAIT_HEALTHY = "/usr/local/sbin/etcd-wait-healthy"
RESTART_MEMBER = "/usr/local/sbin/etcd-restart-member"
BACKUP = "/usr/local/sbin/etcd-backup"
BACKUP_UNIT = "/etc/systemd/system/etcd-backup.service"
BACKUP_TIMER = "/etc/systemd/system/etcd-backup.timer"
# Files etcd itself never reads: a change to one of them restarts no member.
NO_RESTART = frozenset(
    {
        ETCDCTL_ENV,
        f"{PKI}/operator.crt",
        f"{PKI}/operator.key",
        WAIT_HEALTHY,
        RESTART_MEMBER,
        BACKUP,
        BACKUP_UNIT,
        BACKUP_TIMER,
    }
)
# Where the API servers find etcd's CA and their client certificate (kubeadm's layout).
APISERVER_PKI = "/etc/kubernetes/pki"


def settings(ctx: HostContext) -> EtcdConfig:
    return ctx.config(EtcdConfig)


def cluster_settings(loaded: LoadedCluster) -> EtcdConfig:
    """The settings of the first member: PKI lifetimes are one value for the whole cluster."""
    members = loaded.cluster.in_group("etcd")
    return host_config(loaded, members[0], "etcd", EtcdConfig) if members else EtcdConfig()


def pki_pairs(loaded: LoadedCluster) -> dict[str, KeyPair]:
    cfg = cluster_settings(loaded)
    return ensure_pki(
        loaded, cert_days=cfg.cert_days, ca_days=cfg.ca_days, renew_days=cfg.cert_renew_days
    )


def member_urls(ctx: HostContext) -> dict[str, str]:
    address = ctx.address
    return {
        "client": f"https://{address}:{ETCD_CLIENT_PORT}",
        "peer": f"https://{address}:{ETCD_PEER_PORT}",
        "metrics": f"http://{address}:{ETCD_METRICS_PORT}",
    }


def etcd_flags(ctx: HostContext) -> list[str]:
    """The etcd command line of one member: every setting from the inventory and topology."""
    cfg = settings(ctx)
    urls = member_urls(ctx)
    return [
        f"--name={ctx.cluster.etcd_member(ctx.name)}",
        f"--data-dir={cfg.data_dir}",
        f"--listen-client-urls={urls['client']},https://127.0.0.1:{ETCD_CLIENT_PORT}",
        f"--advertise-client-urls={urls['client']}",
        f"--listen-peer-urls={urls['peer']}",
        f"--initial-advertise-peer-urls={urls['peer']}",
        f"--initial-cluster={ctx.topology.etcd_initial_cluster}",
        f"--initial-cluster-token={ctx.cluster.name}-etcd",
        "--initial-cluster-state=${GPUINFRA_INITIAL_CLUSTER_STATE}",
        "--client-cert-auth=true",
        f"--trusted-ca-file={PKI}/ca.crt",
        f"--cert-file={PKI}/server.crt",
        f"--key-file={PKI}/server.key",
        "--peer-client-cert-auth=true",
        f"--peer-trusted-ca-file={PKI}/ca.crt",
        f"--peer-cert-file={PKI}/peer.crt",
        f"--peer-key-file={PKI}/peer.key",
        f"--listen-metrics-urls={urls['metrics']},http://127.0.0.1:{ETCD_METRICS_PORT}",
        f"--quota-backend-bytes={quota_backend_bytes(cfg, ctx.cluster)}",
        f"--auto-compaction-mode={cfg.auto_compaction_mode}",
        f"--auto-compaction-retention={cfg.auto_compaction_retention}",
        f"--heartbeat-interval={cfg.heartbeat_interval_ms}",
        f"--election-timeout={cfg.election_timeout_ms}",
        f"--snapshot-count={cfg.snapshot_count}",
        "--experimental-initial-corrupt-check=true",
        "--logger=zap",
    ]


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = settings(ctx)
    pairs = pki_pairs(ctx.loaded)
    server, peer = pairs[f"{ctx.name}/server"], pairs[f"{ctx.name}/peer"]
    operator = pairs["clients/operator"]
    disk = ctx.host.etcd.disk if ctx.host.etcd else None
    bin_dir = binary_dir(cfg)

    def render(path: str, template: str, mode: str = "0644", **extra: object) -> ManagedFile:
        content = render_template(
            f"etcd/{template}", cfg=cfg, ctx=ctx, cluster=ctx.cluster, bin_dir=bin_dir, **extra
        )
        return ManagedFile("etcd", path, content, mode=mode)

    def key(path: str, pem: str, user: str = "etcd") -> ManagedFile:
        return ManagedFile("etcd", path, pem, mode="0600", user=user, group=user, secret=True)

    return [
        # Every CA trusted now: one, or two while `etcd rotate-ca` runs.
        ManagedFile("etcd", f"{PKI}/ca.crt", trusted_cas(ctx.loaded)),
        ManagedFile("etcd", f"{PKI}/server.crt", server.cert_pem),
        key(f"{PKI}/server.key", server.key_pem),
        ManagedFile("etcd", f"{PKI}/peer.crt", peer.cert_pem),
        key(f"{PKI}/peer.key", peer.key_pem),
        # The operator's client certificate: day-2 commands run etcdctl here, behind the
        # firewall that keeps the controller off the client port.
        ManagedFile("etcd", f"{PKI}/operator.crt", operator.cert_pem),
        key(f"{PKI}/operator.key", operator.key_pem, user="root"),
        render(
            ETCDCTL_ENV, "etcdctl.env.j2", endpoints=",".join(ctx.topology.etcd_client_endpoints)
        ),
        render(DATA_UNIT, "etcd-data.service.j2", disk=disk),
        render(UNIT, "etcd.service.j2", flags=etcd_flags(ctx)),
        render(WAIT_HEALTHY, "etcd-wait-healthy.sh.j2", mode="0755"),
        render(RESTART_MEMBER, "etcd-restart-member.sh.j2", mode="0755", wait_healthy=WAIT_HEALTHY),
        render(BACKUP, "etcd-backup.sh.j2", mode="0755", member=ctx.cluster.etcd_member(ctx.name)),
        render(BACKUP_UNIT, "etcd-backup.service.j2"),
        render(BACKUP_TIMER, "etcd-backup.timer.j2"),
    ]


def client_files(ctx: HostContext) -> list[ManagedFile]:
    """What an API server needs to reach etcd: the CA and its client certificate."""
    pairs = pki_pairs(ctx.loaded)
    client = pairs["clients/kube-apiserver-etcd-client"]
    return [
        ManagedFile("etcd", f"{APISERVER_PKI}/etcd/ca.crt", trusted_cas(ctx.loaded)),
        ManagedFile("etcd", f"{APISERVER_PKI}/apiserver-etcd-client.crt", client.cert_pem),
        ManagedFile(
            "etcd",
            f"{APISERVER_PKI}/apiserver-etcd-client.key",
            client.key_pem,
            mode="0600",
            secret=True,
        ),
    ]
