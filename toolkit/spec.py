"""The shared types of every role: one host's context, a managed file, and the role record.

A leaf module: it imports only the inventory layer, so every role package can import it and the
engine (registry, render, runner) builds on it. Data flows one way: inventory -> model ->
per-host typed role config (here, in `HostContext`) -> operations -> hosts -> report.

A role never imports another role: it reads another role's settings by the role's name
(`HostContext.settings_of`, `settings_of`) and calls what another role's record `provides` by
name (`provided`), resolved on the first call the way `lazy` resolves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel

from inventory.model import Cluster, Host, LoadedCluster
from inventory.topology import FirewallRule, Topology

Config = TypeVar("Config", bound=BaseModel)


@dataclass(frozen=True)
class ManagedFile:
    """One file a role owns on a host: the same content is rendered offline and uploaded."""

    role: str
    path: str  # absolute path on the host
    content: str
    mode: str = "0644"
    user: str = "root"
    group: str = "root"
    secret: bool = False  # never shown in diffs, plans or logs
    # A command that validates a candidate file ("nft -c -f {path}"): when set, the new content
    # is staged beside the live file, checked, and only then moved into place.
    check: str | None = None


@dataclass(frozen=True)
class HostContext:
    """What a role's files and deploy see of one host: the cluster, its topology (with every
    role's firewall rules, gathered by the registry) and the host's typed settings of every role
    (merged once at load: defaults < group_vars in group order < host vars)."""

    loaded: LoadedCluster
    topology: Topology
    name: str
    settings: Mapping[str, BaseModel] = field(default_factory=dict)  # role name -> config
    # Every role's cluster-wide files (relative path under _cluster/ -> content), rendered on
    # the first call and shared by every host of a load: the kubernetes role applies them.
    cluster_files: Callable[[], Mapping[str, str]] = field(default=dict, compare=False)
    # The paths every role's phases render on this host (engine/context.py), computed on the
    # first call: the checks that tell gpuinfra's files from others' go by path, since a
    # marker copied into a foreign file proves nothing, and a role never lists another's files.
    rendered_paths: Callable[[], frozenset[str]] = field(default=frozenset, compare=False)

    @property
    def cluster(self) -> Cluster:
        return self.loaded.cluster

    @property
    def host(self) -> Host:
        return self.cluster.hosts[self.name]

    @property
    def address(self) -> str:
        return str(self.host.address)

    def config(self, model: type[Config]) -> Config:
        """The host's settings of the role whose config model is `model`, typed."""
        for value in self.settings.values():
            if type(value) is model:
                return value
        raise KeyError(f"{self.name}: no settings of {model.__name__} (role not registered?)")

    def settings_of(self, role: str) -> Any:
        """The host's settings of another role, by its name (a role never imports another)."""
        try:
            return self.settings[role]
        except KeyError:
            raise KeyError(f"{self.name}: no settings of the role {role!r}") from None


def merged_settings(cluster: Cluster, host: str, role: str) -> dict[str, Any]:
    """A role's raw settings for a host: group_vars of "all", then of each of the host's groups
    in the order it lists them, then the host's own vars; a later key replaces an earlier one."""
    merged: dict[str, Any] = {}
    entry = cluster.hosts[host]
    for group in ["all", *entry.groups]:
        merged.update(cluster.group_vars.get(group, {}).get(role, {}))
    merged.update(entry.vars.get(role, {}))
    return merged


def host_config(loaded: LoadedCluster, host: str, role: str, model: type[Config]) -> Config:
    """One host's settings of one role, typed: as computed at load, or merged now for a cluster
    loaded without the roles (the inventory layer alone)."""
    value = loaded.settings.get(host, {}).get(role)
    if isinstance(value, model):
        return value
    return model.model_validate(merged_settings(loaded.cluster, host, role))


def record_of(role: str) -> Role:
    """The record of the role named `role`, imported by name as `lazy` imports a function."""
    return importlib.import_module(f"roles.{role}.role").ROLE


def settings_of(loaded: LoadedCluster, host: str, role: str) -> Any:
    """One host's settings of another role, by the role's name: `host_config` with the model
    its record declares."""
    return host_config(loaded, host, role, record_of(role).config)


def default_settings(role: str) -> Any:
    """Another role's defaults (its config model with nothing set), by the role's name."""
    return record_of(role).config()


def provided(role: str, name: str) -> Callable:
    """The function the record of `role` provides as `name`, looked up on its first call: how a
    role calls another's code without importing it (tests/unit/test_layering.py checks that
    every such name is in the providing record)."""
    resolved: list[Callable] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not resolved:
            provides = record_of(role).provides
            if name not in provides:
                raise KeyError(f"the role {role!r} provides no {name!r} (its record's provides)")
            resolved.append(provides[name])
        return resolved[0](*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


class PreApplyRefused(Exception):
    """A role's pre-apply check refused the apply: the message names the host and why."""


class Rolling(StrEnum):
    """How a phase may roll over its hosts, in `apply --batch` steps and in reboots."""

    # A quorum group (etcd): applied in one step so a new cluster bootstraps with every member
    # starting together; its restarts (inside the deploy) and its reboots go one member at a time.
    together = "together"
    # Members that each keep a service up (API servers, load balancers, DNS servers): never two
    # of them in one step, so the others keep serving while one changes or reboots.
    one_at_a_time = "one_at_a_time"
    # Interchangeable hosts (workers): `--batch` sizes the steps and `--rate` spaces them.
    batches = "batches"


def lazy(target: str) -> Callable:
    """The function `module:name`, imported on its first call. A record names its files,
    deploy and cluster files this way: deploys import pyinfra and files import Jinja and
    cryptography, which `inventory validate` and `--help` never need."""
    module, _, name = target.partition(":")
    resolved: list[Callable] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not resolved:
            resolved.append(getattr(importlib.import_module(module), name))
        return resolved[0](*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = module
    return call


HostFiles = Callable[[HostContext], list[ManagedFile]]
HostDeploy = Callable[[HostContext], None]


@dataclass(frozen=True)
class Phase:
    """One deploy of a role on some groups (None: every host), with the files it manages."""

    groups: tuple[str, ...] | None
    files: HostFiles | None = None
    deploy: HostDeploy | None = None
    rolling: Rolling = Rolling.batches
    role: str = ""  # filled in by the Role that holds the phase
    # A phase the inventory turns on for the whole fleet (None: always on): off, it is on no
    # host, so it adds no operation, fact or role to any host's run or record (drift_job).
    when: Callable[[Cluster], bool] | None = None

    def applies_to(self, host_groups: Iterable[str], cluster: Cluster) -> bool:
        if self.when is not None and not self.when(cluster):
            return False
        return self.groups is None or any(g in self.groups for g in host_groups)


# The inventory rules a role adds (nvidia: pins that must fit each other): (key path, message).
HostSettings = Mapping[str, Mapping[str, BaseModel]]  # host -> role -> typed config
ClusterCheck = Callable[[LoadedCluster, HostSettings], Iterable[tuple[str, str]]]
# Inbound rules a role's hosts need, by group ("all" for every host).
PortRules = Callable[[LoadedCluster], Mapping[str, Iterable[FirewallRule]]]
# Cluster-wide files (Kubernetes manifests) under _cluster/: relative path -> content.
ClusterFiles = Callable[[LoadedCluster], Mapping[str, str]]
# Run before an apply changes anything (under the cluster lock, before the operator confirms):
# raises PreApplyRefused to stop it (etcd: the members must trust the controller's CA).
PreApplyCheck = Callable[[LoadedCluster], object]


@dataclass(frozen=True)
class Role:
    """Everything the engine knows of a role, declared once in the role's own package.

    `tests/verify/<name>/` holds its testinfra suites and `templates/<name>/` its templates:
    both are found by the role's name, so adding a role is its folder plus one registry line.
    """

    name: str
    config: type[BaseModel]
    phases: tuple[Phase, ...] = ()
    ports: PortRules | None = None
    cluster_files: ClusterFiles | None = None
    checks: ClusterCheck | None = None
    pre_apply: PreApplyCheck | None = None
    # Functions other roles call by name through `provided(role, name)`: what the role offers.
    provides: Mapping[str, Callable] = field(default_factory=dict)
    summary: str = ""  # one line for `gpuinfra render --help` and the docs

    def __post_init__(self) -> None:
        # Each phase knows its role's name, so a report groups operations by role.
        filled = tuple(
            phase if phase.role == self.name else _with_role(phase, self.name)
            for phase in self.phases
        )
        object.__setattr__(self, "phases", filled)

    @property
    def groups(self) -> tuple[str, ...] | None:
        """The groups its phases target (None: every host); verify runs its suites there."""
        if any(phase.groups is None for phase in self.phases):
            return None
        return tuple(dict.fromkeys(g for phase in self.phases for g in phase.groups or ()))


def _with_role(phase: Phase, role: str) -> Phase:
    return Phase(phase.groups, phase.files, phase.deploy, phase.rolling, role, phase.when)
