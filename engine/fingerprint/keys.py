"""What the deploys were given, as digests: the code, the inventory, the controller's `.state/`
and each host's rendered files (the key), and the same without the files (the inputs)."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.fingerprint.records import FORMAT, RECORDS, Record
from toolkit import clock
from toolkit.statefiles import ETCD_SNAPSHOTS, PLACEHOLDER, StateMissing

if TYPE_CHECKING:
    from inventory.model import Cluster, LoadedCluster
    from toolkit.spec import HostContext, ManagedFile


# What `.state/` holds that no deploy reads: the locks, the fast path's own records, and the
# etcd snapshots (day 2 writes them; a restore is given its file): a new snapshot, hundreds of
# MiB on a big cluster, moves no host's key and is not hashed by every drift.
_STATE_IGNORED = {".lock", "apply.lock", RECORDS, ETCD_SNAPSHOTS}


# -- what the deploys were given ---------------------------------------------------------------

_code_digest: str | None = None
_ROOT = Path(__file__).resolve().parents[2]


def code_digest(again: bool = False) -> str:
    """The roles' and the inventory layer's code and templates, Python's version and every
    installed distribution's name and version (pyinfra's, Jinja's, pydantic's...), as they were
    at the first call of the process (`again`: as they are on disk now, the first kept). The
    command line takes it before an apply imports the inventory or a role (cli/launch.py); the
    apply records its hosts only when the files are still those at its end
    (engine/fingerprint/recording.py), so a record never names code the run did not have
    loaded."""
    global _code_digest
    if _code_digest is None or again:
        digest = hashlib.sha256(f"{sys.version}\n{' '.join(_distributions())}\n".encode())
        for name, path in code_files():
            digest.update(f"{name}\n".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        if _code_digest is None:
            _code_digest = digest.hexdigest()
        return digest.hexdigest()
    return _code_digest


def code_files() -> list[tuple[str, Path]]:
    """(name, path) of each file of the engine's, the roles' and the inventory layer's code and
    templates: the Python of those packages, of the role toolkit and of the GPU health agent
    (hashed as when it was part of its role; `inventory/` also holds inventories) and every
    template."""
    from toolkit.assets import TEMPLATES

    root = Path(__file__).resolve().parents[2]
    found = []
    for folder, pattern in (
        (root / "engine", "*.py"),
        (root / "toolkit", "*.py"),
        (root / "roles", "*.py"),
        (root / "gpuhealth", "*.py"),
        (root / "inventory", "*.py"),
        (TEMPLATES, "*"),
    ):
        for path in sorted(folder.rglob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                found.append((str(path.relative_to(folder.parent)), path))
    return found


def _distributions() -> list[str]:
    """The installed distributions as their metadata folders are named ("pyinfra-3.5.1.dist-info")
    on the import path: a listing, where importlib.metadata would parse each one. In the folder
    that holds gpuinfra's own code, gpuinfra's own metadata is left out, and only that: a
    checkout is on sys.path or not depending on how gpuinfra was started (its code is in
    code_files either way), while a wheel's folder is site-packages, which holds every
    dependency."""
    found = []
    for entry in dict.fromkeys(sys.path):
        if not entry:
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        own = Path(entry).resolve() == _ROOT
        found += (
            f"{entry}/{n}"
            for n in names
            if n.endswith((".dist-info", ".egg-info"))
            and not (own and n.startswith(("gpuinfra-", "gpuinfra.")))
        )
    return sorted(found)


def state_digest(state_dir: Path) -> str:
    """The controller's state the deploys read (PKI, keys, serials, the operator kubeconfig)."""
    digest = hashlib.sha256()
    if state_dir.is_dir():
        for relative, path in _state_files(state_dir):
            digest.update(f"{relative}\n".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _state_files(state_dir: Path) -> list[tuple[Path, Path]]:
    """(path relative to `state_dir`, path) of each state file, in order of the relative path.
    Symlinks are followed, as the deploys follow them when they read: a folder or key linked in
    from elsewhere is state all the same. A link to a folder it is inside is not entered again."""
    found: list[tuple[Path, Path]] = []

    def walk(folder: Path, inside: frozenset[str]) -> None:
        real = os.path.realpath(folder)
        if real in inside:
            return
        with os.scandir(folder) as listing:
            entries = list(listing)
        for entry in entries:
            path = Path(entry.path)
            relative = path.relative_to(state_dir)
            if relative.parts[0] in _STATE_IGNORED:
                continue
            if entry.is_dir():
                walk(path, inside | {real})
            elif entry.is_file() and not entry.name.endswith(".partial"):
                found.append((relative, path))

    walk(state_dir, frozenset())
    return sorted(found)


def cluster_digest(loaded: LoadedCluster) -> str:
    return hashlib.sha256(loaded.cluster.model_dump_json().encode()).hexdigest()


def inputs_key(common: str, name: str) -> str:
    """What a host's files and settings are made from: `common` (code, cluster, state) and its
    name; with the clock's horizon, it stands for `host_key` (see the module)."""
    return hashlib.sha256(f"{FORMAT}\n{common}\n{name}\ninputs\n".encode()).hexdigest()


def inputs_stand(record: Record, common: str, name: str) -> bool:
    """Whether the record's inputs stand for its key: the same inputs, and the clock not yet
    at the moment it may change the files."""
    return record.inputs == inputs_key(common, name) and not clock.expired(record.valid_until)


def host_key(ctx: HostContext, common: str, files: list[ManagedFile] | None = None) -> str:
    """The key of one host: `common` (code, cluster, state), its settings and its files
    (rendered now unless given)."""
    from engine.context import host_files

    digest = hashlib.sha256(f"{FORMAT}\n{common}\n{ctx.name}\n".encode())
    for role, settings in sorted(ctx.settings.items()):
        digest.update(f"{role} {settings.model_dump_json()}\n".encode())
    for managed in host_files(ctx) if files is None else files:
        head = f"{managed.role} {managed.path} {managed.mode} {managed.user}:{managed.group} "
        digest.update(head.encode() + hashlib.sha256(managed.content.encode()).digest())
    return digest.hexdigest()


def common_digest(loaded: LoadedCluster) -> str:
    return f"{code_digest()} {cluster_digest(loaded)} {state_digest(loaded.state_dir)}"


@dataclass(frozen=True)
class Keys:
    key: str
    inputs: str
    valid_until: float | None


def record_keys(
    loaded: LoadedCluster, names: Iterable[str], common: str
) -> tuple[dict[str, Keys], dict[str, str]]:
    """Each host's keys, its files rendered afresh as drift renders them (the state as it is,
    nothing made) while the clock is watched: the cluster files first (every host's horizon
    includes theirs), then each host's own. A host whose files need state that is missing
    (a role not applied yet) or hold a placeholder for what only apply makes (a certificate
    that entered its renewal window since) gets no keys: (keys, host -> why not). `common` is
    common_digest(loaded)."""
    from engine.context import host_contexts, host_files
    from inventory.model import StateAccess

    names = list(names)
    if not names:
        return {}, {}
    loaded = loaded.with_state_access(StateAccess.existing)
    contexts = {ctx.name: ctx for ctx in host_contexts(loaded)}
    keys: dict[str, Keys] = {}
    unkeyed: dict[str, str] = {}
    try:
        with clock.watching() as shared:
            contexts[names[0]].cluster_files()
    except StateMissing as missing:
        return {}, dict.fromkeys(names, str(missing))
    for name in names:
        try:
            with clock.watching() as horizon:
                files = host_files(contexts[name])
        except StateMissing as missing:
            unkeyed[name] = str(missing)
            continue
        held = [managed.path for managed in files if PLACEHOLDER in managed.content]
        if held:
            unkeyed[name] = f"{held[0]} would be made by the next apply"
            continue
        if shared.until is not None:
            horizon.limit(shared.until)
        key = host_key(contexts[name], common, files)
        keys[name] = Keys(key, inputs_key(common, name), horizon.until)
    return keys, unkeyed


def host_roles(
    groups: Iterable[str], wanted: Iterable[str] = (), *, cluster: Cluster
) -> tuple[str, ...]:
    """The roles with a phase on a host of these groups in `cluster` (of `wanted`; all when
    empty), in phase order."""
    from engine.registry import PHASES

    wanted, groups = set(wanted), list(groups)
    roles = [
        phase.role
        for phase in PHASES
        if (not wanted or phase.role in wanted) and phase.applies_to(groups, cluster)
    ]
    return tuple(dict.fromkeys(roles))
