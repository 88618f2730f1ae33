"""The cluster inventory (cluster.yml) of a lab, loadable by inventory.loader like any other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from inventory.building import build
from inventory.model import LoadedCluster
from lab import aptcache, rootfs
from lab.state import LabState
from lab.topology import DISK_DEVICE, LAB_GPU_COUNT, LAB_GPU_MODEL
from roles.statefiles import write_atomically

HEADER = """\
# Written by `gpuinfra lab up --name {name}`; rewritten on every `up`, do not edit.
# Hosts are systemd-nspawn containers on this machine running Debian 13 (trixie), with
# addresses in {subnet} (198.18.0.0/15 is reserved for benchmarks and never routed).
# The key and known_hosts live in the lab's state folder, outside the repository.
"""
GPU_COMMENT = "# lab host: no GPU inside; the spec only makes it a valid gpu_worker"


def inventory_data(state: LabState) -> dict[str, Any]:
    """The lab as plain cluster.yml data, with absolute paths to its key and known_hosts."""
    hosts: dict[str, Any] = {}
    for _, spec, address in state.hosts():
        host: dict[str, Any] = {"address": str(address), "groups": list(spec.groups)}
        if spec.gpu:
            host["gpu"] = {"model": LAB_GPU_MODEL, "count": LAB_GPU_COUNT}
        if spec.disk_bytes and "etcd" in spec.groups:
            host["etcd"] = {"disk": DISK_DEVICE}
        hosts[spec.name] = host
    data: dict[str, Any] = {
        "name": state.name,
        "domain": state.domain,
        "os": "debian-13",
        # The controller reaches the hosts from the bridge's gateway address: the firewall role
        # admits SSH only from admin networks (and the node network), so name it explicitly.
        "networks": {"node": str(state.subnet), "admin": [f"{state.gateway}/32"]},
        "ssh": {
            "user": "root",
            "key": str(state.private_key),
            "known_hosts": str(state.known_hosts),
        },
    }
    if state.vip is not None:
        data["api"] = {"vip": str(state.vip)}
    # Docker's own repository is out of reach from the lab: Debian 13's docker.io and containerd.
    # kubeadm, kubelet and the API server cannot be obtained from the lab (no Kubernetes
    # repository, no release downloads): the kubernetes role is off; its lab tests turn it on
    # against a stand-in kubeadm (tests/integration/test_role_kubernetes.py).
    data["group_vars"] = {
        "all": {
            "base": _base_settings(str(state.gateway)),
            "container_runtime": {"source": "distribution"},
            # kubeadm cannot be had on these machines: the kubernetes role is off in the lab.
            "kubernetes": {"enabled": False},
        }
    }
    if any("etcd" in spec.groups for _, spec, _ in state.hosts()):
        # GitHub's releases are unreachable from the lab: Debian 13's etcd-server 3.5.16. The
        # lab's disks are loop files sharing the machine's one disk (fsync p99 about 20 ms
        # measured): the disk gate runs and its result is in the run report, but cannot pass.
        data["group_vars"]["etcd"] = {
            "etcd": {"source": "distribution", "disk_gate_override": True}
        }
    data["hosts"] = hosts
    return data


def _base_settings(gateway: str) -> dict[str, Any]:
    """The base role manages /etc/hosts and apt sources: keep the lab's mirror in both, or the
    hosts (which have no DNS) lose their packages on the first apply. With apt-cacher-ng on
    the machine, apt goes through the lab's package cache (lab/aptcache.py): each package is
    fetched from the mirror once for all hosts and all labs."""
    mirror = rootfs.machine_mirror()
    settings: dict[str, Any] = {
        "apt_mirror": mirror.archive,
        "extra_hosts": {name: address for address, name in rootfs.resolve_mirror(mirror)},
    }
    if mirror.security:
        settings["apt_security_mirror"] = mirror.security
    if aptcache.available():
        settings["apt_proxy"] = aptcache.proxy_url(gateway)
    return settings


def render_inventory(state: LabState) -> str:
    """cluster.yml text: the data, a header saying where it came from, and why GPUs are fake."""
    data = inventory_data(state)
    hosts = data.pop("hosts")
    text = HEADER.format(name=state.name, subnet=state.subnet)
    text += yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    text += "hosts:\n"
    for name, host in hosts.items():
        text += f"  {name}:\n"
        body = yaml.safe_dump(host, sort_keys=False, default_flow_style=None)
        for line in body.splitlines():
            if line.startswith("gpu:"):
                text += f"    {GPU_COMMENT}\n"
            text += f"    {line}\n"
    return text


def write_inventory(state: LabState, path: Path) -> Path:
    path = path.absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, render_inventory(state).encode())
    return path


def loaded_cluster(state: LabState) -> LoadedCluster:
    """The validated cluster of a lab, without needing its file (for `lab ssh` and status)."""
    source = state.inventory_path or (state.names.state_dir / "cluster.yml")
    return build(inventory_data(state), source=source, base_dir=source.parent)
