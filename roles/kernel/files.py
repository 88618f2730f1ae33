"""Files the kernel role manages on every host."""

from __future__ import annotations

from roles.kernel.config import DEFAULT_SYSCTLS, GPUDIRECT_RDMA_MODULE, KernelConfig
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

SYSCTL_FILE = "/etc/sysctl.d/90-gpuinfra.conf"
MODULES_FILE = "/etc/modules-load.d/gpuinfra.conf"
GRUB_FILE = "/etc/default/grub.d/90-gpuinfra.cfg"
LIMITS_FILE = "/etc/security/limits.d/90-gpuinfra.conf"
SYSTEMD_LIMITS_FILE = "/etc/systemd/system.conf.d/90-gpuinfra.conf"
GOVERNOR_UNIT = "gpuinfra-cpu-governor.service"
THP_UNIT = "gpuinfra-thp.service"


def kernel_settings(ctx: HostContext) -> KernelConfig:
    return ctx.config(KernelConfig)


def host_modules(ctx: HostContext) -> list[str]:
    """Modules for this host: the common ones, plus the GPU ones on GPU workers, and
    nvidia-peermem where the host's fabric settings want GPUDirect RDMA (read by the role's
    name: the kernel role loads modules, the fabric role decides this one)."""
    cfg = kernel_settings(ctx)
    extra: list[str] = []
    if "gpu_worker" in ctx.host.groups:
        extra = list(cfg.gpu_modules)
        if ctx.settings_of("fabric").wants_gpudirect_rdma:
            extra.append(GPUDIRECT_RDMA_MODULE)
    return list(dict.fromkeys([*cfg.modules, *extra]))


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = kernel_settings(ctx)

    def file(path: str, template: str, **extra: object) -> ManagedFile:
        content = render_template(f"kernel/{template}", cfg=cfg, ctx=ctx, **extra)
        return ManagedFile("kernel", path, content)

    sysctls = [
        (name, value, DEFAULT_SYSCTLS.get(name, ("", ""))[1])
        for name, value in cfg.effective_sysctls().items()
    ]
    return [
        file(SYSCTL_FILE, "sysctl.conf.j2", sysctls=sysctls),
        file(MODULES_FILE, "modules-load.conf.j2", modules=host_modules(ctx)),
        file(GRUB_FILE, "grub.cfg.j2"),
        file(LIMITS_FILE, "limits.conf.j2"),
        file(SYSTEMD_LIMITS_FILE, "system.conf.j2"),
        file(f"/etc/systemd/system/{GOVERNOR_UNIT}", "cpu-governor.service.j2"),
        file(f"/etc/systemd/system/{THP_UNIT}", "thp.service.j2"),
    ]
