"""Files the nvidia role manages on GPU workers: apt source, pins, unattended-upgrades
blacklist, module settings, containerd drop-in and the CDI refresh unit."""

from __future__ import annotations

from roles.nvidia.compat import REPOSITORY_OS, driver_branch, module_flavour
from roles.nvidia.config import NvidiaConfig
from roles.nvidia.packages import PackagePlan, package_plan
from roles.nvidia.runtime import containerd_runtime
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

SOURCES = "/etc/apt/sources.list.d/nvidia-cuda.sources"
KEY = "/etc/apt/keyrings/nvidia-cuda.asc"
PREFERENCES = "/etc/apt/preferences.d/gpuinfra-nvidia"
UNATTENDED = "/etc/apt/apt.conf.d/51gpuinfra-nvidia-unattended"
NOUVEAU = "/etc/modprobe.d/gpuinfra-nouveau.conf"
MODULES = "/etc/modules-load.d/gpuinfra-nvidia.conf"
CONTAINERD_DROP_IN = "/etc/containerd/conf.d/90-nvidia.toml"
CDI_UNIT = "gpuinfra-nvidia-cdi.service"
CDI_SPEC = "/var/run/cdi/nvidia.yaml"
# unattended-upgrades must leave these alone: its upgrades replaced driver libraries under
# running pods in users' reports (Package-Blacklist entries are regular expressions).
UNATTENDED_BLACKLIST = (
    "nvidia-",
    "libnvidia-",
    "cuda-",
    "libcuda",
    "libcudnn",
    "libnccl",
    "datacenter-gpu-manager",
)


def nvidia_settings(ctx: HostContext) -> NvidiaConfig:
    return ctx.config(NvidiaConfig)


def host_packages(ctx: HostContext) -> PackagePlan:
    return package_plan(ctx.cluster, ctx.host, nvidia_settings(ctx))


def repository_url(ctx: HostContext) -> str | None:
    """<repo>/<os tree>/x86_64 of NVIDIA's repository or its mirror; None: no such tree."""
    cfg = nvidia_settings(ctx)
    tree = REPOSITORY_OS.get(ctx.cluster.os)
    base = cfg.mirror_url if cfg.source_for(ctx.cluster.os) == "mirror" else cfg.repo_url
    if tree is None or base is None:
        return None
    return f"{base}/{tree}/x86_64/"


def uses_repository(ctx: HostContext) -> bool:
    """Whether NVIDIA's repository (or its mirror) is this host's source."""
    cfg = nvidia_settings(ctx)
    return cfg.source_for(ctx.cluster.os) != "distribution" and repository_url(ctx) is not None


def kernel_modules(ctx: HostContext) -> list[str]:
    """Loaded at boot: the driver, unified memory (CUDA), and GPUDirect RDMA with RDMA NICs."""
    return ["nvidia", "nvidia-uvm", *(["nvidia-peermem"] if nvidia_settings(ctx).rdma else [])]


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = nvidia_settings(ctx)
    plan = host_packages(ctx)
    driver = ctx.cluster.versions.nvidia_driver

    def file(path: str, template: str, check: str | None = None, **extra: object) -> ManagedFile:
        content = render_template(f"nvidia/{template}", cfg=cfg, ctx=ctx, **extra)
        return ManagedFile("nvidia", path, content, check=check)

    return [
        # Rendered for every source so every GPU worker runs the same operations; "Enabled: no"
        # keeps NVIDIA's repository out of apt where the distribution's packages are used.
        file(
            SOURCES,
            "nvidia-cuda.sources.j2",
            url=repository_url(ctx) or "none",
            source=cfg.source_for(ctx.cluster.os),
            enabled=uses_repository(ctx),
            key=KEY,
        ),
        file(PREFERENCES, "preferences.j2", packages=plan.all),
        file(UNATTENDED, "unattended-upgrades.conf.j2", patterns=UNATTENDED_BLACKLIST),
        file(NOUVEAU, "nouveau.conf.j2"),
        file(
            MODULES,
            "modules-load.conf.j2",
            modules=kernel_modules(ctx),
            flavour=module_flavour(cfg, driver),
            branch=driver_branch(driver),
        ),
        # containerd 1.7 replaces a whole plugin section with an imported file's: this drop-in
        # repeats the container_runtime role's CRI section and adds the nvidia runtime to it.
        file(
            CONTAINERD_DROP_IN,
            "containerd.toml.j2",
            check="containerd --config {path} config dump >/dev/null",
            runtime_cfg=ctx.settings_of("container_runtime"),
            nvidia=containerd_runtime(ctx),
        ),
        file(f"/etc/systemd/system/{CDI_UNIT}", "nvidia-cdi.service.j2", spec=CDI_SPEC),
    ]
