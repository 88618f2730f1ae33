"""What the two in-cluster Jobs' roles (drift_job, rollout_job) share: settings made once for the
fleet in group_vars.all, their nodes checked as Kubernetes nodes, the key the Job's pods log in
with, and the tolerations that place the pods on exactly those nodes."""

from __future__ import annotations

import ipaddress
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from inventory.model import Cluster, LoadedCluster
from inventory.sizing import KUBERNETES_NODE_GROUPS
from toolkit import nodes as node_taints
from toolkit import sshkeys
from toolkit.spec import ManagedFile
from toolkit.statefiles import kept_secret

# The Kubernetes nodes (the kubernetes role's groups): a Job's pods run on these only.
NODE_GROUPS = KUBERNETES_NODE_GROUPS
CONTROL_PLANE_TAINT = "node-role.kubernetes.io/control-plane"

Settings = TypeVar("Settings", bound=BaseModel)


class JobPlacement(Protocol):
    """The settings every Job has: the nodes its pods run on and the other sources of its key."""

    @property
    def nodes(self) -> tuple[str, ...]: ...

    @property
    def sources(self) -> tuple[ipaddress.IPv4Network, ...]: ...


def fleet_settings(cluster: Cluster, role: str, model: type[Settings]) -> Settings:
    """A Job's settings, the same on every host: group_vars.all only (`fleet_wide` refuses them
    anywhere else)."""
    return model.model_validate(cluster.group_vars.get("all", {}).get(role, {}))


def fleet_wide(cluster: Cluster, role: str) -> Iterator[tuple[str, str]]:
    """A Job is one object for the fleet: its settings set anywhere but group_vars.all."""
    for group, values in cluster.group_vars.items():
        if group != "all" and role in values:
            yield (f"group_vars.{group}.{role}", f"set {role} in group_vars.all only")
    for name, host in cluster.hosts.items():
        if role in host.vars:
            yield (f"hosts.{name}.vars.{role}", f"set {role} in group_vars.all only")


def enabled_settings(
    cluster: Cluster, role: str, model: type[Settings]
) -> Generator[tuple[str, str], None, Settings | None]:
    """The checks every Job's record starts with: yields the settings set anywhere but
    group_vars.all (`fleet_wide`); returns the settings when they are valid and enabled, else
    None (an invalid one is named by the settings' own validation)."""
    yield from fleet_wide(cluster, role)
    try:
        cfg = fleet_settings(cluster, role, model)
    except ValueError:
        return None
    return cfg if getattr(cfg, "enabled", False) else None


def not_a_node(cluster: Cluster, role: str, node: str) -> tuple[str, str] | None:
    """The problem of a Job node that is not a Kubernetes node of the inventory, or a GPU
    worker (the preflight admission policy lets only the GPU checks tolerate its taint), or
    None."""
    host = cluster.hosts.get(node)
    key = f"group_vars.all.{role}.nodes"
    if host is None or not any(group in NODE_GROUPS for group in host.groups):
        return (
            key,
            f"{node} is not a Kubernetes node of this inventory ({', '.join(NODE_GROUPS)})",
        )
    if "gpu_worker" in host.groups:
        return key, f"{node} is a GPU worker: only the GPU checks may tolerate its preflight taint"
    return None


@dataclass(frozen=True)
class JobKey:
    """The ssh key a Job's pods log in with: made by the first enabled apply, kept 0600 under
    .state/ (`state_key`), admitted on the hosts only from the Job's nodes, their pods and its
    `sources`, named `comment@cluster` in its keys file, which an sshd Match drop-in reads.

    With a `principal`, the kept key is an authority that never leaves the operator's machine:
    the hosts admit the certificates it signs for that principal (`run_identity`), each a new
    key that expires with its run, in place of the kept key itself."""

    role: str
    state_key: str
    comment: str
    keys_file: str
    sshd_dropin: str
    principal: str | None = None

    def private_key(self, state_dir: Path, access: str) -> str:
        """The key in OpenSSH's format."""
        return kept_secret(state_dir, self.state_key, sshkeys.new_ed25519, access)

    def key_sources(self, loaded: LoadedCluster, cfg: JobPlacement) -> tuple[str, ...]:
        return sshkeys.key_sources(loaded, cfg.nodes, cfg.sources)

    def keys_line(self, loaded: LoadedCluster, cfg: JobPlacement) -> str:
        sources = ",".join(self.key_sources(loaded, cfg))
        key = sshkeys.public_key(self.private_key(loaded.state_dir, loaded.state_access))
        options = f'restrict,from="{sources}"'
        if self.principal is not None:
            options = f'cert-authority,principals="{self.principal}",{options}'
        return f"{options} {key} {self.comment}@{loaded.cluster.name}\n"

    def run_identity(
        self, loaded: LoadedCluster, cfg: JobPlacement, run: str, valid: tuple[int, int]
    ) -> tuple[str, str]:
        """A new key for one run and its certificate (private key, certificate line), signed
        by the kept authority for the principal, valid between the epoch seconds of `valid`
        and from the keys file's sources only. Never written here: the run's Secret holds it."""
        assert self.principal is not None, f"{self.role}'s key is not an authority"
        authority = self.private_key(loaded.state_dir, "existing")
        private = sshkeys.new_ed25519()
        key_id = f"{self.principal}@{loaded.cluster.name}/{run}"  # in sshd's log of each login
        sources = self.key_sources(loaded, cfg)
        cert = sshkeys.certificate(authority, private, self.principal, key_id, valid, sources)
        return private, cert

    def login_files(
        self, loaded: LoadedCluster, cfg: JobPlacement, dropin: str
    ) -> list[ManagedFile]:
        """The keys file, and the drop-in (`dropin`, its text) checked with the live sshd
        configuration before it is."""
        return [
            ManagedFile(self.role, self.keys_file, self.keys_line(loaded, cfg)),
            ManagedFile(self.role, self.sshd_dropin, dropin, check=sshkeys.SSHD_DROPIN_CHECK),
        ]

    def put_files(self, managed: list[ManagedFile]) -> dict[str, Any]:
        """Every file of the role written, then sshd reloaded if the drop-in changed; each
        file's operation by its path."""
        from toolkit.operations import put_file, reload_sshd  # pyinfra: not for `validate`

        written = {f.path: put_file(f) for f in managed}
        reload_sshd(name="Reload sshd", _if=written[self.sshd_dropin].did_change)
        return written


def job_tolerations(loaded: LoadedCluster, cfg: JobPlacement) -> list[dict[str, str]]:
    """Exactly the taints a Job's nodes register with, as the kubernetes role registers them
    (roles/kubernetes/kubeadm.py `registration_taints`, by the groups and toolkit/nodes.py):
    GPU workers the preflight taint, a team's nodes the team's, control-plane nodes with
    neither kubeadm's own. Nothing broader (no operator Exists without a key)."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    for node in cfg.nodes:
        groups = loaded.cluster.hosts[node].groups
        taints = []
        if "gpu_worker" in groups:
            taints.append(
                (
                    node_taints.PREFLIGHT_TAINT_KEY,
                    node_taints.PREFLIGHT_TAINT_VALUE,
                    node_taints.PREFLIGHT_TAINT_EFFECT,
                )
            )
        team = node_taints.team_of(loaded.cluster, node)
        if team is not None:
            taints.append((node_taints.TEAM_TAINT_KEY, team, node_taints.TEAM_TAINT_EFFECT))
        if not taints and "control_plane" in groups:
            found[(CONTROL_PLANE_TAINT, "")] = {
                "key": CONTROL_PLANE_TAINT,
                "operator": "Exists",
                "effect": "NoSchedule",
            }
        for key, value, effect in taints:
            found[(key, value)] = {
                "key": key,
                "operator": "Equal",
                "value": value,
                "effect": effect,
            }
    return list(found.values())
