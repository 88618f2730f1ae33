"""Settings that depend on the fleet's size, derived from the number of Kubernetes nodes in the
inventory (every host of control_plane, gpu_worker or cpu_worker, counted once).

A role uses a derived value only where the operator left its key unset (`None` in the role's
config); a key set in the inventory always wins (`explicit_or`). Everything here is pure: one
integer in, the figures out.

Setting, formula (n = Kubernetes nodes), reason:

kube-apiserver --max-requests-inflight      0.6 x n, at least 400, at most 3,000
    Upstream's 400 up to ~670 nodes. Large clusters run 1,500 from 1,000 to 3,000 nodes and
    3,000 past that (the 5,000-node release validation ran 1,500); 0.6 a node meets both
    (1,500 at 2,500 nodes, 3,000 at 5,000). Past 3,000 the API server's CPU is the limit, and
    more slots only queue inside it.
kube-apiserver --max-mutating-...-inflight  a third of the above, at least 200
    The same guidance keeps writes at 1:3 (1,500/500, 3,000/1,000). With API Priority and
    Fairness on (the default) the two are summed into the server's total concurrency, which
    it shares out between priority levels.
kube-apiserver watch cache                  no flag
    Sized automatically since 1.19: --default-watch-cache-size is deprecated ("watch caches
    are sized automatically and this flag will be removed") and --watch-cache-sizes only
    turns a resource's cache off (every size but 0 means the same).
etcd --quota-backend-bytes                  n x 2 MiB, in whole GiB, 2 to 8 GiB
    A node brings ~256 KiB of live objects (its Node ~16 KiB, Lease ~1 KiB, ~30 pods of
    ~8 KiB), times 8 for the revisions kept between compactions and the free pages left
    until a defragmentation: the reference design hit the 2 GiB default past 1,000 nodes.
    2 GiB is etcd's default, 8 GiB its advised maximum.
CoreDNS replicas                            ceil(n / 16), at least 2
    cluster-proportional-autoscaler's "linear" rule for kube-dns (nodesPerReplica 16; its
    256-cores-per-replica term needs core counts the inventory does not hold), never one
    replica, so one node's loss never stops name resolution.
calico-typha replicas                       none below 50 nodes; ceil(n / 200), 3 to 20
    Calico's advice for the Kubernetes datastore: past 50 nodes every calico-node watches the
    API server through Typha (its calico-typha.yaml manifest) instead of on its own, one
    replica per 200 nodes, at least three in production, no more than 20.
Calico BGP full mesh                        up to 100 nodes; route reflectors past that
    A full mesh is n(n-1)/2 BGP sessions (about 5,000 at 100 nodes, 3 million at 2,500):
    Calico's advice is the mesh to about 100 nodes, then route reflectors, each node peering
    with the reflectors only (the control-plane nodes, roles/kubernetes/cni.py).
Prometheus scrape_interval                  n x 2,000 / 100,000 s, up in 15 s steps, 15-60 s
    One Prometheus ingests ~100,000 samples/s on a monitoring host, and a node brings ~2,000
    series (node exporter after the role's drops, DCGM on GPU nodes). 15 s gives a 1-minute
    rate four samples; 60 s still gives the alerts' and dashboards' 5-minute windows five.
    Past ~3,000 nodes one Prometheus is over budget even at 60 s: shard it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from inventory.model import Cluster

# The groups whose hosts join the cluster as nodes (kubeadm init/join).
KUBERNETES_NODE_GROUPS = ("control_plane", "gpu_worker", "cpu_worker")

GIB = 2**30
MIB = 2**20

# kube-apiserver's own defaults, the floor: a small cluster keeps upstream behaviour.
UPSTREAM_READ_INFLIGHT = 400
UPSTREAM_MUTATING_INFLIGHT = 200
# 1,500 read slots at 2,500 nodes, 3,000 at 5,000: 0.6 per node, as a fraction of ten.
READ_INFLIGHT_PER_TEN_NODES = 6
# Past 3,000 the API server's CPU, not its slots, is the limit: more slots only queue inside it.
MAX_READ_INFLIGHT = 3000
# Writes get a third of the read slots (1,500/500 and 3,000/1,000 in large-cluster practice).
READS_PER_MUTATING_SLOT = 3

# What one node costs etcd, with history and free pages (see the table above).
ETCD_BYTES_PER_NODE = 2 * MIB
# etcd's own default quota and its advised maximum.
ETCD_MIN_QUOTA = 2 * GIB
ETCD_MAX_QUOTA = 8 * GIB

# cluster-proportional-autoscaler's linear rule for kube-dns: nodesPerReplica 16, and never a
# single replica (preventSinglePointFailure).
NODES_PER_COREDNS_REPLICA = 16
MIN_COREDNS_REPLICAS = 2

# Calico's advice on Typha (replicas per node, at least three, at most 20, from 50 nodes) and on
# the BGP full mesh (up to about 100 nodes).
TYPHA_FROM_NODES = 50
NODES_PER_TYPHA_REPLICA = 200
MIN_TYPHA_REPLICAS = 3
MAX_TYPHA_REPLICAS = 20
BGP_MESH_UP_TO_NODES = 100

# The scrape budget of one Prometheus and what a node adds to it.
SERIES_PER_NODE = 2000
SAMPLES_PER_SECOND_BUDGET = 100_000
SCRAPE_STEP_S = 15  # Prometheus's usual steps: 15 s, 30 s, 45 s, 60 s
MIN_SCRAPE_INTERVAL_S = 15  # a 1-minute rate still has four samples
MAX_SCRAPE_INTERVAL_S = 60  # the 5-minute rate windows keep five

T = TypeVar("T")


@dataclass(frozen=True)
class Sizing:
    """The derived figures for a fleet of `nodes` Kubernetes nodes."""

    nodes: int
    max_requests_inflight: int
    max_mutating_requests_inflight: int
    etcd_quota_backend_bytes: int
    coredns_replicas: int
    scrape_interval_s: int
    calico_typha_replicas: int
    calico_node_mesh: bool


def kubernetes_nodes(cluster: Cluster) -> int:
    """How many hosts join the cluster: a host in two node groups counts once."""
    return len({name for group in KUBERNETES_NODE_GROUPS for name in cluster.in_group(group)})


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def max_requests_inflight(nodes: int) -> int:
    derived = nodes * READ_INFLIGHT_PER_TEN_NODES // 10
    return min(MAX_READ_INFLIGHT, max(UPSTREAM_READ_INFLIGHT, derived))


def max_mutating_requests_inflight(nodes: int) -> int:
    reads = max_requests_inflight(nodes)
    return max(UPSTREAM_MUTATING_INFLIGHT, reads // READS_PER_MUTATING_SLOT)


def etcd_quota_backend_bytes(nodes: int) -> int:
    whole_gib = _ceil_div(nodes * ETCD_BYTES_PER_NODE, GIB) * GIB
    return min(ETCD_MAX_QUOTA, max(ETCD_MIN_QUOTA, whole_gib))


def coredns_replicas(nodes: int) -> int:
    return max(MIN_COREDNS_REPLICAS, _ceil_div(nodes, NODES_PER_COREDNS_REPLICA))


def scrape_interval_s(nodes: int) -> int:
    seconds = _ceil_div(nodes * SERIES_PER_NODE, SAMPLES_PER_SECOND_BUDGET)
    stepped = _ceil_div(seconds, SCRAPE_STEP_S) * SCRAPE_STEP_S
    return min(MAX_SCRAPE_INTERVAL_S, max(MIN_SCRAPE_INTERVAL_S, stepped))


def calico_typha_replicas(nodes: int) -> int:
    if nodes < TYPHA_FROM_NODES:
        return 0
    replicas = _ceil_div(nodes, NODES_PER_TYPHA_REPLICA)
    return min(MAX_TYPHA_REPLICAS, max(MIN_TYPHA_REPLICAS, replicas))


def calico_node_mesh(nodes: int) -> bool:
    return nodes <= BGP_MESH_UP_TO_NODES


def sizing(nodes: int) -> Sizing:
    return Sizing(
        nodes=nodes,
        max_requests_inflight=max_requests_inflight(nodes),
        max_mutating_requests_inflight=max_mutating_requests_inflight(nodes),
        etcd_quota_backend_bytes=etcd_quota_backend_bytes(nodes),
        coredns_replicas=coredns_replicas(nodes),
        scrape_interval_s=scrape_interval_s(nodes),
        calico_typha_replicas=calico_typha_replicas(nodes),
        calico_node_mesh=calico_node_mesh(nodes),
    )


def cluster_sizing(cluster: Cluster) -> Sizing:
    return sizing(kubernetes_nodes(cluster))


def explicit_or(explicit: T | None, derived: T) -> T:
    """The operator's value where the inventory sets the key, else the derived one."""
    return derived if explicit is None else explicit
