"""Inventory rules of the fleet policy that its config schema cannot express: (key, message)."""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import ValidationError

from inventory.model import LoadedCluster
from roles.fleet_policy import gang
from roles.fleet_policy.config import FleetPolicyConfig

SETTINGS = "group_vars.all.fleet_policy"


def problems(loaded: LoadedCluster) -> Iterator[tuple[str, str]]:
    cluster = loaded.cluster
    for group, roles in cluster.group_vars.items():
        if group != "all" and "fleet_policy" in roles:
            yield f"group_vars.{group}.fleet_policy", "cluster-wide settings: set them under all"
    for name, host in cluster.hosts.items():
        if "fleet_policy" in host.vars:
            yield f"hosts.{name}.vars.fleet_policy", "cluster-wide settings: set them under all"
    try:
        gang.in_tree_gang(cluster.versions.kubernetes)
    except gang.UnsupportedKubernetes as exc:
        yield "versions.kubernetes", str(exc)
    try:
        cfg = FleetPolicyConfig.model_validate(
            cluster.group_vars.get("all", {}).get("fleet_policy", {})
        )
    except ValidationError:
        return  # the registry's role-vars rule reports these with their keys
    for pool_name, pool in cfg.balloons.items():
        key = f"{SETTINGS}.balloons.{pool_name}"
        if pool.team is not None and pool.team not in cluster.teams:
            known = ", ".join(cluster.teams) or "none"
            yield f"{key}.team", f"unknown team {pool.team} (teams: {known})"
        if pool.gpus and not cluster.in_group("gpu_worker"):
            yield f"{key}.gpus", "GPU balloons need GPU workers; the cluster has none"
