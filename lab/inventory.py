"""The cluster inventory (cluster.yml) of a lab, loadable by inventory.loader like any other."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import yaml

from inventory.building import build
from inventory.model import LoadedCluster
from lab import aptcache, offline, rootfs
from lab.state import LabState
from lab.topology import DISK_DEVICE, LAB_GPU_COUNT, LAB_GPU_MODEL, disk_id
from toolkit.statefiles import write_atomically

HEADER = """\
# Written by `gpuinfra lab up --name {name}`; rewritten on every `up`, do not edit.
# Hosts are systemd-nspawn containers on this machine running Debian 13 (trixie), with
# addresses in {subnet} (198.18.0.0/15 is reserved for benchmarks and never routed).
# The key and known_hosts live in the lab's state folder, outside the repository.
"""
GPU_COMMENT = "# lab host: no GPU inside; the spec only makes it a valid gpu_worker"
# Every setting in which a lab's inventory differs from the sample (hosts, addresses and the
# SSH key aside), each with why the lab needs it: the sample is what a user copies, so anything
# else the lab ran would be a difference the user never applied. tests/unit/test_lab_only.py
# derives the differences and holds them to this list (a key covers the settings under it).
LAB_ONLY: dict[str, str] = {
    "os": "lab hosts are systemd-nspawn containers of Debian 13, the machine's own release",
    "versions.etcd": "Debian 13's etcd-server where the lab runs no Kubernetes and asks for "
    "no build: the second etcd line gpuinfra supports, tested there",
    "versions.containerd": "Debian 13's containerd where the lab runs no Kubernetes (no build)",
    "group_vars.all.base": "the machine's apt mirror, its address in /etc/hosts (no DNS in "
    "the hosts) and the lab's apt cache",
    "group_vars.all.container_runtime": "containerd from this machine's build on the lab's "
    "file server, the registry mirror (plain HTTP on the lab's bridge, allowed on purpose), "
    "and runc on the machine's cgroup v1 without CAP_SYS_RESOURCE",
    "group_vars.all.kubernetes": "Kubernetes from this machine's build on the lab's file "
    "server; cni: routes (Calico's BIRD cannot run in a lab host), kube-proxy in nftables "
    "mode (no IPVS modules), conntrack left to the machine, cgroup v1 (cgroupfs, "
    "fail_cgroup_v1: false taken on purpose with accept_unsafe, SystemVerification ignored), "
    "kubelet's disk eviction margins in bytes (the nodes' disk is the machine's, mostly "
    "reserved to root)",
    "group_vars.all.gpu_health": "gpuinfra's own image from the lab's registry",
    "group_vars.all.shared_fs": "Ceph sized for one shared disk and the machine's memory",
    "group_vars.etcd": "etcd from this machine's build (or Debian's package) and the disk gate "
    "overridden: loop-file disks cannot pass it",
}
# Debian 13's etcd-server and containerd, what a lab without Kubernetes installs (source:
# distribution); a lab with Kubernetes runs the versions built here (lab/offline.py).
DEBIAN_ETCD = "3.5.16"
DEBIAN_CONTAINERD = "1.7.24"


def inventory_data(state: LabState) -> dict[str, Any]:
    """The lab as plain cluster.yml data, with absolute paths to its key and known_hosts."""
    hosts: dict[str, Any] = {}
    for _, spec, address in state.hosts():
        host: dict[str, Any] = {"address": str(address), "groups": list(spec.groups)}
        if spec.gpu:
            host["gpu"] = {"model": LAB_GPU_MODEL, "count": LAB_GPU_COUNT}
            host["vars"] = {"fabric": _fabric_standin(address)}
        if spec.disk_bytes and "etcd" in spec.groups:
            host["etcd"] = {"disk": DISK_DEVICE}
        elif spec.disk_bytes and {"gpu_worker", "cpu_worker"} & set(spec.groups):
            # A worker's first disk is its data volume (the data_disks role), by its stable
            # name; further disks stay free for tests that need a disk of their own.
            volume = {"name": "data", "layout": "single", "disks": [disk_id(DISK_DEVICE)]}
            host.setdefault("vars", {})["data_disks"] = {"volumes": [volume]}
        if spec.disk_bytes and "storage" in spec.groups:
            host.setdefault("vars", {})["shared_fs"] = {"osd_device": DISK_DEVICE}
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
    # Kubernetes comes from this machine's own builds (lab/gobuild.py), served by the lab's file
    # server and registry (lab/offline.py); a lab without Kubernetes nodes leaves the role off.
    published = offline.published() if state.runs_kubernetes_nodes else None
    gateway = str(state.gateway)
    data["group_vars"] = {
        "all": {
            "base": _base_settings(gateway),
            "container_runtime": _runtime_settings(gateway, published),
            "kubernetes": _kubernetes_settings(gateway, published),
        }
    }
    # A lab-only pin: the inventory's defaults (inventory/versions.py) are the versions built
    # here; a lab without Kubernetes installs Debian 13's packages instead, so it declares
    # Debian's versions (the roles pin the packages to them).
    data["versions"] = {"etcd": DEBIAN_ETCD, "containerd": DEBIAN_CONTAINERD}
    if published is not None:
        data["versions"] = {
            "kubernetes": published.kubernetes_version.lstrip("v"),
            "containerd": published.containerd_version,
        }
        # The GPU health pods run gpuinfra's own image, built from this checkout (lab/offline.py).
        data["group_vars"]["all"]["gpu_health"] = {
            "image": offline.gpuinfra_image(gateway, published)
        }
    if any("etcd" in spec.groups for _, spec, _ in state.hosts()):
        # GitHub's releases are unreachable from the lab: etcd 3.6 built here and served by the
        # lab's file server where the lab runs Kubernetes (kubeadm 1.35 wants etcd 3.5.24+) or
        # its topology asks for it (`etcd_build`: the etcd module's lab, so that the day-2
        # commands run on both lines), Debian 13's etcd-server 3.5.16 otherwise. The lab's
        # disks are loop files sharing the machine's one disk (fsync p99 about 20 ms
        # measured): the disk gate runs and its result is in the run report, but cannot pass.
        # The Events cluster as in the sample: five more etcd processes of some 50 MB each
        # fit the machine's memory beside the rest of the lab (docs/roles/etcd.md).
        etcd: dict[str, Any] = {
            "source": "distribution",
            "disk_gate_override": True,
            "events": {"enabled": True},
        }
        build = offline.published() if state.etcd_from_build else None
        if build is not None:
            etcd.update(
                source="mirror",
                mirror_url=f"{offline.files_url(gateway)}/{offline.ETCD_FILES}",
                sha256=build.etcd_sha256,
            )
            data["versions"]["etcd"] = build.etcd_version
        data["group_vars"]["etcd"] = {"etcd": etcd}
    if any("storage" in spec.groups for _, spec, _ in state.hosts()):
        data["group_vars"]["all"]["shared_fs"] = SHARED_FS_LAB
    data["hosts"] = hosts
    return data


def _fabric_standin(address: ipaddress.IPv4Address) -> dict[str, Any]:
    """The reference server's two HDR ports, declared on a lab GPU worker as a stand-in: the
    lab's kernel has no RDMA (no device, no soft-RoCE), so the ports are never there. The role
    runs for real otherwise (packages, limits, nccl.conf, networkd files, firewall rule) and
    notes the missing ports instead of failing. The IPoIB addresses sit in the third and fourth
    /24 of the lab's own /22 (hosts use the first), never configured on any link."""
    return {
        "device_standin": True,
        "ports": [
            {"device": f"mlx5_{rail}", "port": 1, "interface": f"ib{rail}",
             "address": f"{address + 512 + 256 * rail}/24"}
            for rail in (0, 1)
        ],
    }  # fmt: skip


# The lab's CephFS shares the machine's 24 GiB and one disk with every other lab: Ceph's
# smallest OSD memory target (896 MiB), small mon and MDS caches, and a free-space warning
# below 5% (the machine's disk is itself fuller than Ceph's 30%). Two shared directories
# show the reference layout (sticky world-writable scratch, a dataset tree with a quota).
SHARED_FS_LAB: dict[str, Any] = {
    "osd_memory_target": 896 * 2**20,
    "mon_memory_target": 256 * 2**20,
    "mds_cache_memory_limit": 256 * 2**20,
    "mon_data_avail_warn": 5,
    "data_pg_num": 32,
    "directories": [
        {"path": "/scratch", "mode": "1777"},
        {"path": "/datasets", "uid": 1000, "gid": 1000, "mode": "2775", "quota_bytes": 2**30},
    ],
}


def _runtime_settings(gateway: str, published: offline.Published | None) -> dict[str, Any]:
    settings: dict[str, Any] = {"source": "distribution"}
    if published is not None:
        settings.update(
            # containerd 2 built here (Debian 13 ships 1.7, which Kubernetes 1.36 refuses), from
            # the lab's file server in its release layout; runc from Debian.
            source="binaries",
            containerd_url=f"{offline.files_url(gateway)}/{offline.CONTAINERD_FILES}",
            containerd_sha256=published.containerd_sha256,
            # The hosts' systemd cannot delegate the machine's cgroup v1 controllers: runc
            # manages them itself, as kubelet does (kubernetes.cgroup_driver below).
            cgroup_driver="cgroupfs",
            # The machine's root has no CAP_SYS_RESOURCE, so neither has any lab host's.
            restrict_oom_score_adj=True,
            sandbox_image=f"{offline.UPSTREAM_REGISTRY}/pause:{published.pause_tag}",
            # registry.k8s.io is out of reach: the lab's registry mirrors it under its names,
            # and serves the lab's own images (plain HTTP, on the lab's bridge only).
            registry_mirrors={
                offline.UPSTREAM_REGISTRY: [offline.registry_url(gateway)],
                f"{gateway}:{offline.REGISTRY_PORT}": [offline.registry_url(gateway)],
            },
            allow_insecure_registries=True,
        )
    return settings


def _kubernetes_settings(gateway: str, published: offline.Published | None) -> dict[str, Any]:
    if published is None:
        return {"enabled": False}  # no Kubernetes node in this lab, or nothing built yet
    files = offline.files_url(gateway)
    return {
        "source": "binaries",
        "binaries_url": f"{files}/{offline.KUBERNETES_FILES}",
        "binary_sha256": dict(published.sha256),
        # The newer builds served beside it, pinned, for `gpuinfra kubernetes upgrade`.
        "release_sha256": {
            newer.kubernetes_version.lstrip("v"): {
                name: newer.sha256[name] for name in ("kubeadm", "kubelet", "kubectl")
            }
            for newer in offline.upgrades()
        },
        "cni_plugins_version": published.cni_plugins_version,
        "cni_plugins_url": f"{files}/{offline.CNI_FILES}",
        "cri_tools_version": None,  # kubeadm needs no crictl; ctr comes with containerd
        "coredns_image_tag": published.coredns_version,
        # Calico's BIRD cannot run in a lab host: the reference plugins and routed pod blocks.
        "cni": "routes",
        # The lab kernel has no IPVS modules.
        "kube_proxy_mode": "nftables",
        # nf_conntrack_max is the machine's, read-only in a lab host.
        "kube_proxy_conntrack_max_per_core": 0,
        # Every lab node's file system is the machine's disk, where 161 of 252 GB are reserved
        # to root: kubelet's 10% and 15% (25 and 38 GB) are most of what every lab on the
        # machine shares, and gpu-1 was tainted with disk pressure with 30 hosts up
        # (2026-11-29). The disk margins in bytes, the others the role's defaults.
        "eviction_hard": {
            "memory.available": "500Mi",
            "nodefs.available": "2Gi",
            "imagefs.available": "2Gi",
            "nodefs.inodesFree": "5%",
        },
        # The machine mounts cgroup v1 (LAB.md): lab-only settings, see the role's config.
        "cgroup_driver": "cgroupfs",
        "fail_cgroup_v1": False,
        "accept_unsafe": ["fail_cgroup_v1"],
        "ignore_preflight_errors": ["SystemVerification"],
    }


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
