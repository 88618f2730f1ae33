"""Day-2 operations on a running etcd cluster: status, certificates, disk checks, snapshots,
restore, member replacement and certificate rotation.

They talk to members over SSH (host keys checked, as everywhere) and run etcdctl/etcdutl on
the members themselves with the operator certificate installed there: the firewall keeps the
client port closed to the controller, and no etcd key needs to be handed to the controller's
tools. Only one member is ever restarted at a time, except where the whole cluster is rebuilt
(restore), which starts every member together as a bootstrap does.

One module per concern: `common` (members, settings, errors, the remote seam), `health`
(status, check-disk), `snapshots`, `restore_flow` and `replace_flow` (the steps of
`day2.flows`) with the shell they run on the members (`restore_commands`, `replace_commands`),
`certs` (rotate-certs, rotate-ca). The names callers use are re-exported here.
"""

from __future__ import annotations

from day2.etcd.certs import CaRotationResult, CaRotationStep, RotateResult, rotate_ca, rotate_certs
from day2.etcd.common import EtcdOperationError, EtcdRefused
from day2.etcd.health import ClusterStatus, MemberStatus, check_disk, status
from day2.etcd.replace_flow import ReplaceResult, replace
from day2.etcd.restore_flow import RestoreResult, restore
from day2.etcd.snapshots import SnapshotResult, snapshot

__all__ = [
    "CaRotationResult",
    "CaRotationStep",
    "ClusterStatus",
    "EtcdOperationError",
    "EtcdRefused",
    "MemberStatus",
    "ReplaceResult",
    "RestoreResult",
    "RotateResult",
    "SnapshotResult",
    "check_disk",
    "replace",
    "restore",
    "rotate_ca",
    "rotate_certs",
    "snapshot",
    "status",
]
