"""The container runtime role's record: containerd and Docker on Kubernetes nodes."""

from __future__ import annotations

from roles.container_runtime.config import ContainerRuntimeConfig
from toolkit.spec import Phase, Role, lazy

KUBERNETES_NODES = ("control_plane", "gpu_worker", "cpu_worker")

ROLE = Role(
    name="container_runtime",
    config=ContainerRuntimeConfig,
    phases=(
        Phase(
            KUBERNETES_NODES,
            lazy("roles.container_runtime.files:managed_files"),
            lazy("roles.container_runtime.deploy:apply"),
        ),
    ),
    summary="containerd and Docker, configured for GPUs",
)
