"""From a control-plane node, etcd's client port gets through and its peer port does not.

"open" (etcd answers) and "refused" (a reset: the firewall let the SYN through and nothing
listens yet, e.g. before the etcd role has run) both prove the firewall admits the node;
"filtered" (no answer) means it was dropped. The check is the same before and after etcd runs:
it never passes on a dropped port, and needs no listener to prove the firewall's part."""

from __future__ import annotations

from inventory.topology import ETCD_CLIENT_PORT, ETCD_PEER_PORT
from tests.verify.probes import dropped_port_state, tcp_state

TARGET_GROUPS = ("control_plane",)


def etcd_states(host, cluster, port: int) -> dict[str, str]:
    return {
        name: tcp_state(host, str(cluster.cluster.hosts[name].address), port)
        for name in cluster.cluster.in_group("etcd")
    }


def test_etcd_client_port_is_not_filtered(host, cluster) -> None:
    states = etcd_states(host, cluster, ETCD_CLIENT_PORT)
    dropped = [name for name, state in states.items() if state == "filtered"]
    assert not dropped, f"etcd client port dropped from a control-plane node: {dropped}"


def test_etcd_peer_port_is_filtered(host, cluster) -> None:
    """Each member first answers on SSH from this node (the positive control), then its peer
    port must not answer at all."""
    states = {
        name: dropped_port_state(
            host, str(cluster.cluster.hosts[name].address), ETCD_PEER_PORT, cluster.cluster.ssh.port
        )
        for name in cluster.cluster.in_group("etcd")
    }
    reached = {name: state for name, state in states.items() if state != "filtered"}
    assert not reached, f"etcd peer port answered a control-plane node: {reached}"
