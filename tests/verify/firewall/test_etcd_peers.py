"""Between etcd members, the peer port gets through ("open" or, before etcd runs, "refused")."""

from __future__ import annotations

from inventory.topology import ETCD_PEER_PORT
from tests.verify.probes import tcp_state

TARGET_GROUPS = ("etcd",)


def test_etcd_peer_port_reaches_the_other_members(host, cluster, ctx) -> None:
    others = [name for name in cluster.cluster.in_group("etcd") if name != ctx.name]
    states = {
        name: tcp_state(host, str(cluster.cluster.hosts[name].address), ETCD_PEER_PORT)
        for name in others
    }
    dropped = [name for name, state in states.items() if state == "filtered"]
    assert not dropped, f"etcd peer port dropped between members: {dropped}"
