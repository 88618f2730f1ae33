"""Rules across the whole cluster that a schema cannot express; each yields (key, message)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inventory.model import LoadedCluster


def check_cluster(loaded: LoadedCluster) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for rule in (
        _etcd_members,
        _unique_addresses,
        _addresses_in_node_network,
        _networks_disjoint,
        _control_plane_needs_loadbalancer,
        _gpu_specs,
        _host_sections_match_groups,
        _ssh_key,
        _teams,
    ):
        problems.extend(rule(loaded))
    return problems


def _etcd_members(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    cluster = loaded.cluster
    members = cluster.in_group("etcd")
    if members and len(members) % 2 == 0:
        yield (
            f"hosts.{members[-1]}",
            f"etcd needs an odd number of members (got {len(members)})",
        )
    if cluster.in_group("control_plane") and not members:
        yield "hosts", "control_plane nodes need an external etcd: no host is in the etcd group"


def _unique_addresses(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    owners: dict[str, str] = {}
    for name, host in loaded.cluster.hosts.items():
        address = str(host.address)
        if address in owners:
            yield f"hosts.{name}.address", f"{address} is already the address of {owners[address]}"
        else:
            owners[address] = name


def _addresses_in_node_network(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    cluster = loaded.cluster
    node = cluster.networks.node
    for name, host in cluster.hosts.items():
        if host.address not in node:
            yield f"hosts.{name}.address", f"{host.address} is outside the node network {node}"
    if cluster.api.vip is not None:
        if cluster.api.vip not in node:
            yield "api.vip", f"{cluster.api.vip} is outside the node network {node}"
        elif any(host.address == cluster.api.vip for host in cluster.hosts.values()):
            yield "api.vip", f"{cluster.api.vip} is a host's own address; pick a free one"


def _networks_disjoint(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    networks = loaded.cluster.networks
    named = [("node", networks.node), ("pod", networks.pod), ("service", networks.service)]
    for i, (name_a, net_a) in enumerate(named):
        for name_b, net_b in named[i + 1 :]:
            if net_a.overlaps(net_b):
                yield f"networks.{name_b}", f"{net_b} overlaps networks.{name_a} ({net_a})"


def _control_plane_needs_loadbalancer(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    cluster = loaded.cluster
    control_plane = cluster.in_group("control_plane")
    balancers = cluster.in_group("loadbalancer")
    # Several control-plane nodes without balancers are fine: the kubernetes role then runs a
    # proxy on every node in front of every API server (Kubespray's default).
    if len(balancers) > 1 and cluster.api.vip is None:
        yield "api.vip", f"{len(balancers)} load balancers share a virtual address: set api.vip"
    if len(control_plane) > 5:
        yield (
            f"hosts.{control_plane[-1]}",
            f"at most 5 control_plane nodes are supported (got {len(control_plane)})",
        )


def _gpu_specs(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    for name, host in loaded.cluster.hosts.items():
        is_gpu = "gpu_worker" in host.groups
        if is_gpu and host.gpu is None:
            yield f"hosts.{name}.gpu", "gpu_worker hosts need a gpu spec (model and count)"
        if not is_gpu and host.gpu is not None:
            yield f"hosts.{name}.gpu", "a gpu spec only applies to gpu_worker hosts"
        if is_gpu and "cpu_worker" in host.groups:
            yield f"hosts.{name}.groups", "a host is either a gpu_worker or a cpu_worker, not both"


def _host_sections_match_groups(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    for name, host in loaded.cluster.hosts.items():
        if host.etcd is not None and "etcd" not in host.groups:
            yield f"hosts.{name}.etcd", "etcd settings only apply to hosts in the etcd group"
        if len(set(host.groups)) != len(host.groups):
            yield f"hosts.{name}.groups", "a group is listed twice"


def _ssh_key(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    key = loaded.cluster.ssh.key
    if key is None:
        return
    path = loaded.resolve(key)
    try:
        mode = path.stat().st_mode
        with path.open("rb"):
            pass
    except OSError as exc:
        yield "ssh.key", f"cannot read {path}: {exc.strerror}"
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        yield "ssh.key", f"{path} is mode {oct(mode & 0o777)}; a private key must be 0600"
    elif not os.access(path, os.R_OK):
        yield "ssh.key", f"cannot read {path}: permission denied"


def _teams(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    """A team names known hosts and groups, and no host belongs to two teams."""
    cluster = loaded.cluster
    owner: dict[str, str] = {}
    namespace_owner: dict[str, str] = {}
    for team, spec in cluster.teams.items():
        for i, host in enumerate(spec.hosts):
            if host not in cluster.hosts:
                yield f"teams.{team}.hosts.{i}", f"unknown host {host}"
        for i, group in enumerate(spec.groups):
            if not cluster.in_group(group):
                yield f"teams.{team}.groups.{i}", f"no host is in the group {group}"
        # Each member with the entry that brought it in, so an error points at that line.
        members = [(h, f"teams.{team}.hosts.{i}") for i, h in enumerate(spec.hosts)]
        members += [
            (h, f"teams.{team}.groups.{i}")
            for i, g in enumerate(spec.groups)
            for h in cluster.in_group(g)
        ]
        for host, key in members:
            if host not in cluster.hosts:
                continue
            if not {"gpu_worker", "cpu_worker"} & set(cluster.hosts[host].groups):
                yield key, f"{host} is not a worker: team taints only make sense on workers"
            if owner.setdefault(host, team) != team:
                yield key, f"{host} is already in team {owner[host]}: a host has one team"
        for i, namespace in enumerate(spec.namespaces or [team]):
            if namespace in namespace_owner:
                yield (
                    f"teams.{team}.namespaces.{i}" if spec.namespaces else f"teams.{team}",
                    f"namespace {namespace} already belongs to team {namespace_owner[namespace]}",
                )
            namespace_owner.setdefault(namespace, team)
