"""Every role's configuration model, by the name used under group_vars and host vars."""

from __future__ import annotations

from pydantic import BaseModel

from roles.base.config import BaseConfig
from roles.gpu_health.config import GpuHealthConfig
from roles.loadbalancer.config import LoadBalancerConfig
from roles.monitoring.config import MonitoringConfig

ROLE_CONFIGS: dict[str, type[BaseModel]] = {
    "base": BaseConfig,
    "gpu_health": GpuHealthConfig,
    "loadbalancer": LoadBalancerConfig,
    "monitoring": MonitoringConfig,
}
