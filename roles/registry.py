"""Every role's configuration model, by the name used under group_vars and host vars."""

from __future__ import annotations

from pydantic import BaseModel

from roles.base.config import BaseConfig
from roles.dns.config import DnsConfig
from roles.firewall.config import FirewallConfig
from roles.gpu_health.config import GpuHealthConfig

ROLE_CONFIGS: dict[str, type[BaseModel]] = {
    "base": BaseConfig,
    "gpu_health": GpuHealthConfig,
    "firewall": FirewallConfig,
    "dns": DnsConfig,
}
