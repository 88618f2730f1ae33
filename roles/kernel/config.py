"""Defaults of the kernel role; inventory group_vars/host vars under `kernel:` override them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from inventory.grammar import (
    DebianVersion,
    KernelArgument,
    KernelModule,
    PackageName,
    SysctlName,
    SysctlValue,
)

# The sysctls every node gets: name -> (value, why). `sysctls` in the inventory merges over this
# table (a value of null drops a default). Kubelet's --protect-kernel-defaults expects the
# vm.overcommit_memory / vm.panic_on_oom / kernel.panic / kernel.panic_on_oops values below.
DEFAULT_SYSCTLS: dict[str, tuple[str, str]] = {
    # OpenAI hit ARP neighbour table overflow at scale and raised these (ANCHORS.md).
    "net.ipv4.neigh.default.gc_thresh1": ("80000", "ARP table: no garbage collection below this"),
    "net.ipv4.neigh.default.gc_thresh2": ("90000", "ARP table: soft limit"),
    "net.ipv4.neigh.default.gc_thresh3": ("100000", "ARP table: hard limit (OpenAI's value)"),
    # The same neighbour table for IPv6 (NDP) overflows the same way on dual-stack nodes.
    "net.ipv6.neigh.default.gc_thresh1": ("80000", "NDP table: same sizing as ARP"),
    "net.ipv6.neigh.default.gc_thresh2": ("90000", "NDP table: same sizing as ARP"),
    "net.ipv6.neigh.default.gc_thresh3": ("100000", "NDP table: same sizing as ARP"),
    # Service traffic goes through conntrack; a full table drops new connections silently.
    "net.netfilter.nf_conntrack_max": ("1048576", "conntrack entries for kube-proxy/Services"),
    # API servers and etcd take connection bursts when hundreds of nodes (re)connect at once.
    "net.core.somaxconn": ("32768", "accept backlog for API server and etcd bursts"),
    # Pods pass through the node's routing: without forwarding no pod traffic leaves the node.
    "net.ipv4.ip_forward": ("1", "route pod traffic (kubeadm preflight)"),
    # kubeadm preflight: bridged pod traffic must pass iptables/nftables (needs br_netfilter).
    "net.bridge.bridge-nf-call-iptables": ("1", "bridged traffic through iptables (kubeadm)"),
    "net.bridge.bridge-nf-call-ip6tables": ("1", "bridged IPv6 traffic through ip6tables"),
    # kubelet, containerd and every pod's file watchers exhaust the default 128 instances.
    "fs.inotify.max_user_instances": ("8192", "inotify instances for kubelet and pods"),
    "fs.inotify.max_user_watches": ("1048576", "inotify watches for kubelet and pods"),
    # Large mmap users (model checkpoints, Elasticsearch-style stores) need more mappings.
    "vm.max_map_count": ("262144", "memory map areas per process"),
    # Swap stays off for kubelet; 0 also keeps the kernel from swapping if swap ever appears.
    "vm.swappiness": ("0", "never prefer swap (kubelet needs swap off)"),
    # Kubelet's --protect-kernel-defaults values.
    "vm.overcommit_memory": ("1", "kubelet default: always overcommit"),
    "vm.panic_on_oom": ("0", "kubelet default: OOM killer, not a panic"),
    # A hung, panicked node is worse than one that reboots and rejoins.
    "kernel.panic": ("10", "reboot 10 s after a panic (kubelet default)"),
    "kernel.panic_on_oops": ("1", "an oops panics (then reboots) instead of limping on"),
}

# Modules every Kubernetes node loads at boot: overlayfs for container layers, br_netfilter for
# the bridge-nf-call sysctls above.
DEFAULT_MODULES = ["overlay", "br_netfilter"]
# More modules for GPU workers. nvidia-peermem (GPUDirect RDMA between the GPU and the NIC) is
# not here: the fabric settings decide where it loads (fabric.gpudirect_rdma; host_modules).
DEFAULT_GPU_MODULES: list[str] = []
# Loaded on a GPU worker whose fabric settings want GPUDirect RDMA.
GPUDIRECT_RDMA_MODULE = "nvidia-peermem"


class KernelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Overrides of DEFAULT_SYSCTLS (merged over it); null removes a default. Names and values are
    # lines of /etc/sysctl.d: a newline in either would set a second sysctl, hence the grammars.
    sysctls: dict[SysctlName, SysctlValue | int | None] = Field(default_factory=dict)
    # Kernel modules loaded at boot (/etc/modules-load.d) and now where the host allows it.
    modules: list[KernelModule] = Field(default_factory=lambda: list(DEFAULT_MODULES))
    # Added on gpu_worker hosts only.
    gpu_modules: list[KernelModule] = Field(default_factory=lambda: list(DEFAULT_GPU_MODULES))
    # Kernel command line additions (GRUB drop-in). iommu=pt: devices bypass IOMMU translation,
    # which NVIDIA advises for GPUDirect RDMA/NCCL throughput while keeping the IOMMU on.
    grub_cmdline: list[KernelArgument] = Field(default_factory=lambda: ["iommu=pt"])
    # Full clock all the time: GPU feeders and NCCL proxies stall on CPU frequency ramps.
    cpu_governor: Literal["performance", "schedutil", "ondemand", "powersave"] = "performance"
    # "always" makes khugepaged compact memory behind latency-sensitive daemons (etcd);
    # madvise lets allocators that ask for huge pages (PyTorch, CUDA hosts) still get them.
    transparent_hugepages: Literal["always", "madvise", "never"] = "madvise"
    # Locked memory: RDMA and CUDA pinned host memory need it unbounded. A number or unlimited
    # only, as fabric.memlock: it ends a line of limits.conf and systemd's DefaultLimitMEMLOCK=.
    memlock: str = Field("unlimited", pattern=r"^(unlimited|[0-9]+)$")
    # Open files per process: containerd, kubelet and data loaders hold many.
    nofile: int = 1048576
    # Kernel package pinned and held (e.g. "linux-image-generic-hwe-22.04"); None: leave it.
    # Quoted on apt-get's command line, where a name or version starting with `-` would still be
    # an option: both have Debian's grammar.
    kernel_package: PackageName | None = None
    # Version of kernel_package to install; None: whatever the archive offers, then held.
    kernel_version: DebianVersion | None = None

    def effective_sysctls(self) -> dict[str, str]:
        """The defaults with this host's overrides applied, as strings the kernel reports."""
        merged = {name: value for name, (value, _) in DEFAULT_SYSCTLS.items()}
        for name, value in self.sysctls.items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = str(value)
        return merged
