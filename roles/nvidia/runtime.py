"""The nvidia container runtime as containerd and Docker see it: present only on GPU workers
whose source installs the container toolkit (a runtime whose binary is missing breaks pods)."""

from __future__ import annotations

from roles.nvidia.config import NvidiaConfig
from roles.nvidia.packages import package_plan
from toolkit.spec import HostContext

RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"


def toolkit_installed(ctx: HostContext) -> bool:
    if "gpu_worker" not in ctx.host.groups:
        return False
    return package_plan(ctx.cluster, ctx.host, ctx.config(NvidiaConfig)).has("toolkit")


def containerd_runtime(ctx: HostContext) -> dict[str, str] | None:
    """What the CRI section needs for the nvidia runtime; None: no runtime here."""
    if not toolkit_installed(ctx):
        return None
    default = ctx.config(NvidiaConfig).containerd_runtime == "default"
    return {"default_runtime": "nvidia" if default else "runc", "binary": RUNTIME_BINARY}


def docker_runtime(ctx: HostContext) -> dict[str, object] | None:
    """daemon.json's `runtimes` entry (and whether it is the default); None: no runtime here."""
    cfg = ctx.config(NvidiaConfig)
    if not cfg.docker_runtime or not toolkit_installed(ctx):
        return None
    return {
        "runtimes": {"nvidia": {"path": RUNTIME_BINARY, "runtimeArgs": []}},
        "default": cfg.containerd_runtime == "default",
    }
