"""Files the container_runtime role manages on Kubernetes nodes."""

from __future__ import annotations

from roles.container_runtime.config import ContainerRuntimeConfig
from toolkit.distributions import DISTRIBUTIONS
from toolkit.spec import HostContext, ManagedFile, provided
from toolkit.templates import render_template

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DOCKER_CONFIG = "/etc/docker/daemon.json"
DOCKER_SOURCES = "/etc/apt/sources.list.d/docker.sources"
DOCKER_PIN = "/etc/apt/preferences.d/gpuinfra-container-runtime"
DOCKER_KEY = "/etc/apt/keyrings/docker.asc"
# containerd's unit where the role installs it from its release (source: binaries); a package
# brings its own.
CONTAINERD_UNIT = "/etc/systemd/system/containerd.service"
CONTAINERD_UNIT_TEXT = """\
# Managed by gpuinfra (role container_runtime): containerd from its release tarball
# (source: binaries), with the settings of containerd's own unit.
[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target local-fs.target dbus.service

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
# Containers' cgroups are delegated to containerd, and its shims outlive a restart.
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
# Kept alive under memory pressure: losing the runtime loses every node's pods.
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
"""
# Other roles' containerd drop-ins (nvidia's runtime), imported by config.toml.
CONTAINERD_DROP_INS = "/etc/containerd/conf.d/*.toml"

# The nvidia role's runtime entry for Docker's daemon.json (None: no NVIDIA runtime here).
docker_runtime = provided("nvidia", "docker_runtime")


def runtime_settings(ctx: HostContext) -> ContainerRuntimeConfig:
    return ctx.config(ContainerRuntimeConfig)


def docker_repository(ctx: HostContext) -> str:
    """Docker's repository for the host's distribution family (…/linux/ubuntu, …/linux/debian)."""
    family = DISTRIBUTIONS[ctx.cluster.os][0]
    return f"{runtime_settings(ctx).docker_repo_url.rstrip('/')}/{family}"


def runtime_packages(source: str, os_name: str) -> dict[str, str]:
    """Package name -> pinned version prefix for one source and OS. Debian 13 split the docker
    CLI out of docker.io; Docker's own packages carry an epoch (5:) before the version."""
    if source == "binaries":
        return {}  # containerd from its release tarball, runc from the OS archive, no Docker
    if source == "docker":
        return {
            "docker-ce": "5:{docker}",
            "docker-ce-cli": "5:{docker}",
            "containerd.io": "{containerd}",
        }
    packages = {"docker.io": "{docker}", "containerd": "{containerd}"}
    if os_name == "debian-13":
        packages["docker-cli"] = "{docker}"
    return packages


def pinned_packages(ctx: HostContext) -> dict[str, str]:
    """Package name -> version pattern for apt's preferences ("26.1.5*")."""
    versions = ctx.cluster.versions
    return {
        name: pattern.format(docker=versions.docker, containerd=versions.containerd) + "*"
        for name, pattern in runtime_packages(runtime_settings(ctx).source, ctx.cluster.os).items()
    }


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = runtime_settings(ctx)
    codename = DISTRIBUTIONS[ctx.cluster.os][1]

    def file(path: str, template: str, check: str | None = None, **extra: object) -> ManagedFile:
        content = render_template(f"container_runtime/{template}", cfg=cfg, ctx=ctx, **extra)
        return ManagedFile("container_runtime", path, content, check=check)

    binaries = cfg.source == "binaries"
    return [
        # Rendered for every source so every host runs the same operations; "Enabled: no"
        # keeps Docker's repository out of apt where the distribution's packages are used.
        file(
            DOCKER_SOURCES,
            "docker.sources.j2",
            url=docker_repository(ctx),
            codename=codename,
            key=DOCKER_KEY,
        ),
        file(DOCKER_PIN, "preferences.j2", pins=pinned_packages(ctx)),
        # Checked by the binaries themselves, so they are written after the packages.
        file(
            CONTAINERD_CONFIG,
            "config.toml.j2",
            check="containerd --config {path} config dump >/dev/null",
            drop_ins=CONTAINERD_DROP_INS,
            nvidia=None,
        ),
        *(
            [ManagedFile("container_runtime", CONTAINERD_UNIT, CONTAINERD_UNIT_TEXT)]
            if binaries
            else [
                file(
                    DOCKER_CONFIG,
                    "daemon.json.j2",
                    check="dockerd --validate --config-file {path}",
                    docker_nvidia=docker_runtime(ctx),
                )
            ]
        ),
    ]
