"""The data_disks role's deploy: the tools, every volume made and mounted, then its health."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt

from roles.data_disks import operations as disk_ops
from roles.data_disks.config import DataDisksConfig
from toolkit.effective import nothing_overrides
from toolkit.spec import HostContext


def packages(cfg: DataDisksConfig) -> list[str]:
    """The filesystems' tools, and mdadm where an array is wanted (a host with no volume
    installs nothing)."""
    wanted = {"xfsprogs" if v.filesystem == "xfs" else "e2fsprogs" for v in cfg.volumes}
    if any(volume.array for volume in cfg.volumes):
        wanted.add("mdadm")
    return sorted(wanted)


@deploy("Data disks")
def apply(ctx: HostContext) -> None:
    cfg = ctx.config(DataDisksConfig)
    apt.packages(
        name="Install the filesystem and md tools", packages=packages(cfg), no_recommends=True
    )
    disk_ops.volumes_ready(name="Prepare and mount the data volumes", volumes=cfg.volumes)
    # A degraded array or a disk gone cannot be repaired by a command here: a finding, which
    # drift reports (exit 3) and apply stops on, naming the array and the member.
    nothing_overrides(
        "Check that every data array and disk is whole", disk_ops.findings(cfg.volumes)
    )
