"""Derive what the roles need from a validated cluster: endpoints, DNS records, firewall peers."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

from inventory.model import Cluster

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
ETCD_METRICS_PORT = 2381  # plain-HTTP /metrics listener, so Prometheus needs no client cert
# The Events cluster (etcd.events, opt-in) beside the main members on the same hosts: Kubespray's
# ports for its etcd-events (peer 2382, client 2383), the next free ones after the main three,
# so an operator coming from Kubespray reads them at once; metrics on the one after.
ETCD_EVENTS_PEER_PORT = 2382
ETCD_EVENTS_CLIENT_PORT = 2383
ETCD_EVENTS_METRICS_PORT = 2384
KUBELET_PORT = 10250
# kube-scheduler's and kube-controller-manager's secure ports (their /metrics and health).
KUBE_SCHEDULER_PORT = 10259
KUBE_CONTROLLER_MANAGER_PORT = 10257
BGP_PORT = 179  # Calico (kubernetes role) routes pod CIDRs natively over BGP between nodes
NODE_EXPORTER_PORT = 9100
DNS_PORT = 53
HAPROXY_STATS_PORT = 8404
PROMETHEUS_PORT = 9090
DCGM_EXPORTER_PORT = 9400  # NVIDIA's GPU metrics exporter on every GPU node


@dataclass(frozen=True)
class DNSRecord:
    name: str  # relative to its zone ("etcd-1", "_etcd-server-ssl._tcp") or "@"
    type: str  # A, PTR, SRV
    value: str


@dataclass(frozen=True)
class Backend:
    name: str
    address: str
    port: int


@dataclass(frozen=True)
class FirewallRule:
    """Inbound traffic one group's hosts accept: a port from a set of sources."""

    description: str
    port: int | None  # None for a protocol without ports (VRRP)
    protocol: str  # tcp, udp or vrrp
    sources: tuple[str, ...]  # addresses and CIDRs, collapsed and sorted (see collapse_sources)


@dataclass(frozen=True)
class Topology:
    etcd_initial_cluster: str
    etcd_client_endpoints: tuple[str, ...]
    api_address: str  # what clients dial: the VIP, the single balancer, or the only API server
    api_endpoint: str  # api.<domain>:port
    api_backends: tuple[Backend, ...]
    dns_primary: str | None
    dns_secondaries: tuple[str, ...]
    forward_zone: str
    reverse_zones: dict[str, tuple[DNSRecord, ...]]
    forward_records: tuple[DNSRecord, ...]
    # group -> rules; a host gets the union of its groups' rules plus the "all" rules. Filled
    # from every role's ports by the roles' layer (engine/context.py `topology_of`).
    firewall: dict[str, tuple[FirewallRule, ...]] = field(default_factory=dict)

    def rules_for(self, groups: list[str]) -> list[FirewallRule]:
        """The rules of these groups (a host's groups and its `host_rules_key`) and "all"."""
        seen: dict[tuple[int, str, tuple[str, ...]], FirewallRule] = {}
        for group in ["all", *groups]:
            for rule in self.firewall.get(group, ()):
                seen.setdefault((rule.port or 0, rule.protocol, rule.sources), rule)
        return [seen[key] for key in sorted(seen)]


def host_rules_key(name: str) -> str:
    """The key of one host's own firewall rules in a role's ports (where a group's name goes):
    the drift Job's rule is on its fleet-ops nodes only. No group name holds a colon."""
    return f"host:{name}"


def build_topology(cluster: Cluster) -> Topology:
    def address(name: str) -> str:
        return str(cluster.hosts[name].address)

    etcd = cluster.in_group("etcd")
    control_plane = cluster.in_group("control_plane")
    balancers = cluster.in_group("loadbalancer")
    dns = cluster.in_group("dns")

    if cluster.api.vip is not None:
        api_address = str(cluster.api.vip)
    elif balancers:
        api_address = address(balancers[0])
    elif control_plane:
        api_address = address(control_plane[0])
    else:
        api_address = ""

    return Topology(
        etcd_initial_cluster=",".join(
            f"{cluster.etcd_member(name)}=https://{address(name)}:{ETCD_PEER_PORT}" for name in etcd
        ),
        etcd_client_endpoints=tuple(f"https://{address(name)}:{ETCD_CLIENT_PORT}" for name in etcd),
        api_address=api_address,
        api_endpoint=f"api.{cluster.domain}:{cluster.api.port}",
        api_backends=tuple(
            Backend(name, address(name), cluster.api.port) for name in control_plane
        ),
        dns_primary=dns[0] if dns else None,
        dns_secondaries=tuple(dns[1:]),
        forward_zone=cluster.domain,
        forward_records=_forward_records(cluster, api_address),
        reverse_zones=_reverse_zones(cluster),
    )


def _forward_records(cluster: Cluster, api_address: str) -> tuple[DNSRecord, ...]:
    records = [DNSRecord(name, "A", str(host.address)) for name, host in cluster.hosts.items()]
    if api_address:
        records.append(DNSRecord("api", "A", api_address))
    # RFC 2782 SRV: priority weight port target; etcd's DNS discovery reads these names.
    for name in cluster.in_group("etcd"):
        fqdn = f"{cluster.fqdn(name)}."
        records.append(DNSRecord("_etcd-server-ssl._tcp", "SRV", f"0 0 {ETCD_PEER_PORT} {fqdn}"))
        records.append(DNSRecord("_etcd-client-ssl._tcp", "SRV", f"0 0 {ETCD_CLIENT_PORT} {fqdn}"))
    return tuple(records)


def reverse_zone_name(address: ipaddress.IPv4Address) -> str:
    """The /24 in-addr.arpa zone holding an address (classful delegation keeps zones simple)."""
    a, b, c, _ = str(address).split(".")
    return f"{c}.{b}.{a}.in-addr.arpa"


def _reverse_zones(cluster: Cluster) -> dict[str, tuple[DNSRecord, ...]]:
    zones: dict[str, list[DNSRecord]] = {}
    for name, host in cluster.hosts.items():
        last_octet = str(host.address).rsplit(".", 1)[1]
        zones.setdefault(reverse_zone_name(host.address), []).append(
            DNSRecord(last_octet, "PTR", f"{cluster.fqdn(name)}.")
        )
    return {zone: tuple(records) for zone, records in sorted(zones.items())}


def collapse_sources(sources: Iterable[str]) -> tuple[str, ...]:
    """Addresses and CIDRs without those another one already covers, sorted, single addresses
    without "/32": nftables refuses overlapping intervals in one set (an admin address inside the
    node network, say). Neighbours are not merged, so a rule still names each peer."""
    networks = sorted(
        {ipaddress.IPv4Network(source, strict=False) for source in sources},
        key=lambda net: (net.prefixlen, net),
    )
    # Widest first: a network is covered when its address, cut to the prefix of a network kept
    # before it, is that network. One lookup per distinct prefix length, not per kept network,
    # so a group of thousands of hosts costs linear time.
    kept: list[ipaddress.IPv4Network] = []
    kept_keys: set[tuple[int, int]] = set()
    prefixes: list[int] = []
    for net in networks:
        address = int(net.network_address)
        if any((address >> (32 - p) << (32 - p), p) in kept_keys for p in prefixes):
            continue
        kept.append(net)
        kept_keys.add((address, net.prefixlen))
        if net.prefixlen not in prefixes:
            prefixes.append(net.prefixlen)
    return tuple(
        str(net.network_address) if net.prefixlen == 32 else str(net) for net in sorted(kept)
    )


def api_clients(cluster: Cluster) -> tuple[str, ...]:
    """Who may reach the Kubernetes API: nodes, admins, and pods (they reach it through the
    kubernetes Service, DNAT'd to an API server with the pod's own address as the source)."""
    networks = cluster.networks
    return collapse_sources([str(networks.node), str(networks.pod), *map(str, networks.admin)])


def host_addresses(cluster: Cluster, names: Iterable[str]) -> tuple[str, ...]:
    """The hosts' addresses as firewall sources (collapsed and sorted, see collapse_sources)."""
    return collapse_sources(str(cluster.hosts[name].address) for name in names)


def pod_block(cluster: Cluster, name: str, prefix: int) -> ipaddress.IPv4Network:
    """A node's pod block in "routes" mode (kubernetes.routes_block_prefix): the block whose
    number is the node's offset in the node network, so it never moves when the inventory adds
    or removes other hosts. Here, not in the kubernetes role, since the drift_job role's
    firewall rule names it too and a role never imports another."""
    pods, nodes = cluster.networks.pod, cluster.networks.node
    offset = int(cluster.hosts[name].address) - int(nodes.network_address)
    blocks = list(pods.subnets(new_prefix=prefix))
    if offset >= len(blocks):
        raise ValueError(
            f"networks.pod {pods} holds {len(blocks)} /{prefix} blocks, too few "
            f"for node {name} at offset {offset} of networks.node {nodes} (cni: routes)"
        )
    return blocks[offset]
