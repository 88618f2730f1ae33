"""The API servers' side of etcd: the CA and a client certificate that etcd accepts."""

from __future__ import annotations

import pytest

from roles.etcd.clusters import MAIN, events_endpoints

TARGET_GROUPS = ("control_plane",)
PKI = "/etc/kubernetes/pki"


def test_client_key_is_0600(host) -> None:
    assert host.file(f"{PKI}/apiserver-etcd-client.key").mode == 0o600


def _refused(host, endpoints: list[str]) -> list[str]:
    refused = []
    for endpoint in endpoints:
        answer = host.run(
            f"curl -sS --max-time 5 --cacert {PKI}/etcd/ca.crt "
            f"--cert {PKI}/apiserver-etcd-client.crt --key {PKI}/apiserver-etcd-client.key "
            f"{endpoint}/health"
        )
        if '"health":"true"' not in answer.stdout:
            refused.append(endpoint)
    return refused


def test_the_client_certificate_opens_every_member(host, cluster) -> None:
    refused = _refused(host, MAIN.client_endpoints(cluster))
    assert not refused, f"members not healthy or refusing the API server: {refused}"


def test_the_client_certificate_opens_every_events_member(host, cluster) -> None:
    """kube-apiserver reaches --etcd-servers-overrides with the same client settings."""
    endpoints = events_endpoints(cluster)
    if not endpoints:
        pytest.skip("etcd.events is off in this inventory: no Events cluster to reach")
    refused = _refused(host, endpoints)
    assert not refused, f"Events members not healthy or refusing the API server: {refused}"
