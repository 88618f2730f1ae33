"""From a Kubernetes worker, etcd's client and peer ports are dropped: no answer at all, not
even a reset (probes.tcp_state tells "filtered" from "refused"). Each probe comes right after
a positive control: the same member answers on SSH from the same worker."""

from __future__ import annotations

import pytest

from inventory.topology import ETCD_CLIENT_PORT, ETCD_PEER_PORT
from tests.verify.probes import dropped_port_state

TARGET_GROUPS = ("cpu_worker", "gpu_worker")


@pytest.mark.parametrize("port", [ETCD_CLIENT_PORT, ETCD_PEER_PORT])
def test_etcd_ports_are_filtered(host, cluster, port: int) -> None:
    hosts = cluster.cluster.hosts
    states = {
        name: dropped_port_state(host, str(hosts[name].address), port, cluster.cluster.ssh.port)
        for name in cluster.cluster.in_group("etcd")
    }
    reached = {name: state for name, state in states.items() if state != "filtered"}
    assert not reached, f"etcd port {port} answered a worker: {reached}"
