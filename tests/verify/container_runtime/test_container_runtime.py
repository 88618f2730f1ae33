"""The container_runtime role, checked on the running host: containerd and Docker run, with
the cgroup driver kubelet uses (systemd; cgroupfs where the inventory says so), live-restore
and rotated logs. With source: binaries, containerd is the pinned release and Docker is absent."""

from __future__ import annotations

import json

from roles.container_runtime.config import ContainerRuntimeConfig


def settings(ctx) -> ContainerRuntimeConfig:
    return ctx.config(ContainerRuntimeConfig)


def docker_info(host, ctx) -> dict | None:
    """`docker info`; None where the inventory installs no Docker (source: binaries), once it is
    checked that none is there."""
    if settings(ctx).source == "binaries":
        assert not host.exists("dockerd"), (
            "source: binaries installs no Docker, yet dockerd is here"
        )
        return None
    return json.loads(host.check_output("docker info --format '{{json .}}'"))


def test_containerd_running_and_enabled(host) -> None:
    service = host.service("containerd")
    assert service.is_running
    assert service.is_enabled


def test_docker_running_and_enabled(host, ctx) -> None:
    if docker_info(host, ctx) is None:
        return
    service = host.service("docker")
    assert service.is_running
    assert service.is_enabled


def test_containerd_is_the_pinned_version(host, ctx) -> None:
    """containerd --version: "... v2.2.9 ..." from its release, "... 1.7.24~ds1 ..." from Debian."""
    assert ctx.cluster.versions.containerd in host.check_output("containerd --version")


def test_containerd_socket_exists(host) -> None:
    assert host.socket("unix:///run/containerd/containerd.sock").is_listening


def test_containerd_answers(host) -> None:
    assert host.run("ctr version").rc == 0


def test_containerd_uses_the_cgroup_driver_and_pinned_pause_image(host, ctx) -> None:
    dump = host.check_output("containerd config dump")
    systemd = settings(ctx).cgroup_driver == "systemd"
    assert f"SystemdCgroup = {'true' if systemd else 'false'}" in dump
    # containerd 1.x's CRI section names it sandbox_image; 2.x's pinned images name it sandbox.
    image = settings(ctx).sandbox_image
    named = (f'sandbox_image = "{image}"', f"sandbox = '{image}'", f'sandbox = "{image}"')
    assert any(line in dump for line in named)


def test_docker_cgroup_driver_is_systemd(host, ctx) -> None:
    info = docker_info(host, ctx)
    assert info is None or info["CgroupDriver"] == "systemd"


def test_docker_live_restore(host, ctx) -> None:
    info = docker_info(host, ctx)
    assert info is None or info["LiveRestoreEnabled"] is settings(ctx).live_restore


def test_docker_logs_rotate(host, ctx) -> None:
    cfg, info = settings(ctx), docker_info(host, ctx)
    if info is None:
        return
    assert info["LoggingDriver"] == "json-file"
    daemon = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert daemon["log-opts"] == {"max-size": cfg.log_max_size, "max-file": str(cfg.log_max_file)}


def test_docker_data_root(host, ctx) -> None:
    info = docker_info(host, ctx)
    assert info is None or info["DockerRootDir"] == settings(ctx).data_root
