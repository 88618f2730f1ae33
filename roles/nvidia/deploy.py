"""The nvidia role on GPU workers: NVIDIA's repository (or the distribution's, or a mirror),
the driver, CUDA, cuDNN, NCCL, fabric manager, DCGM and the container toolkit at the cluster's
pins and held, nouveau out of the way, and the nvidia runtime in containerd and Docker."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from roles.nvidia import files as nvidia_files
from roles.nvidia.compat import has_nvswitch
from roles.nvidia.files import (
    CDI_UNIT,
    CONTAINERD_DROP_IN,
    KEY,
    NOUVEAU,
    SOURCES,
    host_packages,
    nvidia_settings,
    repository_url,
    uses_repository,
)
from roles.nvidia.operations import (
    driver_service_running,
    fabricmanager_running,
    initramfs_updated,
    module_packages_pinned,
    packages_pinned,
    unavailable_reported,
)
from toolkit.aptkeys import repository_key
from toolkit.operations import enable_at_boot, put_file, restart_if_running, wait_for
from toolkit.spec import HostContext


@deploy("Nvidia")
def apply(ctx: HostContext) -> None:
    cfg = nvidia_settings(ctx)
    plan = host_packages(ctx)
    managed = {f.path: f for f in nvidia_files.managed_files(ctx)}
    written = {path: put_file(f) for path, f in managed.items()}
    url = repository_url(ctx)
    repository_key(
        name="Fetch NVIDIA's repository key",
        enabled=uses_repository(ctx),
        url=f"{url}{cfg.repo_key_fingerprint[-8:].lower()}.pub",
        fingerprint=cfg.repo_key_fingerprint,
        dest=KEY,
    )
    apt.update(
        name="Refresh package lists for NVIDIA's repository", _if=written[SOURCES].did_change
    )
    unavailable_reported(
        name="Report what the source cannot provide",
        missing=list(plan.missing),
        source=cfg.source_for(ctx.cluster.os),
        os_name=ctx.cluster.os,
    )
    stack = packages_pinned(name="Install and hold the NVIDIA stack", packages=list(plan.userspace))
    module = module_packages_pinned(
        name="Install and hold the NVIDIA kernel module", packages=list(plan.modules)
    )
    initramfs_updated(name="Rebuild the initramfs without nouveau", _if=written[NOUVEAU].did_change)
    driver_service_running(name="Run nvidia-persistenced", unit="nvidia-persistenced.service")
    fabricmanager_running(
        name="Run fabric manager on NVSwitch systems",
        expected=plan.has("fabricmanager"),
        why=f"{ctx.host.gpu.model} x{ctx.host.gpu.count}" if has_nvswitch(ctx.host.gpu) else "set",
    )

    drop_in = written[CONTAINERD_DROP_IN]
    restart_if_running(
        name="Restart containerd for the nvidia runtime",
        unit="containerd",
        _if=drop_in.did_change,
    )
    server.shell(
        name="Wait for containerd",
        commands=[wait_for("ctr version >/dev/null")],
        _if=drop_in.did_change,
    )
    cdi_unit = written[f"/etc/systemd/system/{CDI_UNIT}"]
    systemd.daemon_reload(name="Reload systemd for the CDI unit", _if=cdi_unit.did_change)
    enable_at_boot(
        managed[f"/etc/systemd/system/{CDI_UNIT}"], name="Enable the CDI spec refresh at boot"
    )
    # Its conditions skip it until the toolkit is installed and a driver is loaded.
    server.shell(
        name="Refresh the CDI spec for the driver",
        commands=[f"systemctl restart {CDI_UNIT}"],
        _if=[lambda: stack.did_change() or module.did_change() or cdi_unit.did_change()],
    )
