"""The container_runtime role: containerd (CRI, systemd cgroups, pinned pause image, registry
mirrors) and Docker (rotated logs, live-restore, data root), validated before they go live."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, server

from roles.container_runtime import files as runtime_files
from roles.container_runtime.files import (
    CONTAINERD_CONFIG,
    DOCKER_CONFIG,
    DOCKER_KEY,
    DOCKER_PIN,
    DOCKER_SOURCES,
    docker_repository,
    pinned_packages,
    runtime_settings,
)
from toolkit.aptkeys import repository_key
from toolkit.operations import put_file, restart_if_running, service_running
from toolkit.spec import HostContext


def wait_for(command: str, seconds: int = 60) -> str:
    """A readiness check: retry `command` each second, then run it once more to report why."""
    retries = f"for i in $(seq {seconds}); do {command} >/dev/null 2>&1 && exit 0; sleep 1; done"
    return f"{retries}; {command}"


@deploy("Container runtime")
def apply(ctx: HostContext) -> None:
    cfg = runtime_settings(ctx)
    managed = {f.path: f for f in runtime_files.managed_files(ctx)}
    sources = put_file(managed[DOCKER_SOURCES])
    put_file(managed[DOCKER_PIN])
    repository_key(
        name="Fetch Docker's repository key",
        enabled=cfg.source == "docker",
        url=f"{docker_repository(ctx)}/gpg",
        fingerprint=cfg.docker_key_fingerprint,
        dest=DOCKER_KEY,
    )
    apt.update(name="Refresh package lists for Docker's repository", _if=sources.did_change)
    apt.packages(
        name="Install the container runtime",
        packages=list(pinned_packages(ctx)),
        no_recommends=True,
    )
    containerd = put_file(managed[CONTAINERD_CONFIG])
    docker = put_file(managed[DOCKER_CONFIG])
    service_running(name="Run containerd", unit="containerd")
    service_running(name="Run docker", unit="docker")
    restart_if_running(
        name="Restart containerd for its new configuration",
        unit="containerd",
        _if=containerd.did_change,
    )
    server.shell(
        name="Wait for containerd",
        commands=[wait_for("ctr version")],
        _if=containerd.did_change,
    )
    docker_changed = [lambda: docker.did_change() or containerd.did_change()]
    restart_if_running(
        name="Restart docker for its new configuration",
        unit="docker",
        _if=docker_changed,
    )
    server.shell(name="Wait for docker", commands=[wait_for("docker info")], _if=docker_changed)
