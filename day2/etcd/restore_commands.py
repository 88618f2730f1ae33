"""The shell `etcd restore` runs on each member, and where it works there: stage the snapshot
beside the data, swap it in, roll the swap back, clean up."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from day2.etcd.common import SNAPSHOT_DIR_ON_HOST, STOPPED
from roles.etcd.files import INITIAL_STATE_ENV

# After a restore the revision jumps ahead so watchers (the API servers' caches) never see an
# older revision again; etcd's restore guide for Kubernetes.
BUMP_REVISION = 1_000_000_000


@dataclass(frozen=True)
class RestorePaths:
    """Where one member's restore works, all inside its data directory: on the same filesystem
    as `member/` (the data directory is usually the etcd.disk mount point), so each swap is an
    atomic rename and a mount point is never renamed. etcd ignores other names there."""

    data_dir: str
    stamp: str

    @property
    def snapshot(self) -> str:
        """This restore's own copy of the snapshot on the member (outside the data disk)."""
        return f"{SNAPSHOT_DIR_ON_HOST}/gpuinfra-etcd-restore-{self.stamp}.db"

    @property
    def member(self) -> str:
        return f"{self.data_dir}/member"

    @property
    def staging(self) -> str:
        """A complete new data directory: `etcdutl snapshot restore --data-dir` writes it."""
        return f"{self.data_dir}/restore-{self.stamp}"

    @property
    def kept(self) -> str:
        """The member's old data, renamed here by the swap and deleted only once the restored
        cluster is healthy."""
        return f"{self.data_dir}/member.before-restore-{self.stamp}"


def stage_restore_command(
    paths: RestorePaths, *, name: str, initial_cluster: str, token: str, peer_url: str
) -> str:
    """Unpack the snapshot into the staging directory; the running member is not touched."""
    staging = shlex.quote(paths.staging)
    return (
        f"set -e; rm -rf {staging}; "
        f"etcdutl snapshot restore {shlex.quote(paths.snapshot)} --name {shlex.quote(name)} "
        f"--initial-cluster {shlex.quote(initial_cluster)} "
        f"--initial-cluster-token {shlex.quote(token)} "
        f"--initial-advertise-peer-urls {shlex.quote(peer_url)} "
        f"--bump-revision {BUMP_REVISION} --mark-compacted --data-dir {staging} >/dev/null; "
        f"test -d {staging}/member; chown -R etcd:etcd {staging}"
    )


def swap_restore_command(paths: RestorePaths) -> str:
    """With etcd stopped: the old data aside (renamed, kept), the staged data in its place. The
    emptied staging directory stays as the sign that this member was swapped."""
    member, staging, kept = (shlex.quote(p) for p in (paths.member, paths.staging, paths.kept))
    return (
        f"set -e; test -d {staging}/member; {STOPPED}; "
        f"if test -d {member}; then mv {member} {kept}; fi; "
        f"mv {staging}/member {member}; rm -f {INITIAL_STATE_ENV}"
    )


def rollback_restore_command(paths: RestorePaths) -> str:
    """With etcd stopped: where the swap happened (the staging directory is there and empty)
    and old data was kept, drop the restored copy and put the old data back; a member that had
    no data before keeps the restored copy (there is nothing to go back to); a member never
    swapped is left alone. Then the staging directory goes. Safe on every member, and again."""
    member, staging, kept = (shlex.quote(p) for p in (paths.member, paths.staging, paths.kept))
    return (
        f"set -e; if test -d {staging} && ! test -e {staging}/member && test -d {kept}; then "
        f"{STOPPED}; rm -rf {member}; mv {kept} {member}; fi; "
        f"if test -d {kept} && ! test -e {member}; then mv {kept} {member}; fi; "
        f"rm -rf {staging}"
    )


def finish_restore_command(paths: RestorePaths) -> str:
    """Once the restored cluster is healthy: the old data and the leftovers go."""
    kept, staging, snapshot = (shlex.quote(p) for p in (paths.kept, paths.staging, paths.snapshot))
    return f"rm -rf {kept} {staging} {snapshot}"
