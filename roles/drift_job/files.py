"""The drift job's files: on every host (with `enabled`) the forced-command user's key, sshd
drop-in, sudoers rule and wrapper; and the older manifest rendered into OUT/_cluster/."""

from __future__ import annotations

import math
from pathlib import Path

from inventory.model import LoadedCluster
from roles.drift_job.config import DriftJobConfig
from roles.drift_job.role import fleet_config
from toolkit import driftprobe, nodes, sshkeys
from toolkit.spec import HostContext, ManagedFile
from toolkit.statefiles import kept_secret
from toolkit.templates import render_template

KEYS_FILE = "/etc/ssh/gpuinfra-drift.keys"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/60-gpuinfra-drift.conf"
SUDOERS = "/etc/sudoers.d/gpuinfra-drift"
# Under .state/: the key the Job's pods log in with (0600, kept like every state secret).
STATE_KEY = "drift/id_ed25519"
FORCED_COMMAND = f"sudo -n {driftprobe.WRAPPER}"

MANIFEST = "drift-job/drift-job.yaml"  # not under kubernetes/: applied by hand, with its inputs


def job_config(loaded: LoadedCluster) -> DriftJobConfig:
    """Fleet-wide settings: group vars of `all` only (the job is one object for all hosts)."""
    return fleet_config(loaded)


def shard_count(cfg: DriftJobConfig, hosts: int) -> int:
    return cfg.shards or max(1, math.ceil(hosts / cfg.hosts_per_shard))


def cluster_files(loaded: LoadedCluster) -> dict[str, str]:
    cfg = job_config(loaded)
    hosts = len(loaded.cluster.hosts)
    manifest = render_template(
        "drift_job/drift-job.yaml.j2",
        cfg=cfg,
        cluster_name=loaded.cluster.name,
        hosts=hosts,
        shards=shard_count(cfg, hosts),
    )
    return {MANIFEST: manifest}


# -- the forced-command user's files on every host (enabled) ----------------------------------


def private_key(state_dir: Path, access: str) -> str:
    """The drift key (OpenSSH format): made by the first enabled apply, kept 0600 in .state/."""

    return kept_secret(state_dir, STATE_KEY, sshkeys.new_ed25519, access)


def key_sources(loaded: LoadedCluster, cfg: DriftJobConfig) -> tuple[str, ...]:
    return sshkeys.key_sources(loaded, cfg.nodes, cfg.sources)


def keys_line(loaded: LoadedCluster, cfg: DriftJobConfig) -> str:
    sources = ",".join(key_sources(loaded, cfg))
    key = sshkeys.public_key(private_key(loaded.state_dir, loaded.state_access))
    return f'restrict,from="{sources}" {key} gpuinfra-drift@{loaded.cluster.name}\n'


def sshd_dropin(cfg: DriftJobConfig) -> str:
    """A trailing Match block: it applies to the drift user only and leaves every global
    setting of the main file and the other drop-ins alone."""
    return (
        "# Managed by gpuinfra (role drift_job): the drift Job's user runs one thing.\n"
        f"Match User {cfg.user}\n"
        f"    AuthorizedKeysFile {KEYS_FILE}\n"
        f"    ForceCommand {FORCED_COMMAND}\n"
        "    DisableForwarding yes\n"
        "    PermitTTY no\n"
        "    PermitUserRC no\n"
    )


def sudoers(cfg: DriftJobConfig) -> str:
    # `""`: the command with no arguments only (sudoers(5)).
    return (
        "# Managed by gpuinfra (role drift_job).\n"
        f'{cfg.user} ALL=(root) NOPASSWD: {driftprobe.WRAPPER} ""\n'
    )


SSHD_CHECK = sshkeys.SSHD_DROPIN_CHECK


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = fleet_config(ctx.loaded)
    if not cfg.enabled:
        return []
    return [
        ManagedFile("drift_job", KEYS_FILE, keys_line(ctx.loaded, cfg)),
        ManagedFile("drift_job", SSHD_DROPIN, sshd_dropin(cfg), check=SSHD_CHECK),
        ManagedFile("drift_job", SUDOERS, sudoers(cfg), mode="0440", check="visudo -cf {path}"),
        ManagedFile("drift_job", driftprobe.WRAPPER, driftprobe.wrapper_text(), mode="0755"),
    ]


def removed_paths() -> tuple[str, ...]:
    """What `remove` deletes: every file above (the probe folder separately)."""
    return (SSHD_DROPIN, SUDOERS, KEYS_FILE, driftprobe.WRAPPER)


CONTROL_PLANE_TAINT = "node-role.kubernetes.io/control-plane"


def job_tolerations(loaded: LoadedCluster, cfg: DriftJobConfig) -> list[dict[str, str]]:
    """Exactly the taints the fleet-ops nodes register with, as the kubernetes role registers
    them (roles/kubernetes/kubeadm.py `registration_taints`, by the groups and toolkit/nodes.py):
    GPU workers the preflight taint, a team's nodes the team's, control-plane nodes with
    neither kubeadm's own. Nothing broader (no operator Exists without a key)."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    for node in cfg.nodes:
        groups = loaded.cluster.hosts[node].groups
        taints = []
        if "gpu_worker" in groups:
            taints.append(
                (
                    nodes.PREFLIGHT_TAINT_KEY,
                    nodes.PREFLIGHT_TAINT_VALUE,
                    nodes.PREFLIGHT_TAINT_EFFECT,
                )
            )
        team = nodes.team_of(loaded.cluster, node)
        if team is not None:
            taints.append((nodes.TEAM_TAINT_KEY, team, nodes.TEAM_TAINT_EFFECT))
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
