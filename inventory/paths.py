"""Which file a cluster argument names: a cluster.yml, a folder holding one, or an Ansible
inventory. Standard library only: the command line finds drift's converged records with it
before it imports the rest of the inventory layer (engine/fingerprint/ send_early)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from inventory.errors import InventoryError, InventoryInvalid

CLUSTER_FILE_NAMES = ("cluster.yml", "cluster.yaml")
ANSIBLE_FILE_NAMES = (
    "hosts.yml",
    "hosts.yaml",
    "hosts.ini",
    "inventory.ini",
    "hosts",
    "inventory",
)


def locate(path: Path) -> Path:
    """The inventory file `path` names (InventoryInvalid when there is none)."""
    if path.is_dir():
        for name in CLUSTER_FILE_NAMES + ANSIBLE_FILE_NAMES:
            if (path / name).is_file():
                return path / name
        raise InventoryInvalid(
            [InventoryError(path, "", "no cluster.yml (or Ansible hosts.yml/hosts.ini) here")]
        )
    if not path.exists():
        raise InventoryInvalid([InventoryError(path, "", "no such file or directory")])
    return path


def text_digest(text: str) -> str:
    """What a cluster file's text was when it was parsed (the file as read, decoded as the
    loader decodes it): the drift that answers without loading (engine/fingerprint/ settled)
    compares it with the text it reads."""
    return hashlib.sha256(text.encode()).hexdigest()
