"""The container_runtime role, checked on the running host: containerd and Docker run, with
the cgroup driver kubelet uses (systemd; cgroupfs where the inventory says so), live-restore
and rotated logs."""

from __future__ import annotations

import json

import pytest

from roles.container_runtime.config import ContainerRuntimeConfig


def settings(ctx) -> ContainerRuntimeConfig:
    return ctx.config(ContainerRuntimeConfig)


def docker_info(host) -> dict:
    return json.loads(host.check_output("docker info --format '{{json .}}'"))


@pytest.mark.parametrize("unit", ["containerd", "docker"])
def test_service_running_and_enabled(host, unit: str) -> None:
    service = host.service(unit)
    assert service.is_running
    assert service.is_enabled


def test_containerd_socket_exists(host) -> None:
    assert host.socket("unix:///run/containerd/containerd.sock").is_listening


def test_containerd_answers(host) -> None:
    assert host.run("ctr version").rc == 0


def test_containerd_uses_the_cgroup_driver_and_pinned_pause_image(host, ctx) -> None:
    dump = host.check_output("containerd config dump")
    systemd = settings(ctx).cgroup_driver == "systemd"
    assert f"SystemdCgroup = {'true' if systemd else 'false'}" in dump
    assert f'sandbox_image = "{settings(ctx).sandbox_image}"' in dump


def test_docker_cgroup_driver_is_systemd(host) -> None:
    assert docker_info(host)["CgroupDriver"] == "systemd"


def test_docker_live_restore(host, ctx) -> None:
    assert docker_info(host)["LiveRestoreEnabled"] is settings(ctx).live_restore


def test_docker_logs_rotate(host, ctx) -> None:
    cfg = settings(ctx)
    assert docker_info(host)["LoggingDriver"] == "json-file"
    daemon = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert daemon["log-opts"] == {"max-size": cfg.log_max_size, "max-file": str(cfg.log_max_file)}


def test_docker_data_root(host, ctx) -> None:
    assert docker_info(host)["DockerRootDir"] == settings(ctx).data_root
