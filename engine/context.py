"""What every role sees of a cluster, computed once at load: the typed settings of every role
for every host (merged, validated as a whole), the topology with every role's firewall rules,
and one `HostContext` per host. The engine's entry point for loading an inventory."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.registry import ROLE_CONFIGS, ROLES
from inventory.building import RoleSettings
from inventory.loader import load as load_inventory
from inventory.model import Cluster, LoadedCluster, StateAccess
from inventory.topology import FirewallRule, Topology, build_topology
from toolkit.spec import HostContext, ManagedFile, merged_settings


def load(path: str | Path) -> LoadedCluster:
    """Load and validate an inventory with every role's settings (InventoryInvalid): the whole
    inventory is checked, file:line:key for each problem, before anything connects."""
    return load_inventory(path, role_checks=check_roles)


def check_roles(loaded: LoadedCluster) -> tuple[RoleSettings, list[tuple[str, str]]]:
    """Merge each host's settings of each role and validate them together; then each role's
    own cluster checks. Problems are (key path, message), each reported once."""
    cluster = loaded.cluster
    problems: dict[tuple[str, str], None] = dict.fromkeys(_unknown_roles(cluster))
    settings: RoleSettings = {}
    for host in cluster.hosts:
        settings[host] = {}
        for role, model in ROLE_CONFIGS.items():
            try:
                settings[host][role] = model.model_validate(merged_settings(cluster, host, role))
            except ValidationError as exc:
                problems.update(dict.fromkeys(_attribute(cluster, host, role, exc)))
    if not problems:  # a role's checks read typed settings of every host
        for role in ROLES:
            if role.checks is not None:
                problems.update(dict.fromkeys(role.checks(loaded, settings)))
    return settings, list(problems)


def _unknown_roles(cluster: Cluster) -> Iterator[tuple[str, str]]:
    known = ", ".join(sorted(ROLE_CONFIGS))
    sections = [(f"group_vars.{group}", roles) for group, roles in cluster.group_vars.items()]
    sections += [(f"hosts.{name}.vars", host.vars) for name, host in cluster.hosts.items()]
    for prefix, roles in sections:
        for role in roles:
            if role not in ROLE_CONFIGS:
                yield f"{prefix}.{role}", f"unknown role (known: {known})"


def _sources(cluster: Cluster, host: str, role: str) -> list[tuple[str, dict[str, Any]]]:
    """Where a host's settings of a role come from, the one that wins last."""
    entry = cluster.hosts[host]
    found = [
        (f"group_vars.{group}.{role}", cluster.group_vars[group][role])
        for group in ["all", *entry.groups]
        if role in cluster.group_vars.get(group, {})
    ]
    if role in entry.vars:
        found.append((f"hosts.{host}.vars.{role}", entry.vars[role]))
    return found


def _attribute(
    cluster: Cluster, host: str, role: str, exc: ValidationError
) -> Iterator[tuple[str, str]]:
    """Name each error by the section that set the key (the last one, as it wins); an error of
    the settings as a whole (two keys that do not fit together) by the last section that set
    any of them, with the host named: a group's setting may be fine for every other host."""
    sources = _sources(cluster, host, role)
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        message = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        setters = [prefix for prefix, values in sources if loc and loc[0] in values]
        if setters:
            yield f"{setters[-1]}.{'.'.join(loc)}", message
        elif sources:
            origins = " + ".join(prefix for prefix, _ in sources)
            yield sources[-1][0], f"{message} (host {host}: {origins} together)"
        else:
            yield f"hosts.{host}", f"{role}: {message}"


def topology_of(loaded: LoadedCluster) -> Topology:
    """The cluster's topology with each group's firewall rules: every role's ports."""
    rules: dict[str, list[FirewallRule]] = {}
    for role in ROLES:
        if role.ports is None:
            continue
        for group, group_rules in role.ports(loaded).items():
            # A rule with no sources (no monitoring host yet, say) would be an empty set.
            rules.setdefault(group, []).extend(rule for rule in group_rules if rule.sources)
    firewall = {group: tuple(group_rules) for group, group_rules in rules.items()}
    return replace(build_topology(loaded.cluster), firewall=firewall)


def _settings(loaded: LoadedCluster, name: str) -> dict[str, BaseModel]:
    computed = loaded.settings.get(name)
    if computed is not None:
        return computed
    # Loaded by the inventory layer alone (a test, the lab): merge now, same rules.
    return {
        role: model.model_validate(merged_settings(loaded.cluster, name, role))
        for role, model in ROLE_CONFIGS.items()
    }


def host_context(
    loaded: LoadedCluster,
    name: str,
    topology: Topology | None = None,
    rendered: Callable[[], Mapping[str, str]] | None = None,
) -> HostContext:
    topology = topology or topology_of(loaded)
    rendered = rendered or _rendered_once(loaded)

    def rendered_paths() -> frozenset[str]:
        # Paths only, rendered with placeholders for missing state: `plan` and `drift` never
        # create state and may ask before any `apply` made it (a control-plane node renders
        # the etcd role's client certificate, signed by a CA that does not exist yet).
        quiet = loaded.with_state_access(StateAccess.placeholder)
        paths_ctx = HostContext(quiet, topology, name, ctx.settings, rendered)
        return frozenset(f.path for f in host_files(paths_ctx))

    ctx = HostContext(
        loaded, topology, name, _settings(loaded, name), rendered, functools.cache(rendered_paths)
    )
    return ctx


def host_contexts(loaded: LoadedCluster) -> list[HostContext]:
    topology = topology_of(loaded)
    rendered = _rendered_once(loaded)
    return [host_context(loaded, name, topology, rendered) for name in loaded.cluster.hosts]


def _rendered_once(loaded: LoadedCluster) -> Callable[[], Mapping[str, str]]:
    """The cluster files, rendered on the first call only (schema checks take a while) and
    only when a host's role asks for them."""
    return functools.cache(lambda: cluster_files(loaded))


def host_files(ctx: HostContext, roles: Iterable[str] = ()) -> list[ManagedFile]:
    """Every file the host's phases manage (of the named roles; all when none are named)."""
    wanted = set(roles)
    return [
        managed
        for role in ROLES
        if not wanted or role.name in wanted
        for phase in role.phases
        if phase.files is not None and phase.applies_to(ctx.host.groups, ctx.cluster)
        for managed in phase.files(ctx)
    ]


def cluster_files(loaded: LoadedCluster) -> dict[str, str]:
    """Cluster-wide files (Kubernetes manifests): relative path under _cluster/ -> content."""
    rendered: dict[str, str] = {}
    for role in ROLES:
        if role.cluster_files is not None:
            rendered.update(role.cluster_files(loaded))
    return rendered
