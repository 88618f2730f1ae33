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
    """Whether `path` is an Ansible inventory rather than our cluster file. Told by content, not
    by name: `inventory import --out NAME` writes a cluster file under whatever name the
    operator gives, and INI inventories have no fixed suffix either."""
    if path.name in CLUSTER_FILE_NAMES:
        return False
    yaml_named = path.suffix in (".yml", ".yaml")
    try:
        data = yaml.load(path.read_text(), Loader=SAFE_LOADER)
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        # A .yml file is ours to report with a line number; anything else may be INI.
        return not yaml_named
    if isinstance(data, dict) and "hosts" in data:
        return False  # our top-level `hosts:`; an Ansible YAML inventory nests hosts in groups
    if yaml_named:
        return isinstance(data, dict) and "all" in data
    return True
