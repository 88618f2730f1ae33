"""The etcd role's Events cluster (etcd.events), checked on each member: its service, its TLS
listeners, its health, its data directory on the main member's disk, its snapshots, and no
Event left in the main store."""

from __future__ import annotations

import pytest

from inventory.topology import (
    ETCD_EVENTS_CLIENT_PORT,
    ETCD_EVENTS_METRICS_PORT,
    ETCD_EVENTS_PEER_PORT,
)
from roles.etcd.config import EtcdConfig

TARGET_GROUPS = ("etcd",)
CA = "--cacert /etc/etcd/pki/ca.crt"
EVENTS_ENV = "set -a; . /etc/etcd/etcdctl-events.env; set +a;"
MAIN_ENV = "set -a; . /etc/etcd/etcdctl.env; set +a;"


@pytest.fixture(autouse=True)
def _events_cluster_on(ctx) -> None:
    if not ctx.config(EtcdConfig).events.enabled:
        pytest.skip("etcd.events is off in this inventory: no Events cluster to check")


def test_the_events_member_runs_and_starts_at_boot(host) -> None:
    service = host.service("etcd-events")
    assert service.is_running and service.is_enabled


def test_events_snapshots_are_scheduled(host) -> None:
    assert host.service("etcd-events-backup.timer").is_enabled


@pytest.mark.parametrize(
    "port", [ETCD_EVENTS_CLIENT_PORT, ETCD_EVENTS_PEER_PORT, ETCD_EVENTS_METRICS_PORT]
)
def test_listens_on_the_member_address(host, ctx, port: int) -> None:
    assert host.socket(f"tcp://{ctx.address}:{port}").is_listening


@pytest.mark.parametrize("port", [ETCD_EVENTS_CLIENT_PORT, ETCD_EVENTS_PEER_PORT])
def test_a_request_without_a_client_certificate_is_refused(host, ctx, port: int) -> None:
    refused = host.run(f"curl -sS --max-time 5 {CA} https://{ctx.address}:{port}/version")
    assert refused.rc != 0, refused.stdout


def test_the_api_servers_client_certificate_is_accepted(host, ctx) -> None:
    """The API server reaches both clusters with its one etcd client certificate; the
    operator's is signed by the same CA, so it stands in for it here."""
    operator = "--cert /etc/etcd/pki/operator.crt --key /etc/etcd/pki/operator.key"
    url = f"https://{ctx.address}:{ETCD_EVENTS_CLIENT_PORT}/health"
    answer = host.check_output(f"curl -sS --max-time 5 {CA} {operator} {url}")
    assert '"health":"true"' in answer


def test_the_whole_events_cluster_is_healthy(host) -> None:
    cluster_wide = 'etcdctl --endpoints="$GPUINFRA_ETCD_ENDPOINTS" endpoint health --cluster'
    result = host.run(f"{EVENTS_ENV} {cluster_wide}")
    assert result.rc == 0, result.stderr


def test_events_data_is_0700_on_the_main_members_disk(host, ctx) -> None:
    main = ctx.config(EtcdConfig).data_dir
    events = host.file(f"{main}/events")
    assert events.is_directory and events.mode == 0o700 and events.user == "etcd"
    devices = host.check_output(f"stat -c %d {main} {main}/events").split()
    assert devices[0] == devices[1]


def test_the_main_store_holds_no_event(host) -> None:
    local = "--endpoints=https://127.0.0.1:2379"
    keys = host.check_output(
        f"{MAIN_ENV} etcdctl {local} get /registry/events/ --prefix --keys-only --limit 1"
    )
    assert keys.strip() == ""


@pytest.mark.parametrize("key", ["events-server.key", "events-peer.key"])
def test_private_keys_are_0600(host, key: str) -> None:
    assert host.file(f"/etc/etcd/pki/{key}").mode == 0o600
