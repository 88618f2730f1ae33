"""Every role's configuration model, by the name used under group_vars and host vars."""

from __future__ import annotations

from pydantic import BaseModel

from roles.base.config import BaseConfig
from roles.drift_job.config import DriftJobConfig
from roles.gpu_health.config import GpuHealthConfig

ROLE_CONFIGS: dict[str, type[BaseModel]] = {
    "base": BaseConfig,
    "gpu_health": GpuHealthConfig,
    "drift_job": DriftJobConfig,
}
