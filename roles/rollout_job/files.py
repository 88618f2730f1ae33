"""The rollout Job's files on the worker groups (with `enabled`): root's second keys file,
holding only the rollout key with `restrict,from=`, and the sshd Match that reads it."""

from __future__ import annotations

from roles.rollout_job.role import fleet_config
from toolkit.jobs import JobKey
from toolkit.spec import HostContext, ManagedFile

KEYS_FILE = "/etc/ssh/gpuinfra-rollout.keys"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/60-gpuinfra-rollout.conf"
# Under .state/: the key the Job's pods apply with (0600 from creation, like every state secret).
STATE_KEY = "rollout/id_ed25519"
KEY = JobKey("rollout_job", STATE_KEY, "gpuinfra-rollout", KEYS_FILE, SSHD_DROPIN)
# sshd's default list, kept first: the operator's own keys stay where they were.
DEFAULT_KEYS_FILES = ".ssh/authorized_keys .ssh/authorized_keys2"


def sshd_dropin() -> str:
    """A trailing Match for root: sshd's default keys files, then the rollout's."""
    return (
        "# Managed by gpuinfra (role rollout_job): root also takes the rollout Job's key,\n"
        "# from the Job's nodes only (restrict,from= in the keys file).\n"
        "Match User root\n"
        f"    AuthorizedKeysFile {DEFAULT_KEYS_FILES} {KEYS_FILE}\n"
    )


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = fleet_config(ctx.loaded)
    if not cfg.enabled:
        return []
    return KEY.login_files(ctx.loaded, cfg, sshd_dropin())
