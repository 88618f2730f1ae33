"""The shell `etcd replace` runs on the member, of the main cluster or the Events one: the
fence that keeps the member from starting under its old identity, the stop, setting the old
data aside or putting it back, and the join."""

from __future__ import annotations

import shlex

from day2.etcd.common import stopped
from roles.etcd.clusters import MAIN, EtcdCluster

# While this drop-in exists, the member cannot start: `systemctl start` fails on the
# assertion (no restart loop, the journal names the file). `replace` puts it there before it
# stops the member and removes it only in the command that starts the new member, after
# `member add`: in between, the member's data is set aside or gone, and an empty member started
# under its old identity (by a reboot, an apply's restart, an operator) would vote without the
# log it voted with, which can lose committed writes (etcd's runtime reconfiguration guide).
# Each cluster's unit (etcd, etcd-events) has a fence of its own.
FENCE_NAME = "gpuinfra-replace-fence.conf"
SYSTEMD_DIR = "/etc/systemd/system"


def fence_dir(etcd: EtcdCluster = MAIN) -> str:
    return f"{SYSTEMD_DIR}/{etcd.name}.service.d"


def fence(etcd: EtcdCluster = MAIN) -> str:
    return f"{fence_dir(etcd)}/{FENCE_NAME}"


def fence_text(etcd: EtcdCluster = MAIN) -> str:
    return f"""# Written by `gpuinfra etcd replace`: this member's data is set aside or deleted
# and the new member is not added yet. It must not start under its old identity: run the
# replace again to finish it. Removed by the replace when it starts the new member.
[Unit]
AssertPathExists=!{fence(etcd)}
"""


def fence_command(etcd: EtcdCluster = MAIN) -> str:
    return (
        f"mkdir -p {fence_dir(etcd)} && printf %s {shlex.quote(fence_text(etcd))} > "
        f"{fence(etcd)} && systemctl daemon-reload"
    )


def unfence_command(etcd: EtcdCluster = MAIN) -> str:
    return f"rm -f {fence(etcd)} && systemctl daemon-reload"


def stop_member_command(etcd: EtcdCluster = MAIN) -> str:
    """Fence the member (it cannot be started again), stop it and prove it stopped: the data
    is touched only after this succeeded. Any failure takes the fence away again: then nothing
    changed but, at most, the member stopped."""
    return (
        f"{{ {fence_command(etcd)} && systemctl stop {etcd.name} && {{ {stopped(etcd)}; }}; }} || "
        f"{{ rc=$?; {unfence_command(etcd)}; exit $rc; }}"
    )


def set_aside_command(
    data_dir: str, kept: str, *, discard: bool = False, etcd: EtcdCluster = MAIN
) -> str:
    """The member's old data renamed (not deleted), an empty data directory in its place; with
    `discard` (a disk too small to hold both) deleted instead. Either only with it stopped."""
    member, kept_q = shlex.quote(f"{data_dir}/member"), shlex.quote(kept)
    data = shlex.quote(data_dir)
    move = f"rm -rf {member}" if discard else f"mv {member} {kept_q}"
    return (
        f"set -e; {stopped(etcd)}; if test -d {member}; then {move}; fi; "
        f"install -d -o etcd -g etcd -m 0700 {data}"
    )


def put_back_command(data_dir: str, kept: str, etcd: EtcdCluster = MAIN) -> str:
    """Undo set_aside_command while the member is still in the cluster (the gate failed), and
    lift the fence: the member may start again with its own data. Fails, fence kept, where
    there is no old data to put back (discarded)."""
    member, kept_q = shlex.quote(f"{data_dir}/member"), shlex.quote(kept)
    return (
        f"set -e; if test -d {kept_q} && ! test -e {member}; then mv {kept_q} {member}; fi; "
        f"test -d {member}; {unfence_command(etcd)}"
    )


def join_command(etcd: EtcdCluster = MAIN) -> str:
    """Lift the fence and start the new member (added already) as joining an existing cluster."""
    state = etcd.initial_state_env
    return (
        f"{unfence_command(etcd)} && "
        f"echo GPUINFRA_INITIAL_CLUSTER_STATE=existing > {state} && "
        f"systemctl start {etcd.name}; rc=$?; rm -f {state}; exit $rc"
    )
