"""The nvidia role: driver, CUDA, cuDNN, NCCL, fabric manager, DCGM and the container toolkit,
pinned and held on GPU workers, checked against each other at `inventory validate`."""

from __future__ import annotations

from roles.nvidia import deploy, files
from roles.nvidia.compat import check_pins
from roles.nvidia.config import NvidiaConfig
from roles.spec import Phase, Role, Rolling

ROLE = Role(
    name="nvidia",
    config=NvidiaConfig,
    # Workers are interchangeable: a driver change (reboot required) rolls in --batch steps.
    phases=(Phase(("gpu_worker",), files.managed_files, deploy.apply, Rolling.batches),),
    checks=check_pins,
    summary="NVIDIA driver, CUDA, cuDNN, NCCL, fabric manager, DCGM, container toolkit: pinned, "
    "held, checked against each other",
)
