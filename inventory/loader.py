"""Load a cluster from cluster.yml or an Ansible inventory, validating all of it before use."""

from __future__ import annotations

from pathlib import Path

import yaml

from inventory.ansible_import import import_ansible
from inventory.building import SAFE_LOADER, RoleChecks, load_cluster_file
from inventory.model import LoadedCluster
from inventory.paths import CLUSTER_FILE_NAMES, locate


def load(path: str | Path, role_checks: RoleChecks | None = None) -> LoadedCluster:
    """Load a cluster file, a folder holding one, or an Ansible inventory (InventoryInvalid).
    With `role_checks`, the roles' settings are merged and checked in the same pass, so every
    problem of the inventory is reported at once."""
    path = Path(path)
    target = locate(path)
    if _is_ansible(target):
        return import_ansible(target, role_checks=role_checks).loaded
    return load_cluster_file(target, role_checks)


def _is_ansible(path: Path) -> bool:
    if path.name in CLUSTER_FILE_NAMES:
        return False
    if path.suffix not in (".yml", ".yaml"):
        return True  # INI inventories have no fixed suffix
    try:
        data = yaml.load(path.read_text(), Loader=SAFE_LOADER)
    except (yaml.YAMLError, OSError):
        return False  # let the cluster loader report it with a line number
    return isinstance(data, dict) and "all" in data and "hosts" not in data
