"""Large cluster inventories for the scale benchmarks: N hosts in the reference design's shape.

The shape follows the sample inventory and the reference design (ANCHORS.md): five etcd
members on local NVMe, five API servers, two load balancers sharing a virtual address, three
DNS servers, two monitoring hosts, then the workers, seven GPU workers for every CPU worker.
Addresses are 10.64.0.0/17 (32,000 hosts of room), one /24 per 250 workers, so the reverse
zones and firewall sets look like a real flat routed network's.

`python -m benchmarks.fleet 7500 --out build/fleet/7500` writes OUT/cluster.yml.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path
from typing import Any

NODE_NETWORK = ipaddress.IPv4Network("10.64.0.0/17")
# Control-plane hosts live in 10.64.0.0/24, workers from 10.64.1.0 on, 250 per /24.
SERVICES = (
    ("etcd", 5),
    ("cp", 5),
    ("lb", 2),
    ("dns", 3),
    ("mon", 2),
)
GROUP_OF = {
    "etcd": "etcd",
    "cp": "control_plane",
    "lb": "loadbalancer",
    "dns": "dns",
    "mon": "monitoring",
}
GPU_SHARE = 7  # of every 8 workers
WORKERS_PER_SUBNET = 250


def fleet_data(hosts: int, name: str = "fleet") -> dict[str, Any]:
    """Cluster data with `hosts` hosts in total (at least the 17 service hosts)."""
    services = sum(count for _, count in SERVICES)
    if hosts < services:
        raise ValueError(f"a fleet needs at least {services} hosts (got {hosts})")
    base = int(NODE_NETWORK.network_address)
    entries: dict[str, Any] = {}
    offset = 11
    for prefix, count in SERVICES:
        for i in range(1, count + 1):
            host: dict[str, Any] = {
                "address": str(ipaddress.IPv4Address(base + offset)),
                "groups": [GROUP_OF[prefix]],
            }
            if prefix == "etcd":
                host["etcd"] = {"disk": "/dev/nvme1n1"}
            entries[f"{prefix}-{i}"] = host
            offset += 1
    for i in range(hosts - services):
        subnet, index = divmod(i, WORKERS_PER_SUBNET)
        address = ipaddress.IPv4Address(base + (subnet + 1) * 256 + 10 + index)
        if i % 8 < GPU_SHARE:
            entries[f"gpu-{i + 1:05d}"] = {
                "address": str(address),
                "groups": ["gpu_worker"],
                "gpu": {"model": "H100-SXM5-80GB", "count": 8},
            }
        else:
            entries[f"cpu-{i + 1:05d}"] = {"address": str(address), "groups": ["cpu_worker"]}
    return {
        "name": name,
        "domain": f"{name}.gpu.internal",
        "os": "ubuntu-22.04",
        "networks": {
            "node": str(NODE_NETWORK),
            "pod": "10.128.0.0/12",
            "service": "10.96.0.0/16",
            "admin": ["10.10.0.0/24"],
        },
        "ssh": {"user": "root", "known_hosts": "~/.ssh/known_hosts"},
        "api": {"vip": str(ipaddress.IPv4Address(base + 10)), "port": 6443},
        "group_vars": {
            "all": {"base": {"ntp_servers": [f"ntp1.{name}.gpu.internal"]}},
            "gpu_worker": {"kernel": {"transparent_hugepages": "madvise"}},
        },
        "hosts": entries,
    }


def fleet_text(hosts: int, name: str = "fleet") -> str:
    """cluster.yml text, written the way people write inventories (block style, one host per
    few lines), so the parser's cost is that of a real file."""
    import yaml

    data = fleet_data(hosts, name)
    entries = data.pop("hosts")
    text = f"# {hosts}-host fleet written by benchmarks/fleet.py for the scale benchmarks.\n"
    text += yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    text += "hosts:\n"
    for host_name, host in entries.items():
        text += f"  {host_name}:\n"
        for line in yaml.safe_dump(host, sort_keys=False, default_flow_style=None).splitlines():
            text += f"    {line}\n"
    return text


def write_fleet(hosts: int, out: Path, name: str = "fleet") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cluster.yml"
    path.write_text(fleet_text(hosts, name))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__)
    parser.add_argument("hosts", type=int)
    parser.add_argument("--out", type=Path, required=True, help="folder for cluster.yml")
    parser.add_argument("--name", default="fleet")
    args = parser.parse_args(argv)
    print(write_fleet(args.hosts, args.out, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
