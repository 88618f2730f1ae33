"""The rollout Job's files on the worker groups (with `enabled`): root's second keys file,
holding only the rollout key with `restrict,from=`, and the sshd Match that reads it."""

from __future__ import annotations

from pathlib import Path

from inventory.model import LoadedCluster
from roles.rollout_job.config import RolloutJobConfig
from roles.rollout_job.role import fleet_config
from toolkit import sshkeys
from toolkit.spec import HostContext, ManagedFile
from toolkit.statefiles import kept_secret

KEYS_FILE = "/etc/ssh/gpuinfra-rollout.keys"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/60-gpuinfra-rollout.conf"
# Under .state/: the key the Job's pods apply with (0600 from creation, like every state secret).
STATE_KEY = "rollout/id_ed25519"
# sshd's default list, kept first: the operator's own keys stay where they were.
DEFAULT_KEYS_FILES = ".ssh/authorized_keys .ssh/authorized_keys2"


def private_key(state_dir: Path, access: str) -> str:
    """The rollout key (OpenSSH format): made by the first enabled apply, kept 0600."""
    return kept_secret(state_dir, STATE_KEY, sshkeys.new_ed25519, access)


def key_sources(loaded: LoadedCluster, cfg: RolloutJobConfig) -> tuple[str, ...]:
    return sshkeys.key_sources(loaded, cfg.nodes, cfg.sources)


def keys_line(loaded: LoadedCluster, cfg: RolloutJobConfig) -> str:
    sources = ",".join(key_sources(loaded, cfg))
    key = sshkeys.public_key(private_key(loaded.state_dir, loaded.state_access))
    return f'restrict,from="{sources}" {key} gpuinfra-rollout@{loaded.cluster.name}\n'


def sshd_dropin() -> str:
    """A trailing Match for root: sshd's default keys files, then the rollout's."""
    return (
        "# Managed by gpuinfra (role rollout_job): root also takes the rollout Job's key,\n"
        "# from the Job's nodes only (restrict,from= in the keys file).\n"
        "Match User root\n"
        f"    AuthorizedKeysFile {DEFAULT_KEYS_FILES} {KEYS_FILE}\n"
    )


SSHD_CHECK = sshkeys.SSHD_DROPIN_CHECK


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = fleet_config(ctx.loaded)
    if not cfg.enabled:
        return []
    return [
        ManagedFile("rollout_job", KEYS_FILE, keys_line(ctx.loaded, cfg)),
        ManagedFile("rollout_job", SSHD_DROPIN, sshd_dropin(), check=SSHD_CHECK),
    ]
