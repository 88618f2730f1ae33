"""Defaults of the nvidia role; inventory group_vars/host vars under `nvidia:` override them.

The stack's versions are NOT here: the driver, CUDA, cuDNN and NCCL pins are the cluster's
`versions.nvidia_driver/cuda/cudnn/nccl` (inventory/model.py), the single source of truth, so
every GPU worker is held to the same pins and a worker that differs from them also differs from
the others. What varies by fleet (where packages come from, module flavour, runtime wiring) and
the versions of the tools around the stack (DCGM, container toolkit) are settings of the role.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inventory.grammar import DebianVersion, KeyFingerprint, Url

Source = Literal["nvidia", "distribution", "mirror"]


class NvidiaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # "nvidia": NVIDIA's CUDA network repository for the host's OS (what Ubuntu fleets run and
    # the only place cuDNN, fabric manager, DCGM and the container toolkit come from);
    # "distribution": the OS's own packages (Debian non-free, Ubuntu restricted);
    # "mirror": an operator's apt mirror of NVIDIA's repository (air-gapped fleets).
    # None: "nvidia" on Ubuntu, "distribution" on Debian (NVIDIA has no Debian 13 tree).
    source: Source | None = None
    # NVIDIA's CUDA repository root; <url>/<ubuntu2204|ubuntu2404|debian12>/x86_64/ is used.
    # Both URLs are lines of apt's sources and curl's command line, hence the grammar.
    repo_url: Url = "https://developer.download.nvidia.com/compute/cuda/repos"
    # An operator's mirror of the same tree, required with `source: mirror`.
    mirror_url: Url | None = None
    # NVIDIA's CUDA repository signing key (3bf863cc.pub, used since April 2022), pinned by
    # fingerprint: https://developer.nvidia.com/blog/updating-the-cuda-linux-gpg-repository-key/
    repo_key_fingerprint: KeyFingerprint = "EB693B3035CD5710E231E123A4B469963BF863CC"
    # Kernel module flavour; None: NVIDIA's default for the branch (open from 560, proprietary
    # before). Blackwell needs open; GPUs before Turing need proprietary (compat.py checks it).
    kernel_modules: Literal["open", "proprietary"] | None = None
    # Ubuntu's kernel flavour for Canonical's precompiled modules
    # (linux-modules-nvidia-<branch>-server[-open]-<flavour>): the kernel the kernel role pins.
    kernel_flavour: str = Field("generic", pattern=r"^[a-z0-9.-]+$")
    # The CUDA toolkit (compilers, 1.9 GB on Debian): the driver's libcuda is enough to run
    # containers, which bring their own toolkit, so nodes skip it unless asked.
    cuda_toolkit: bool = False
    # The CUDA build of the NCCL package (libnccl2=<v>-1+cuda<this>); None: versions.cuda.
    nccl_cuda: str | None = Field(None, pattern=r"^\d+\.\d+$")
    # Fabric manager and libnvidia-nscq version; None: exactly the driver's, the only version
    # that works (a mismatch leaves NVSwitch systems without NVLink: gpu-operator#544).
    fabricmanager_version: DebianVersion | None = None
    # Fabric manager: "auto" runs it on NVSwitch systems (8-GPU HGX/DGX A100, H100, H200, B200,
    # from the inventory's GPU model); elsewhere it fails with NV_WARN_NOTHING_TO_DO.
    fabricmanager: Literal["auto", "on", "off"] = "auto"
    # DCGM 4 (datacenter-gpu-manager-4-cuda<major>): dcgm-exporter and health checks read it.
    dcgm_version: DebianVersion | None = "4.2.3"
    # nvidia-container-toolkit (and its libnvidia-container libraries) at this version.
    container_toolkit_version: DebianVersion | None = "1.17.8"
    # containerd: "default" makes nvidia the default runtime, what the NVIDIA device plugin's
    # documented setup expects; "runtime_class" keeps runc the default and GPU pods opt in
    # with `runtimeClassName: nvidia` (a RuntimeClass named nvidia must exist).
    containerd_runtime: Literal["default", "runtime_class"] = "default"
    # Docker gets the nvidia runtime too (docker run --runtime=nvidia, or --gpus via CDI).
    docker_runtime: bool = True
    # The node has RDMA NICs: load nvidia-peermem for GPUDirect RDMA (NCCL over InfiniBand).
    rdma: bool = False

    @field_validator("mirror_url", "repo_url")
    @classmethod
    def _without_trailing_slash(cls, value: str | None) -> str | None:
        return value.rstrip("/") if value is not None else value

    def source_for(self, os_name: str) -> Source:
        """The source in effect on a host of this OS."""
        if self.source is not None:
            return self.source
        return "nvidia" if os_name.startswith("ubuntu") else "distribution"
