"""What fits together in the NVIDIA stack: tables with their sources, and the inventory rules
built on them (`inventory validate` refuses each incompatible pin, nothing connects).

Every row names where it comes from; a version missing from a table is refused with a message
saying so, never guessed: add the row with its source.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pydantic import BaseModel

from inventory.model import Cluster, GPUSpec, LoadedCluster
from roles.nvidia.config import NvidiaConfig

CUDA_RELEASE_NOTES = (
    "NVIDIA CUDA Toolkit release notes, table 3 (toolkit driver version, Linux x86_64 GA)"
)
CUDNN_SUPPORT_MATRIX = "NVIDIA cuDNN support matrix (cuDNN 9.x)"
OPEN_MODULES_DOCS = "NVIDIA driver installation guide, 'Kernel modules' (open GPU kernel modules)"
FABRIC_MANAGER_GUIDE = "NVIDIA Fabric Manager user guide (fabric manager == driver version)"


@dataclass(frozen=True)
class MinimumDriver:
    cuda: str
    driver: str
    source: str = CUDA_RELEASE_NOTES


# CUDA toolkit -> minimum Linux driver, from the CUDA release notes (ANCHORS.md). Minor-version
# compatibility lets 12.x run on >= 525 with limited features; the pin holds the full minimum.
CUDA_MINIMUM_DRIVER: dict[str, MinimumDriver] = {
    row.cuda: row
    for row in (
        MinimumDriver("12.0", "525.60.13"),
        MinimumDriver("12.2", "535.54.03"),
        MinimumDriver("12.4", "550.54.14"),
        MinimumDriver("12.6", "560.28.03"),
        MinimumDriver("12.8", "570.26"),
        MinimumDriver("12.9", "575.51.03"),
        MinimumDriver("13.0", "580.65.06"),
    )
}


@dataclass(frozen=True)
class CudnnBuild:
    cudnn_major: int
    cuda_major: int
    cuda_from: str  # first CUDA minor the build supports
    cuda_to: str  # last one
    source: str = CUDNN_SUPPORT_MATRIX


# cuDNN major x CUDA major build -> the CUDA versions it covers (ANCHORS.md: "cuDNN 9's CUDA 12
# build covers 12.0-12.9"); the package is libcudnn<major>-cuda-<cuda major>.
CUDNN_BUILDS: dict[tuple[int, int], CudnnBuild] = {
    (row.cudnn_major, row.cuda_major): row for row in (CudnnBuild(9, 12, "12.0", "12.9"),)
}


@dataclass(frozen=True)
class GpuFamily:
    name: str
    prefixes: tuple[str, ...]  # of the upper-cased model with spaces removed ("H100-SXM5-80GB")
    modules: tuple[str, ...]  # kernel module flavours that drive it
    source: str = OPEN_MODULES_DOCS


# GPU model -> architecture -> kernel module flavours: the open modules need Turing or later,
# and Blackwell is supported by the open modules only. First match wins.
GPU_FAMILIES: tuple[GpuFamily, ...] = (
    GpuFamily("Blackwell", ("B100", "B200", "B300", "GB200", "GB300", "RTXPRO6000"), ("open",)),
    GpuFamily("Hopper", ("H100", "H200", "H800", "GH200", "H20"), ("open", "proprietary")),
    GpuFamily("Ada", ("L40", "L4", "L20", "RTX6000ADA"), ("open", "proprietary")),
    GpuFamily(
        "Ampere", ("A100", "A800", "A40", "A30", "A16", "A10", "A2"), ("open", "proprietary")
    ),
    GpuFamily("Turing", ("T4", "QUADRORTX"), ("open", "proprietary")),
    GpuFamily("Volta/Pascal", ("V100", "P100", "P40", "P4", "P6"), ("proprietary",)),
)

# NVSwitch systems (8-GPU HGX/DGX boards): fabric manager runs there and only there.
NVSWITCH_FAMILIES = ("A100", "A800", "H100", "H200", "H800", "B200", "B300")
NVSWITCH_GPU_COUNT = 8


def normalised(model: str) -> str:
    return re.sub(r"[\s_]", "", model.upper())


def gpu_family(model: str) -> GpuFamily | None:
    name = normalised(model)
    for family in GPU_FAMILIES:
        if name.startswith(family.prefixes):
            return family
    return None


def has_nvswitch(gpu: GPUSpec | None) -> bool:
    """8 SXM GPUs of a family NVIDIA builds HGX/DGX NVSwitch boards for (B200 is SXM only)."""
    if gpu is None or gpu.count != NVSWITCH_GPU_COUNT:
        return False
    name = normalised(gpu.model)
    family = next((f for f in NVSWITCH_FAMILIES if name.startswith(f)), None)
    return family is not None and ("SXM" in name or family.startswith("B"))


def driver_branch(driver: str) -> str:
    return driver.split(".", 1)[0]


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def module_flavour(cfg: NvidiaConfig, driver: str) -> str:
    """The configured flavour, or NVIDIA's default for the branch: open from 560."""
    if cfg.kernel_modules is not None:
        return cfg.kernel_modules
    return "open" if int(driver_branch(driver)) >= 560 else "proprietary"


def nccl_cuda(cfg: NvidiaConfig, cluster: Cluster) -> str:
    return cfg.nccl_cuda or cluster.versions.cuda


# NVIDIA's CUDA repository has these OS trees (developer.download.nvidia.com/compute/cuda/repos).
REPOSITORY_OS = {
    "ubuntu-22.04": "ubuntu2204",
    "ubuntu-24.04": "ubuntu2404",
    "debian-12": "debian12",
}

Problem = tuple[str, str]  # (key path, message)
HostSettings = Mapping[str, Mapping[str, BaseModel]]


def check_pins(loaded: LoadedCluster, settings: HostSettings) -> Iterator[Problem]:
    """Every rule over the cluster's versions and each GPU worker's nvidia settings."""
    cluster = loaded.cluster
    yield from _versions_parse(cluster)
    if any(not _parses(v) for v in _stack_versions(cluster).values()):
        return  # the rules below compare versions: _versions_parse said what is wrong
    yield from _cuda_needs_driver(cluster)
    yield from _cudnn_build_covers_cuda(cluster)
    seen: set[Problem] = set()
    for name in cluster.in_group("gpu_worker"):
        cfg = settings.get(name, {}).get("nvidia")
        if not isinstance(cfg, NvidiaConfig):
            continue
        for problem in (
            *_nccl_build_fits(cluster, name, cfg),
            *_fabricmanager_equals_driver(cluster, name, cfg),
            *_module_flavour_drives_gpu(cluster, name, cfg),
            *_source_has_repository(cluster, name, cfg),
        ):
            if problem not in seen:  # a group setting is reported once, not per host
                seen.add(problem)
                yield problem


def _stack_versions(cluster: Cluster) -> dict[str, str]:
    v = cluster.versions
    return {"nvidia_driver": v.nvidia_driver, "cuda": v.cuda, "cudnn": v.cudnn, "nccl": v.nccl}


def _parses(version: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)+", version) is not None


def _versions_parse(cluster: Cluster) -> Iterator[Problem]:
    for key, version in _stack_versions(cluster).items():
        if not _parses(version):
            yield f"versions.{key}", f"{version!r} is not a version (digits and dots, 550.163.01)"


def _cuda_needs_driver(cluster: Cluster) -> Iterator[Problem]:
    """CUDA toolkit -> minimum driver (CUDA release notes, table 3)."""
    cuda, driver = cluster.versions.cuda, cluster.versions.nvidia_driver
    row = CUDA_MINIMUM_DRIVER.get(_major_minor(cuda))
    if row is None:
        known = ", ".join(CUDA_MINIMUM_DRIVER)
        yield (
            "versions.cuda",
            f"CUDA {cuda} has no minimum-driver row in roles/nvidia/compat.py (known: {known}); "
            "add it with its source (CUDA release notes)",
        )
    elif version_key(driver) < version_key(row.driver):
        yield (
            "versions.nvidia_driver",
            f"driver {driver} is older than CUDA {row.cuda} needs (>= {row.driver}; {row.source})",
        )


def _cudnn_build_covers_cuda(cluster: Cluster) -> Iterator[Problem]:
    """cuDNN build -> CUDA major (cuDNN support matrix)."""
    cudnn, cuda = cluster.versions.cudnn, cluster.versions.cuda
    cudnn_major, cuda_major = version_key(cudnn)[0], version_key(cuda)[0]
    row = CUDNN_BUILDS.get((cudnn_major, cuda_major))
    if row is None:
        yield (
            "versions.cudnn",
            f"no cuDNN {cudnn_major} build for CUDA {cuda_major} in roles/nvidia/compat.py "
            f"(libcudnn{cudnn_major}-cuda-{cuda_major}); add it with its source "
            "(cuDNN support matrix)",
        )
    elif (
        not version_key(row.cuda_from)
        <= version_key(_major_minor(cuda))
        <= version_key(row.cuda_to)
    ):
        yield (
            "versions.cudnn",
            f"cuDNN {cudnn_major}'s CUDA {cuda_major} build covers CUDA {row.cuda_from}-"
            f"{row.cuda_to}, not {cuda} ({row.source})",
        )


def _nccl_build_fits(cluster: Cluster, host: str, cfg: NvidiaConfig) -> Iterator[Problem]:
    """NCCL build -> CUDA: the libnccl2 build's CUDA has the toolkit's major, is not newer than
    the toolkit, and the driver runs it (CUDA release notes' minimum for that build)."""
    build, cuda = nccl_cuda(cfg, cluster), cluster.versions.cuda
    key = setting_key(cluster, host, "nccl_cuda") if cfg.nccl_cuda else "versions.nccl"
    if version_key(build)[0] != version_key(cuda)[0]:
        yield key, f"NCCL built for CUDA {build} does not fit CUDA {cuda} (major differs)"
        return
    if version_key(build) > version_key(_major_minor(cuda)):
        yield key, f"NCCL built for CUDA {build} is newer than the CUDA toolkit pin {cuda}"
        return
    row = CUDA_MINIMUM_DRIVER.get(build)
    driver = cluster.versions.nvidia_driver
    if row is not None and version_key(driver) < version_key(row.driver):
        yield key, f"NCCL built for CUDA {build} needs driver >= {row.driver} (got {driver})"


def _fabricmanager_equals_driver(
    cluster: Cluster, host: str, cfg: NvidiaConfig
) -> Iterator[Problem]:
    """Fabric manager (and libnvidia-nscq) == driver, exactly (Fabric Manager user guide)."""
    driver = cluster.versions.nvidia_driver
    if cfg.fabricmanager_version is not None and cfg.fabricmanager_version != driver:
        yield (
            setting_key(cluster, host, "fabricmanager_version"),
            f"fabric manager {cfg.fabricmanager_version} must equal the driver version "
            f"{driver} exactly ({FABRIC_MANAGER_GUIDE})",
        )


def _module_flavour_drives_gpu(cluster: Cluster, host: str, cfg: NvidiaConfig) -> Iterator[Problem]:
    """GPU model -> kernel module flavour: Blackwell needs open, before Turing proprietary."""
    gpu = cluster.hosts[host].gpu
    if gpu is None:
        return
    family = gpu_family(gpu.model)
    flavour = module_flavour(cfg, cluster.versions.nvidia_driver)
    if family is not None and flavour not in family.modules:
        why = (
            "set"
            if cfg.kernel_modules
            else f"branch {driver_branch(cluster.versions.nvidia_driver)}'s default"
        )
        yield (
            setting_key(cluster, host, "kernel_modules", fallback=f"hosts.{host}.gpu.model"),
            f"{gpu.model} ({family.name}) needs {' or '.join(family.modules)} kernel modules, "
            f"not {flavour} ({why}; {family.source})",
        )


def _source_has_repository(cluster: Cluster, host: str, cfg: NvidiaConfig) -> Iterator[Problem]:
    source = cfg.source_for(cluster.os)
    if source in ("nvidia", "mirror") and cluster.os not in REPOSITORY_OS:
        yield (
            setting_key(cluster, host, "source", fallback="os"),
            f"NVIDIA's CUDA repository has no {cluster.os} tree (it has "
            f"{', '.join(REPOSITORY_OS.values())}): use source: distribution",
        )
    if source == "mirror" and cfg.mirror_url is None:
        yield setting_key(cluster, host, "source"), "source: mirror needs nvidia.mirror_url"


def setting_key(cluster: Cluster, host: str, field: str, fallback: str | None = None) -> str:
    """Where a host's nvidia setting comes from: its own vars, else the last group that sets it
    (the merge order of role settings), else `fallback` (or the host's vars path)."""
    entry = cluster.hosts[host]
    if field in entry.vars.get("nvidia", {}):
        return f"hosts.{host}.vars.nvidia.{field}"
    for group in reversed(["all", *entry.groups]):
        if field in cluster.group_vars.get(group, {}).get("nvidia", {}):
            return f"group_vars.{group}.nvidia.{field}"
    return fallback or f"hosts.{host}.vars.nvidia.{field}"


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])
