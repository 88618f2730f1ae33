"""Which hosts a run takes: --limit (host or group names), then --shard."""

from __future__ import annotations

from collections.abc import Iterable

from engine.reports import RunOptions
from inventory.model import LoadedCluster


def select_hosts(loaded: LoadedCluster, limit: Iterable[str]) -> list[str]:
    """Hosts named by --limit (host names or group names), in inventory order."""
    wanted = set(limit)
    if not wanted:
        return list(loaded.cluster.hosts)
    return [
        name
        for name, host in loaded.cluster.hosts.items()
        if name in wanted or wanted.intersection(host.groups)
    ]


def shard_hosts(hosts: list[str], index: int, count: int) -> list[str]:
    """Shard `index` of `count` (0-based, as a Kubernetes Indexed Job numbers its pods): the
    hosts whose position in name order is `index` modulo `count`. Every host falls in exactly
    one shard, shards differ in size by one host at most, and the split depends only on the
    host names, so runners that each take one index check the whole fleet once."""
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is not in 0..{count - 1}")
    mine = set(sorted(hosts)[index::count])
    return [name for name in hosts if name in mine]


def selected_hosts(loaded: LoadedCluster, options: RunOptions) -> tuple[list[str], list[str]]:
    """The run's hosts in inventory order, and a note saying which shard they are."""
    hosts = select_hosts(loaded, options.limit)
    if not options.shard:
        return hosts, []
    selected = len(hosts)
    hosts = shard_hosts(hosts, *options.shard)
    index, count = options.shard
    return hosts, [f"shard {index}/{count}: {len(hosts)} of {selected} hosts"]
