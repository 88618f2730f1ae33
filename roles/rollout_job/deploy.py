"""The rollout_job role's deploy: the keys file, then the sshd Match (checked before it is
live) and a reload. Nothing while the Job is not enabled."""

from __future__ import annotations

from pyinfra.api import deploy

from roles.rollout_job.files import KEY, managed_files
from roles.rollout_job.role import fleet_config
from toolkit.spec import HostContext


@deploy("Rollout job")
def apply(ctx: HostContext) -> None:
    if not fleet_config(ctx.loaded).enabled:
        return
    KEY.put_files(managed_files(ctx))
