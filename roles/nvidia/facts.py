"""Live facts of a GPU worker's NVIDIA stack, read on the host: the driver and persistence mode
from NVML (nvidia-smi), the CUDA driver API version from libcuda, the NCCL and cuDNN versions
from the installed libraries themselves, fabric manager and NVSwitch state, and which of the
stack's packages are installed and held."""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra.api import FactBase

# A standard-library script run by the host's python3 (see its docstring).
STACK_PROBE = (Path(__file__).parent / "stack_probe.py").read_text()


class NvidiaStack(FactBase):
    """What the host's NVIDIA stack says about itself, e.g.::

        {"driver_loaded": "no", "nvml_error": "NVIDIA-SMI has failed because it couldn't
         communicate with the NVIDIA driver...", "nvml_library": "libnvidia-ml.so.550.163.01",
         "cuda_driver_api": "12.4", "nccl": "2.22.3", "nccl_library": "libnccl.so.2.22.3",
         "cudnn_library": "", "nvswitch_devices": "0", "fabricmanager": "inactive"}

    With a GPU: "driver_version" ("550.163.01"), "persistence" ("Enabled") and "gpus" ("8").
    """

    default = dict

    def command(self) -> str:
        return f"python3 -c {shlex.quote(STACK_PROBE)}"

    def process(self, output: list[str]) -> dict[str, str]:
        return dict(line.split("=", 1) for line in output if "=" in line)


class DriverLoaded(FactBase):
    """Whether the NVIDIA kernel module is loaded (/proc/driver/nvidia/version), so services
    that talk to the GPUs (nvidia-persistenced, fabric manager) can start. Not /dev/nvidiactl:
    NVML creates that node itself when it can, driver or not (seen in a lab host)."""

    def command(self) -> str:
        return "test -e /proc/driver/nvidia/version && echo yes || echo no"

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"


class NvswitchDevices(FactBase):
    """NVSwitch devices the loaded driver lists (/proc/driver/nvidia-nvswitch/devices)."""

    default = list

    def command(self) -> str:
        return "ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]
