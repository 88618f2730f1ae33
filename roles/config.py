"""Resolve one role's settings for one host: defaults, then group vars, then host vars."""

from __future__ import annotations

from typing import Any

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
