"""The nvidia role's record: GPU workers, in rolling batches (a driver change reboots them);
its checks refuse pins that do not fit each other at `inventory validate`."""

from __future__ import annotations

from roles.nvidia.compat import check_pins
from roles.nvidia.config import NvidiaConfig
from toolkit.spec import Phase, Role, Rolling, lazy

ROLE = Role(
    name="nvidia",
    config=NvidiaConfig,
    # After container_runtime (registry order): the drop-in and daemon.json entry need both.
    phases=(
        Phase(
            ("gpu_worker",),
            lazy("roles.nvidia.files:managed_files"),
            lazy("roles.nvidia.deploy:apply"),
            Rolling.batches,
        ),
    ),
    checks=check_pins,
    provides={
        "docker_runtime": lazy("roles.nvidia.runtime:docker_runtime"),
        "runtime_installed": lazy("roles.nvidia.runtime:runtime_installed"),
    },
    summary="NVIDIA driver, CUDA, cuDNN, NCCL, fabric manager, DCGM, container toolkit: pinned, "
    "held, checked against each other",
)
