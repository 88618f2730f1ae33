"""The packages of the NVIDIA stack per source and OS, each with its pinned version pattern, and
what a source cannot provide (said in the plan, never skipped silently)."""

from __future__ import annotations

from dataclasses import dataclass

from inventory.model import Cluster, Host
from roles.nvidia.compat import driver_branch, has_nvswitch, module_flavour, nccl_cuda
from roles.nvidia.config import NvidiaConfig


@dataclass(frozen=True)
class Package:
    name: str
    version: str  # apt preferences pattern: "550.163.01-*"
    part: str  # what it is for: driver, module, nccl, cudnn, cuda, fabricmanager, dcgm, toolkit


@dataclass(frozen=True)
class Missing:
    """A part the host needs that its source does not have."""

    part: str
    package: str
    why: str

    def note(self, source: str, os_name: str) -> str:
        where = f"source {source} on {os_name}"
        return f"{self.part} ({self.package}): not provided by {where}; {self.why}"


@dataclass(frozen=True)
class PackagePlan:
    userspace: tuple[Package, ...]  # installed and held everywhere
    modules: tuple[Package, ...]  # the kernel module: only where a module can load
    missing: tuple[Missing, ...]

    @property
    def all(self) -> tuple[Package, ...]:
        return self.userspace + self.modules

    def has(self, part: str) -> bool:
        return any(p.part == part for p in self.all)


NVIDIA_ONLY = "NVIDIA's repository only (source: nvidia or mirror); not installed"


def package_plan(cluster: Cluster, host: Host, cfg: NvidiaConfig) -> PackagePlan:
    """What one GPU worker installs, from the cluster's pins and its nvidia settings."""
    versions = cluster.versions
    driver = versions.nvidia_driver
    branch = driver_branch(driver)
    open_modules = module_flavour(cfg, driver) == "open"
    debian = cluster.os.startswith("debian")
    source = cfg.source_for(cluster.os)
    drv = f"{driver}-*"
    userspace: list[Package] = []
    modules: list[Package] = []
    missing: list[Missing] = []

    if debian:
        # Debian's (and NVIDIA's debian12 tree's) split packages: the compute userspace only,
        # no X server. nvidia-persistenced has its own Debian revision, hence the pattern.
        userspace += [
            Package(name, drv, "driver")
            for name in ("nvidia-smi", "libnvidia-ml1", "libcuda1", "nvidia-persistenced")
        ]
        module = "nvidia-open-kernel-dkms" if open_modules else "nvidia-kernel-dkms"
        if source != "distribution" and open_modules:
            module = "nvidia-kernel-open-dkms"  # NVIDIA's name in its debian12 tree
        modules.append(Package(module, drv, "module"))
    else:
        suffix = "-open" if open_modules else ""
        if source == "distribution":
            # Canonical's precompiled, signed modules avoid DKMS builds on every kernel update.
            userspace.append(
                Package(f"nvidia-headless-no-dkms-{branch}-server{suffix}", drv, "driver")
            )
            modules.append(
                Package(
                    f"linux-modules-nvidia-{branch}-server{suffix}-{cfg.kernel_flavour}",
                    "*",
                    "module",
                )
            )
        else:
            userspace.append(
                Package(f"nvidia-headless-no-dkms-{branch}-server{suffix}", drv, "driver")
            )
            modules.append(Package(f"nvidia-dkms-{branch}-server{suffix}", drv, "module"))
        userspace.append(Package(f"nvidia-utils-{branch}-server", drv, "driver"))

    nccl = versions.nccl
    if source == "distribution":
        if debian:
            userspace.append(Package("libnccl2", f"{nccl}-*", "nccl"))
        else:
            missing.append(Missing("NCCL", "libnccl2", f"not at the pinned build; {NVIDIA_ONLY}"))
    else:
        userspace.append(Package("libnccl2", f"{nccl}-*+cuda{nccl_cuda(cfg, cluster)}", "nccl"))

    cudnn_major, cuda_major = versions.cudnn.split(".")[0], versions.cuda.split(".")[0]
    cudnn = f"libcudnn{cudnn_major}-cuda-{cuda_major}"
    if source == "distribution":
        missing.append(Missing("cuDNN", cudnn, NVIDIA_ONLY))
    else:
        userspace.append(Package(cudnn, f"{versions.cudnn}.*", "cudnn"))

    if cfg.cuda_toolkit:
        if source != "distribution":
            name = "cuda-toolkit-" + versions.cuda.replace(".", "-")
            userspace.append(Package(name, f"{versions.cuda}.*", "cuda"))
        elif debian:
            userspace.append(Package("nvidia-cuda-toolkit", f"{versions.cuda}.*", "cuda"))
        else:
            missing.append(
                Missing("CUDA toolkit", "nvidia-cuda-toolkit", f"not at CUDA {versions.cuda}")
            )

    if wants_fabricmanager(host, cfg):
        fm = f"{cfg.fabricmanager_version or driver}-*"
        names = (f"nvidia-fabricmanager-{branch}", f"libnvidia-nscq-{branch}")
        if source == "distribution" and debian:
            missing += [Missing("fabric manager", name, NVIDIA_ONLY) for name in names]
        else:
            userspace += [Package(name, fm, "fabricmanager") for name in names]

    if cfg.dcgm_version:
        names = ("datacenter-gpu-manager-4-core", f"datacenter-gpu-manager-4-cuda{cuda_major}")
        if source == "distribution":
            missing += [Missing("DCGM", name, NVIDIA_ONLY) for name in names]
        else:
            userspace += [Package(name, f"1:{cfg.dcgm_version}-*", "dcgm") for name in names]

    if cfg.container_toolkit_version:
        names = (
            "nvidia-container-toolkit",
            "nvidia-container-toolkit-base",
            "libnvidia-container-tools",
            "libnvidia-container1",
        )
        if source == "distribution":
            missing.append(Missing("container toolkit", names[0], NVIDIA_ONLY))
        else:
            version = f"{cfg.container_toolkit_version}-*"
            userspace += [Package(name, version, "toolkit") for name in names]
    return PackagePlan(tuple(userspace), tuple(modules), tuple(missing))


def wants_fabricmanager(host: Host, cfg: NvidiaConfig) -> bool:
    """From the inventory: on NVSwitch systems ("auto"), or as the operator says."""
    if cfg.fabricmanager == "auto":
        return has_nvswitch(host.gpu)
    return cfg.fabricmanager == "on"
