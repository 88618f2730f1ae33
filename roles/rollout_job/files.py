"""The rollout Job's files on the worker groups (with `enabled`): root's second keys file,
holding only the rollout authority (`cert-authority` for one principal, `restrict,from=`), and
the sshd Match that reads it."""

from __future__ import annotations

from roles.rollout_job.role import fleet_config
from toolkit.jobs import JobKey
from toolkit.spec import HostContext, ManagedFile

KEYS_FILE = "/etc/ssh/gpuinfra-rollout.keys"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/60-gpuinfra-rollout.conf"
# Under .state/ (0600 from creation, like every state secret): the authority that signs each
# run's own key; it never leaves the operator's machine. The workers admit what it signs for
# PRINCIPAL, until the certificate's end (the run's deadline), never the authority itself.
STATE_KEY = "rollout/ca_ed25519"
PRINCIPAL = "gpuinfra-rollout"
KEY = JobKey(
    "rollout_job", STATE_KEY, "gpuinfra-rollout-ca", KEYS_FILE, SSHD_DROPIN, principal=PRINCIPAL
)
# sshd's default list, kept first: the operator's own keys stay where they were.
DEFAULT_KEYS_FILES = ".ssh/authorized_keys .ssh/authorized_keys2"


def sshd_dropin() -> str:
    """A trailing Match for root: sshd's default keys files, then the rollout's."""
    return (
        "# Managed by gpuinfra (role rollout_job): root also takes a rollout run's certified\n"
        "# key, from the Job's nodes only (restrict,from= in the keys file).\n"
        "Match User root\n"
        f"    AuthorizedKeysFile {DEFAULT_KEYS_FILES} {KEYS_FILE}\n"
    )


def managed_files(ctx: HostContext) -> list[ManagedFile]:
    cfg = fleet_config(ctx.loaded)
    if not cfg.enabled:
        return []
    return KEY.login_files(ctx.loaded, cfg, sshd_dropin())
