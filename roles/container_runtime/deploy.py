"""The container_runtime role: containerd (CRI, systemd cgroups, pinned pause image, registry
mirrors) and Docker (rotated logs, live-restore, data root), validated before they go live."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from roles.container_runtime import files as runtime_files
from roles.container_runtime.files import (
    CONTAINERD_CONFIG,
    CONTAINERD_UNIT,
    DOCKER_CONFIG,
    DOCKER_KEY,
    DOCKER_PIN,
    DOCKER_SOURCES,
    docker_repository,
    pinned_packages,
    runtime_settings,
)
from roles.container_runtime.operations import containerd_binaries, containerd_tarball_url
from toolkit.aptkeys import repository_key
from toolkit.effective import only_ours, ours_or_declared, unit_dropins
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
    binaries = cfg.source == "binaries"
    if binaries:
        version = ctx.cluster.versions.containerd
        apt.packages(name="Install runc", packages=["runc"], no_recommends=True)
        installed = containerd_binaries(
            name="Install containerd from its release",
            url=containerd_tarball_url(cfg.containerd_url, version),
            version=version,
            sha256=cfg.containerd_sha256,
        )
        unit = put_file(managed[CONTAINERD_UNIT])
        systemd.daemon_reload(name="Reload systemd for containerd's unit", _if=unit.did_change)
    else:
        apt.packages(
            name="Install the container runtime",
            packages=list(pinned_packages(ctx)),
            no_recommends=True,
        )
    containerd = put_file(managed[CONTAINERD_CONFIG])
    service_running(name="Run containerd", unit="containerd")
    # did_change looked up when the condition runs: a plan answers it with what the operation
    # will do (pyinfra_api.conditions_hold), which a method bound here would not.
    changes = [containerd, installed] if binaries else [containerd]
    restart_containerd = [lambda: any(op.did_change() for op in changes)]
    restart_if_running(
        name="Restart containerd for its new configuration",
        unit="containerd",
        _if=restart_containerd,
    )
    server.shell(
        name="Wait for containerd",
        commands=[wait_for("ctr version")],
        _if=restart_containerd,
    )
    allowed = ours_or_declared(ctx)
    unit_dropins("Check the drop-ins of containerd and Docker", ("containerd", "docker"), allowed)
    only_ours(
        "Check that containerd imports only gpuinfra's files",
        runtime_files.CONTAINERD_DROP_INS,
        allowed,
        "containerd imports it, and an imported file replaces a whole plugin section",
    )
    if binaries:
        return  # no Docker: a Kubernetes node needs none, and Debian's would bring containerd 1.7
    docker = put_file(managed[DOCKER_CONFIG])
    service_running(name="Run docker", unit="docker")
    docker_changed = [lambda: docker.did_change() or containerd.did_change()]
    restart_if_running(
        name="Restart docker for its new configuration",
        unit="docker",
        _if=docker_changed,
    )
    server.shell(name="Wait for docker", commands=[wait_for("docker info")], _if=docker_changed)
