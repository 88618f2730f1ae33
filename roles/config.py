"""Resolve one role's settings for one host: defaults, then group vars, then host vars."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from inventory.model import Cluster
from roles.registry import ROLE_CONFIGS


def role_settings(cluster: Cluster, host: str, role: str) -> BaseModel:
    """The role's config for a host; the inventory was validated, so keys are known."""
    merged: dict[str, Any] = {}
    entry = cluster.hosts[host]
    for group in ["all", *entry.groups]:
        merged.update(cluster.group_vars.get(group, {}).get(role, {}))
    merged.update(entry.vars.get(role, {}))
    return ROLE_CONFIGS[role].model_validate(merged)


Config = TypeVar("Config", bound=BaseModel)


def role_config(cluster: Cluster, host: str, model: type[Config]) -> Config:
    """The same, typed: the role is the one whose config model is `model`."""
    role = next(name for name, known in ROLE_CONFIGS.items() if known is model)
    cfg = role_settings(cluster, host, role)
    assert isinstance(cfg, model)
    return cfg
