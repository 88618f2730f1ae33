"""From a Kubernetes worker, etcd's client and peer ports are dropped: no answer at all, not
even a reset (probes.tcp_state tells "filtered" from "refused")."""

from __future__ import annotations

import pytest

from inventory.topology import ETCD_CLIENT_PORT, ETCD_PEER_PORT
from tests.verify.probes import tcp_state

TARGET_GROUPS = ("cpu_worker", "gpu_worker")


@pytest.mark.parametrize("port", [ETCD_CLIENT_PORT, ETCD_PEER_PORT])
def test_etcd_ports_are_filtered(host, cluster, port: int) -> None:
    hosts = cluster.cluster.hosts
    states = {
        name: tcp_state(host, str(hosts[name].address), port)
        for name in cluster.cluster.in_group("etcd")
    }
    reached = {name: state for name, state in states.items() if state != "filtered"}
    assert not reached, f"etcd port {port} answered a worker: {reached}"
