"""The drift job's files: on every host (with `enabled`) the forced-command user's key, sshd
drop-in, sudoers rule and wrapper; and the older manifest rendered into OUT/_cluster/."""

from __future__ import annotations

import math

from inventory.model import LoadedCluster
from roles.drift_job.config import DriftJobConfig
from roles.drift_job.role import fleet_config
from toolkit import driftprobe, sshkeys
from toolkit.jobs import JobKey
from toolkit.spec import HostContext, ManagedFile
from toolkit.templates import render_template

KEYS_FILE = "/etc/ssh/gpuinfra-drift.keys"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/60-gpuinfra-drift.conf"
SUDOERS = "/etc/sudoers.d/gpuinfra-drift"
# Under .state/: the key the Job's pods log in with (0600, kept like every state secret).
STATE_KEY = "drift/id_ed25519"
KEY = JobKey("drift_job", STATE_KEY, "gpuinfra-drift", KEYS_FILE, SSHD_DROPIN)
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
        *KEY.login_files(ctx.loaded, cfg, sshd_dropin(cfg)),
        ManagedFile("drift_job", SUDOERS, sudoers(cfg), mode="0440", check="visudo -cf {path}"),
        ManagedFile("drift_job", driftprobe.WRAPPER, driftprobe.wrapper_text(), mode="0755"),
    ]


def removed_paths() -> tuple[str, ...]:
    """What `remove` deletes: every file above (the probe folder separately)."""
    return (SSHD_DROPIN, SUDOERS, KEYS_FILE, driftprobe.WRAPPER)
