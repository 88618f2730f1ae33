"""A small cluster whose hosts are loopback addresses (127.0.0.x) where nothing listens for
SSH: commands that must stop before contacting a host can be driven against it safely."""

from __future__ import annotations

from pathlib import Path

import yaml

LOOPBACK_CLUSTER = {
    "name": "loop",
    "domain": "loop.test",
    "os": "debian-13",
    "networks": {"node": "127.0.0.0/24", "admin": ["127.0.0.0/8"]},
    "ssh": {"known_hosts": "known_hosts"},
    "api": {"vip": "127.0.0.30"},
    "hosts": {
        "etcd-1": {"address": "127.0.0.11", "groups": ["etcd"]},
        "lb-1": {"address": "127.0.0.31", "groups": ["loadbalancer"]},
        "lb-2": {"address": "127.0.0.32", "groups": ["loadbalancer"]},
        "dns-1": {"address": "127.0.0.41", "groups": ["dns"]},
        "cpu-1": {"address": "127.0.0.71", "groups": ["cpu_worker"]},
    },
}


def loopback_cluster(folder: Path, **changes) -> Path:
    """Write the loopback cluster (with `changes` to its top-level keys) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "known_hosts").touch()
    data = {**LOOPBACK_CLUSTER, **changes}
    (folder / "cluster.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder
