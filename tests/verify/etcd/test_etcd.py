"""The etcd role, checked on each member: the service, its TLS listeners that refuse clients
without a certificate, cluster health, and the data directory on its disk."""

from __future__ import annotations

import pytest

from inventory.topology import ETCD_CLIENT_PORT, ETCD_METRICS_PORT, ETCD_PEER_PORT
from roles.etcd.config import EtcdConfig

TARGET_GROUPS = ("etcd",)
CA = "--cacert /etc/etcd/pki/ca.crt"
OPERATOR = "--cert /etc/etcd/pki/operator.crt --key /etc/etcd/pki/operator.key"
ETCDCTL = "set -a; . /etc/etcd/etcdctl.env; set +a; etcdctl --endpoints=https://127.0.0.1:2379"


def settings(ctx) -> EtcdConfig:
    return ctx.config(EtcdConfig)


def test_etcd_runs_and_starts_at_boot(host) -> None:
    service = host.service("etcd")
    assert service.is_running and service.is_enabled


@pytest.mark.parametrize("port", [ETCD_CLIENT_PORT, ETCD_PEER_PORT, ETCD_METRICS_PORT])
def test_listens_on_the_member_address(host, ctx, port: int) -> None:
    assert host.socket(f"tcp://{ctx.address}:{port}").is_listening


@pytest.mark.parametrize("port", [ETCD_CLIENT_PORT, ETCD_PEER_PORT])
def test_a_request_without_a_client_certificate_is_refused(host, ctx, port: int) -> None:
    refused = host.run(f"curl -sS --max-time 5 {CA} https://{ctx.address}:{port}/version")
    assert refused.rc != 0, refused.stdout


@pytest.mark.parametrize("port", [ETCD_CLIENT_PORT, ETCD_PEER_PORT])
def test_plain_http_is_not_served(host, ctx, port: int) -> None:
    plain = host.run(f"curl -sS --max-time 5 http://{ctx.address}:{port}/version")
    assert plain.rc != 0 or "etcdserver" not in plain.stdout


def test_a_client_certificate_signed_by_the_ca_is_accepted(host, ctx) -> None:
    answer = host.check_output(
        f"curl -sS --max-time 5 {CA} {OPERATOR} https://{ctx.address}:{ETCD_CLIENT_PORT}/health"
    )
    assert '"health":"true"' in answer


def test_endpoint_health(host) -> None:
    result = host.run(f"{ETCDCTL} endpoint health")
    assert result.rc == 0 and "is healthy" in result.stdout, result.stderr


def test_whole_cluster_is_healthy(host) -> None:
    cluster_wide = 'etcdctl --endpoints="$GPUINFRA_ETCD_ENDPOINTS" endpoint health --cluster'
    result = host.run(f"set -a; . /etc/etcd/etcdctl.env; set +a; {cluster_wide}")
    assert result.rc == 0, result.stderr


def test_data_dir_is_0700_and_owned_by_etcd(host, ctx) -> None:
    data_dir = host.file(settings(ctx).data_dir)
    assert data_dir.is_directory and data_dir.mode == 0o700 and data_dir.user == "etcd"


def test_data_dir_is_its_disk_mounted_noatime(host, ctx) -> None:
    disk = ctx.host.etcd.disk if ctx.host.etcd else None
    if disk is None:
        pytest.skip("no etcd.disk in the inventory: the data directory is a plain directory")
    mount = host.check_output(
        f"findmnt -rn -o SOURCE,OPTIONS --mountpoint {settings(ctx).data_dir}"
    )
    source, options = mount.split()
    assert source == disk and "noatime" in options.split(",")


@pytest.mark.parametrize("key", ["server.key", "peer.key", "operator.key"])
def test_private_keys_are_0600(host, key: str) -> None:
    assert host.file(f"/etc/etcd/pki/{key}").mode == 0o600


def test_snapshots_are_scheduled(host) -> None:
    assert host.service("etcd-backup.timer").is_enabled
