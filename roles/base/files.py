"""Files the base role manages on every host."""

from __future__ import annotations

from roles.base.config import BaseConfig
from roles.spec import HostContext, ManagedFile
from roles.templates import render_template

# Release code names and archive layout per target OS.
DISTRIBUTIONS = {
    "debian-12": ("debian", "bookworm", "http://deb.debian.org/debian"),
    "debian-13": ("debian", "trixie", "http://deb.debian.org/debian"),
    "ubuntu-22.04": ("ubuntu", "jammy", "http://archive.ubuntu.com/ubuntu"),
    "ubuntu-24.04": ("ubuntu", "noble", "http://archive.ubuntu.com/ubuntu"),
}


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = ctx.config(BaseConfig)
    family, codename, default_mirror = DISTRIBUTIONS[ctx.cluster.os]
    hosts = [
        (str(host.address), ctx.cluster.fqdn(name), name)
        for name, host in ctx.cluster.hosts.items()
    ]
    if ctx.topology.api_address:
        hosts.append((ctx.topology.api_address, f"api.{ctx.cluster.domain}", "api"))

    def file(path: str, template: str, check: str | None = None, **extra: object) -> ManagedFile:
        content = render_template(
            f"base/{template}", cfg=cfg, ctx=ctx, cluster=ctx.cluster, **extra
        )
        return ManagedFile("base", path, content, check=check)

    return [
        file("/etc/hostname", "hostname.j2"),
        file("/etc/hosts", "hosts.j2", hosts=hosts),
        file(
            "/etc/apt/sources.list.d/gpuinfra.sources",
            "apt.sources.j2",
            family=family,
            codename=codename,
            mirror=cfg.apt_mirror or default_mirror,
        ),
        file("/etc/apt/apt.conf.d/90gpuinfra", "apt.conf.j2"),
        file("/etc/chrony/sources.d/gpuinfra.sources", "chrony.sources.j2"),
        file("/etc/systemd/journald.conf.d/50-gpuinfra.conf", "journald.conf.j2"),
        # A drop-in that sshd rejects never goes live: a broken sshd locks the operator out.
        file("/etc/ssh/sshd_config.d/50-gpuinfra.conf", "sshd.conf.j2", check="sshd -t -f {path}"),
    ]
