"""The shell `etcd replace` runs on the member: the fence that keeps etcd from starting under
its old identity, the stop, setting the old data aside or putting it back, and the join."""

from __future__ import annotations

import shlex

from day2.etcd.common import STOPPED
from roles.etcd.files import INITIAL_STATE_ENV

# While this drop-in exists, etcd on the member cannot start: `systemctl start` fails on the
# assertion (no restart loop, the journal names the file). `replace` puts it there before it
# stops etcd and removes it only in the command that starts the new member, after `member add`:
# in between, the member's data is set aside or gone, and an empty member started under its
# old identity (by a reboot, an apply's restart, an operator) would vote without the log it
# voted with, which can lose committed writes (etcd's runtime reconfiguration guide).
FENCE_DIR = "/etc/systemd/system/etcd.service.d"
FENCE = f"{FENCE_DIR}/gpuinfra-replace-fence.conf"
FENCE_TEXT = f"""# Written by `gpuinfra etcd replace`: this member's data is set aside or deleted
# and the new member is not added yet. It must not start under its old identity: run the
# replace again to finish it. Removed by the replace when it starts the new member.
[Unit]
AssertPathExists=!{FENCE}
"""


def fence_command() -> str:
    return (
        f"mkdir -p {FENCE_DIR} && printf %s {shlex.quote(FENCE_TEXT)} > {FENCE} && "
        "systemctl daemon-reload"
    )


def unfence_command() -> str:
    return f"rm -f {FENCE} && systemctl daemon-reload"


def stop_member_command() -> str:
    """Fence etcd (it cannot be started again), stop it and prove it stopped: the data is
    touched only after this succeeded. Any failure takes the fence away again: then nothing
    changed but, at most, etcd stopped."""
    return (
        f"{{ {fence_command()} && systemctl stop etcd && {{ {STOPPED}; }}; }} || "
        f"{{ rc=$?; {unfence_command()}; exit $rc; }}"
    )


def set_aside_command(data_dir: str, kept: str, *, discard: bool = False) -> str:
    """The member's old data renamed (not deleted), an empty data directory in its place; with
    `discard` (a disk too small to hold both) deleted instead. Either only with etcd stopped."""
    member, kept_q = shlex.quote(f"{data_dir}/member"), shlex.quote(kept)
    data = shlex.quote(data_dir)
    move = f"rm -rf {member}" if discard else f"mv {member} {kept_q}"
    return (
        f"set -e; {STOPPED}; if test -d {member}; then {move}; fi; "
        f"install -d -o etcd -g etcd -m 0700 {data}"
    )


def put_back_command(data_dir: str, kept: str) -> str:
    """Undo set_aside_command while the member is still in the cluster (the gate failed), and
    lift the fence: the member may start again with its own data. Fails, fence kept, where
    there is no old data to put back (discarded)."""
    member, kept_q = shlex.quote(f"{data_dir}/member"), shlex.quote(kept)
    return (
        f"set -e; if test -d {kept_q} && ! test -e {member}; then mv {kept_q} {member}; fi; "
        f"test -d {member}; {unfence_command()}"
    )


def join_command() -> str:
    """Lift the fence and start the new member (added already) as joining an existing cluster."""
    return (
        f"{unfence_command()} && "
        f"echo GPUINFRA_INITIAL_CLUSTER_STATE=existing > {INITIAL_STATE_ENV} && "
        f"systemctl start etcd; rc=$?; rm -f {INITIAL_STATE_ENV}; exit $rc"
    )
