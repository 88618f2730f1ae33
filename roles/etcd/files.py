"""Files the etcd role manages: certificates, the unit, etcdctl's settings, backups: one set
for the main cluster and, with etcd.events on, one for the Events cluster (clusters.py)."""

from __future__ import annotations

from inventory.model import LoadedCluster
from roles.etcd.clusters import MAIN, PKI, EtcdCluster, cluster_settings, clusters
from roles.etcd.config import EtcdConfig, quota_backend_bytes
from roles.etcd.pki import KeyPair, ensure_pki, trusted_cas
from roles.etcd.release import binary_dir
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

ETCDCTL_ENV = MAIN.etcdctl_env
UNIT = MAIN.unit_file
DATA_UNIT = "/etc/systemd/system/etcd-data.service"
# Written by `gpuinfra etcd replace` (and removed after): joins an existing cluster.
INITIAL_STATE_ENV = MAIN.initial_state_env
WAIT_HEALTHY = MAIN.wait_healthy
RESTART_MEMBER = MAIN.restart_member
BACKUP = MAIN.backup
BACKUP_UNIT = MAIN.backup_unit
BACKUP_TIMER = MAIN.backup_timer


def restarting_files(etcd: EtcdCluster) -> frozenset[str]:
    """The files a cluster's members read: a change to one restarts them, one at a time. The
    others (etcdctl's settings, the scripts, the backup units, the operator's certificate, the
    other cluster's files) restart none of them."""
    certs = {f"{etcd.cert(kind)}.{ext}" for kind in ("server", "peer") for ext in ("crt", "key")}
    return frozenset({f"{PKI}/ca.crt", DATA_UNIT, etcd.unit_file, *certs})


# Where the API servers find etcd's CA and their client certificate (kubeadm's layout).
APISERVER_PKI = "/etc/kubernetes/pki"


def settings(ctx: HostContext) -> EtcdConfig:
    return ctx.config(EtcdConfig)


def pki_pairs(loaded: LoadedCluster) -> dict[str, KeyPair]:
    cfg = cluster_settings(loaded)
    return ensure_pki(
        loaded,
        cert_days=cfg.cert_days,
        ca_days=cfg.ca_days,
        renew_days=cfg.cert_renew_days,
        events=cfg.events.enabled,
    )


def member_urls(ctx: HostContext, etcd: EtcdCluster = MAIN) -> dict[str, str]:
    address = ctx.address
    return {
        "client": f"https://{address}:{etcd.client_port}",
        "peer": f"https://{address}:{etcd.peer_port}",
        "metrics": f"http://{address}:{etcd.metrics_port}",
    }


def etcd_flags(ctx: HostContext, etcd: EtcdCluster = MAIN) -> list[str]:
    """The etcd command line of one member of a cluster: every setting from the inventory and
    topology. The Events cluster's members differ only in names, ports, data and certificates."""
    cfg = settings(ctx)
    urls = member_urls(ctx, etcd)
    return [
        f"--name={etcd.member_name(ctx.loaded, ctx.name)}",
        f"--data-dir={etcd.data_dir(cfg)}",
        f"--listen-client-urls={urls['client']},{etcd.local_endpoint}",
        f"--advertise-client-urls={urls['client']}",
        f"--listen-peer-urls={urls['peer']}",
        f"--initial-advertise-peer-urls={urls['peer']}",
        f"--initial-cluster={etcd.initial_cluster(ctx.loaded)}",
        f"--initial-cluster-token={etcd.token(ctx.loaded)}",
        "--initial-cluster-state=${GPUINFRA_INITIAL_CLUSTER_STATE}",
        "--client-cert-auth=true",
        # One CA bundle for both clusters: the API server's one etcd client certificate must be
        # accepted by each, and each verified by the one --etcd-cafile (clusters.py).
        f"--trusted-ca-file={PKI}/ca.crt",
        f"--cert-file={etcd.cert('server')}.crt",
        f"--key-file={etcd.cert('server')}.key",
        "--peer-client-cert-auth=true",
        f"--peer-trusted-ca-file={PKI}/ca.crt",
        f"--peer-cert-file={etcd.cert('peer')}.crt",
        f"--peer-key-file={etcd.cert('peer')}.key",
        f"--listen-metrics-urls={urls['metrics']},http://127.0.0.1:{etcd.metrics_port}",
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
    """The files every member shares, then each cluster's own (`cluster_files`)."""
    cfg = settings(ctx)
    pairs = pki_pairs(ctx.loaded)
    operator = pairs["clients/operator"]
    disk = ctx.host.etcd.disk if ctx.host.etcd else None
    return [
        # Every CA trusted now: one, or two while `etcd rotate-ca` runs.
        ManagedFile("etcd", f"{PKI}/ca.crt", trusted_cas(ctx.loaded)),
        # The operator's client certificate: day-2 commands run etcdctl here, behind the
        # firewall that keeps the controller off the client port.
        ManagedFile("etcd", f"{PKI}/operator.crt", operator.cert_pem),
        _key(f"{PKI}/operator.key", operator.key_pem, user="root"),
        _render(ctx, cfg, DATA_UNIT, "etcd-data.service.j2", disk=disk),
        *(managed for etcd in clusters(cfg) for managed in cluster_files(ctx, etcd, pairs)),
    ]


def cluster_files(
    ctx: HostContext, etcd: EtcdCluster, pairs: dict[str, KeyPair]
) -> list[ManagedFile]:
    """One cluster's files on a member: its certificates, unit, etcdctl settings, the rolling
    restart's scripts and its snapshots' script and timer."""
    cfg = settings(ctx)
    server = pairs[etcd.pki_stem(ctx.name, "server")]
    peer = pairs[etcd.pki_stem(ctx.name, "peer")]
    member = etcd.member_name(ctx.loaded, ctx.name)

    def render(path: str, template: str, mode: str = "0644", **extra: object) -> ManagedFile:
        return _render(ctx, cfg, path, template, mode, etcd=etcd, **extra)

    return [
        ManagedFile("etcd", f"{etcd.cert('server')}.crt", server.cert_pem),
        _key(f"{etcd.cert('server')}.key", server.key_pem),
        ManagedFile("etcd", f"{etcd.cert('peer')}.crt", peer.cert_pem),
        _key(f"{etcd.cert('peer')}.key", peer.key_pem),
        render(
            etcd.etcdctl_env,
            "etcdctl.env.j2",
            endpoints=",".join(etcd.client_endpoints(ctx.loaded)),
        ),
        render(etcd.unit_file, "etcd.service.j2", flags=etcd_flags(ctx, etcd), member=member),
        render(etcd.wait_healthy, "etcd-wait-healthy.sh.j2", mode="0755"),
        render(
            etcd.restart_member,
            "etcd-restart-member.sh.j2",
            mode="0755",
            wait_healthy=etcd.wait_healthy,
        ),
        render(
            etcd.backup,
            "etcd-backup.sh.j2",
            mode="0755",
            member=member,
            backup_dir=etcd.backup_dir(cfg),
        ),
        render(etcd.backup_unit, "etcd-backup.service.j2"),
        render(etcd.backup_timer, "etcd-backup.timer.j2"),
    ]


def _render(
    ctx: HostContext, cfg: EtcdConfig, path: str, template: str, mode: str = "0644", **extra: object
) -> ManagedFile:
    content = render_template(
        f"etcd/{template}",
        cfg=cfg,
        ctx=ctx,
        cluster=ctx.cluster,
        bin_dir=binary_dir(cfg),
        **extra,
    )
    return ManagedFile("etcd", path, content, mode=mode)


def _key(path: str, pem: str, user: str = "etcd") -> ManagedFile:
    return ManagedFile("etcd", path, pem, mode="0600", user=user, group=user, secret=True)


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
