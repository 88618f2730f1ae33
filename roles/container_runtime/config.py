"""Defaults of the container_runtime role (containerd + Docker); inventory group_vars/host vars
under `container_runtime:` override them. Versions come from the cluster's `versions`."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from inventory.grammar import ImageRef, KeyFingerprint, PlainPath, ServerAddress, Url


class ContainerRuntimeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # "docker": Docker's own apt repository (docker-ce, containerd.io), what Ubuntu fleets run;
    # "distribution": the OS archive (Debian 13: docker.io, docker-cli, containerd);
    # "binaries": containerd's release tarball checked against containerd_sha256 and runc from
    # the OS archive, no Docker (Kubespray's way; a Kubernetes node needs no dockerd). The way to
    # containerd 2 where the OS ships 1.7 (Debian 13), which Kubernetes 1.36 requires.
    source: Literal["docker", "distribution", "binaries"] = "docker"
    # Base URL holding v<version>/containerd-<version>-linux-amd64.tar.gz (source: binaries):
    # containerd's releases, or a file server of the same layout (Kubespray's `files_repo`).
    containerd_url: Url = "https://github.com/containerd/containerd/releases/download"
    # SHA-256 of that tarball (source: binaries). No default: a pin is only a pin when it was
    # read from the release's own checksum file by whoever sets versions.containerd.
    containerd_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    # Docker's repository; a fleet mirror of it goes here.
    docker_repo_url: Url = "https://download.docker.com/linux"
    # Docker's release key, pinned by fingerprint: a key that does not match is refused.
    # Published at https://docs.docker.com/engine/install/ubuntu/
    docker_key_fingerprint: KeyFingerprint = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
    # Kubelet and containerd must agree on the pause image, or pods restart their sandboxes;
    # 3.10.1 is what kubeadm 1.35 expects.
    sandbox_image: ImageRef = "registry.k8s.io/pause:3.10.1"
    # runc's cgroup manager, the same as kubelet's (kubernetes.cgroup_driver): systemd on every
    # systemd host with cgroup v2; cgroupfs only on the lab's nested cgroup v1 hosts.
    cgroup_driver: Literal["systemd", "cgroupfs"] = "systemd"
    # Never give a container a lower oom_score_adj than containerd's own: for hosts where root
    # lacks CAP_SYS_RESOURCE (rootless, or the lab's machine), which cannot lower it, so runc
    # would fail every pod sandbox (kubelet asks for -998). Off wherever root is root.
    restrict_oom_score_adj: bool = False
    # A plain-HTTP mirror serves images anyone on the path can swap: refused unless the
    # inventory takes it on purpose (the lab's registry, on its own bridge). Declared before
    # the mirrors: their check reads it.
    allow_insecure_registries: bool = False
    # Registry host -> mirror endpoints tried first (pull-through caches keep thousands of
    # nodes from hammering a public registry at once).
    registry_mirrors: dict[ServerAddress, list[Url]] = Field(default_factory=dict)
    # Docker's data: images and containers belong on the local data disk, not the root disk.
    data_root: PlainPath = "/var/lib/docker"
    # json-file logs without rotation fill the disk: keep 5 files of 100 MB per container.
    log_max_size: str = Field("100m", pattern=r"^[0-9]+[kmg]$")
    log_max_file: int = Field(5, ge=1)
    # Containers keep running while dockerd restarts (upgrades, config changes).
    live_restore: bool = True

    @model_validator(mode="after")
    def _binaries_need_a_pin(self) -> ContainerRuntimeConfig:
        if self.source == "binaries" and self.containerd_sha256 is None:
            raise ValueError("source: binaries needs containerd_sha256 (the tarball's SHA-256)")
        return self

    # dockerd --validate (Docker 26) checks only the JSON's shape: a bad mirror URL passes it
    # and then stops dockerd from starting, so the inventory refuses it instead.
    @field_validator("registry_mirrors")
    @classmethod
    def _mirrors_are_urls(
        cls, mirrors: dict[str, list[str]], info: ValidationInfo
    ) -> dict[str, list[str]]:
        for registry, endpoints in mirrors.items():
            for endpoint in endpoints:
                url = urlparse(endpoint)
                if url.scheme not in ("http", "https") or not url.netloc:
                    raise ValueError(f"{registry}: {endpoint!r} is not an http(s) URL")
                if url.scheme == "http" and not info.data.get("allow_insecure_registries"):
                    raise ValueError(
                        f"{registry}: {endpoint} over plain HTTP: use https, or take it on "
                        "purpose with allow_insecure_registries: true"
                    )
        return mirrors
