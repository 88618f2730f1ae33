"""The API servers' side of etcd: the CA and a client certificate that etcd accepts."""

from __future__ import annotations

TARGET_GROUPS = ("control_plane",)
PKI = "/etc/kubernetes/pki"


def test_client_key_is_0600(host) -> None:
    assert host.file(f"{PKI}/apiserver-etcd-client.key").mode == 0o600


def test_the_client_certificate_opens_every_member(host, cluster, topology) -> None:
    refused = []
    for endpoint in topology.etcd_client_endpoints:
        answer = host.run(
            f"curl -sS --max-time 5 --cacert {PKI}/etcd/ca.crt "
            f"--cert {PKI}/apiserver-etcd-client.crt --key {PKI}/apiserver-etcd-client.key "
            f"{endpoint}/health"
        )
        if '"health":"true"' not in answer.stdout:
            refused.append(endpoint)
    assert not refused, f"members not healthy or refusing the API server: {refused}"
