"""The nvidia container runtime as containerd and Docker see it: present only on GPU workers
whose source installs the container toolkit (a runtime whose binary is missing breaks pods)."""

from __future__ import annotations

from inventory.model import LoadedCluster
from roles.nvidia.config import NvidiaConfig
from roles.nvidia.packages import package_plan
from toolkit.spec import HostContext, settings_of

RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"


def toolkit_installed(ctx: HostContext) -> bool:
    return runtime_installed(ctx.loaded, ctx.name)


def runtime_installed(loaded: LoadedCluster, name: str) -> bool:
    """Whether the host gets the container toolkit, hence the nvidia runtime: what the node
    label the GPU DaemonSets select on says (fleet_policy's node placement asks, by name)."""
    host = loaded.cluster.hosts[name]
    if "gpu_worker" not in host.groups:
        return False
    cfg: NvidiaConfig = settings_of(loaded, name, "nvidia")
    return package_plan(loaded.cluster, host, cfg).has("toolkit")


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
