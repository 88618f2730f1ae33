"""Every role's configuration model, by the name used under group_vars and host vars."""

from __future__ import annotations

from pydantic import BaseModel

from roles.base.config import BaseConfig
from roles.container_runtime.config import ContainerRuntimeConfig
from roles.dns.config import DnsConfig
from roles.drift_job.config import DriftJobConfig
from roles.etcd.config import EtcdConfig
from roles.firewall.config import FirewallConfig
from roles.gpu_health.config import GpuHealthConfig
from roles.kernel.config import KernelConfig
from roles.kubernetes.config import KubernetesConfig
from roles.loadbalancer.config import LoadBalancerConfig
from roles.monitoring.config import MonitoringConfig

ROLE_CONFIGS: dict[str, type[BaseModel]] = {
    "base": BaseConfig,
    "etcd": EtcdConfig,
    "gpu_health": GpuHealthConfig,
    "kernel": KernelConfig,
    "container_runtime": ContainerRuntimeConfig,
    "firewall": FirewallConfig,
    "dns": DnsConfig,
    "loadbalancer": LoadBalancerConfig,
    "monitoring": MonitoringConfig,
    "drift_job": DriftJobConfig,
    "kubernetes": KubernetesConfig,
}
