"""The day-2 flows, step by step: what each step does in one line and the function that does
it (day2/etcd/replace_flow.py, day2/etcd/restore_flow.py, day2/etcd/certs.py,
day2/kubernetes.py, day2/encryption.py), named so that `--help` lists the steps without
importing the flows. The commands' help, `--skip` and `--only` are built from these lists, and
the flows run them.
"""

from __future__ import annotations

from day2.steps import Flow, Step

_REPLACE = "day2.etcd.replace_flow"
_RESTORE = "day2.etcd.restore_flow"
_CERTS = "day2.etcd.certs"
_KUBERNETES = "day2.kubernetes"
_ENCRYPTION = "day2.encryption"

ETCD_REPLACE = Flow(
    "etcd replace",
    (
        Step(
            "preflight",
            "a member, a healthy quorum without it, its disk mounted",
            f"{_REPLACE}:replace_preflight",
            alone=True,
        ),
        Step(
            "stop",
            "fence etcd there (it cannot start) and stop it",
            f"{_REPLACE}:replace_stop",
            left=f"{_REPLACE}:replace_left_unchanged",
        ),
        Step(
            "set-aside",
            "rename the old data (--discard-old-data: delete it)",
            f"{_REPLACE}:replace_set_aside",
            left=f"{_REPLACE}:replace_left_set_aside",
        ),
        Step(
            "gate",
            "the disk gate: fio's fdatasync p99 on the data directory",
            f"{_REPLACE}:replace_gate",
            left=f"{_REPLACE}:replace_left_gate",
            skippable=True,
        ),
        Step(
            "remove",
            "remove the old member (the cluster and its quorum shrink)",
            f"{_REPLACE}:replace_remove",
            left=f"{_REPLACE}:replace_left_as_is",
        ),
        Step(
            "add",
            "add the new member as a learner (no vote)",
            f"{_REPLACE}:replace_add",
            left=f"{_REPLACE}:replace_left_removed",
        ),
        Step(
            "start",
            "lift the fence and start the new member, joining the cluster",
            f"{_REPLACE}:replace_start",
            left=f"{_REPLACE}:replace_left_learner",
        ),
        Step(
            "promote",
            "promote the learner to a voter once it has caught up",
            f"{_REPLACE}:replace_promote",
            left=f"{_REPLACE}:replace_left_learner",
        ),
        Step(
            "wait",
            "wait until the cluster is healthy",
            f"{_REPLACE}:replace_wait",
            left=f"{_REPLACE}:replace_left_behind",
        ),
        Step(
            "clean-up",
            "delete the old data set aside",
            f"{_REPLACE}:replace_clean_up",
            skippable=True,
        ),
    ),
)

ETCD_RESTORE = Flow(
    "etcd restore",
    (
        Step(
            "preflight",
            "each member's data disk mounted, no kube-apiserver runs",
            f"{_RESTORE}:restore_preflight",
            alone=True,
        ),
        Step(
            "copy",
            "copy the snapshot to every member",
            f"{_RESTORE}:restore_copy",
            left=f"{_RESTORE}:restore_left_unchanged",
        ),
        Step(
            "stage",
            "unpack it beside the data on every member, etcd still running",
            f"{_RESTORE}:restore_stage",
            left=f"{_RESTORE}:restore_left_unstaged",
        ),
        Step(
            "recheck",
            "ask the control plane again: no kube-apiserver may run",
            f"{_RESTORE}:restore_recheck",
            left=f"{_RESTORE}:restore_left_unstaged_quietly",
        ),
        Step(
            "stop",
            "stop etcd on every member",
            f"{_RESTORE}:restore_stop",
            left=f"{_RESTORE}:restore_roll_back",
        ),
        Step(
            "swap",
            "the old data aside (kept), the staged data in its place",
            f"{_RESTORE}:restore_swap",
            left=f"{_RESTORE}:restore_roll_back",
        ),
        Step(
            "start",
            "start every member together and wait for a healthy cluster",
            f"{_RESTORE}:restore_start",
            left=f"{_RESTORE}:restore_roll_back",
        ),
        Step(
            "clean-up",
            "delete each member's old data and snapshot copy",
            f"{_RESTORE}:restore_clean_up",
            skippable=True,
        ),
    ),
)

KUBERNETES_UPGRADE = Flow(
    "kubernetes upgrade",
    (
        Step(
            "first-control-plane",
            "kubeadm upgrade apply on the first control-plane node",
            f"{_KUBERNETES}:upgrade_first_control_plane",
            left=f"{_KUBERNETES}:upgrade_left_first",
        ),
        Step(
            "control-plane",
            "kubeadm upgrade node on the others, one at a time",
            f"{_KUBERNETES}:upgrade_control_plane",
            left=f"{_KUBERNETES}:upgrade_left_control_plane",
        ),
        Step(
            "workers",
            "drain, upgrade and uncordon workers, --budget at a time",
            f"{_KUBERNETES}:upgrade_workers",
            left=f"{_KUBERNETES}:upgrade_left_workers",
        ),
    ),
)

# Each step an apply of the etcd role (members restarting one at a time) and a healthy cluster
# after it; a step an earlier, stopped run finished is not run again.
ETCD_ROTATE_CA = Flow(
    "etcd rotate-ca",
    (
        Step(
            "trust-new",
            "make the next CA; members and clients trust the old and the new",
            f"{_CERTS}:ca_trust_new",
            left=f"{_CERTS}:ca_left_trusting",
            done=f"{_CERTS}:ca_trusting_done",
        ),
        Step(
            "reissue",
            "the new CA signs: every certificate reissued from it",
            f"{_CERTS}:ca_reissue",
            left=f"{_CERTS}:ca_left_reissued",
            done=f"{_CERTS}:ca_reissued_done",
        ),
        Step(
            "drop-old",
            "the old CA no longer trusted anywhere",
            f"{_CERTS}:ca_drop_old",
            left=f"{_CERTS}:ca_left_dropping",
        ),
    ),
)

KUBERNETES_CERTS_RENEW = Flow(
    "kubernetes certs renew",
    (
        Step(
            "check-expiration",
            "the expiry report on the first control-plane node",
            f"{_KUBERNETES}:renew_check_expiration",
            alone=True,
        ),
        Step(
            "renew",
            "renew all and restart the control plane, node by node",
            f"{_KUBERNETES}:renew_control_plane",
            left=f"{_KUBERNETES}:renew_left",
        ),
    ),
)

KUBERNETES_ROTATE_SECRETS_KEY = Flow(
    "kubernetes rotate-secrets-key",
    (
        Step(
            "new-key",
            "make the next key, kept beside the old one in the cluster's state",
            f"{_ENCRYPTION}:rotate_new_key",
        ),
        Step(
            "add",
            "every API server reads the next key too (the old one still encrypts)",
            f"{_ENCRYPTION}:rotate_add",
            left=f"{_ENCRYPTION}:rotate_left",
        ),
        Step(
            "switch",
            "every API server encrypts with the next key (the old one still reads)",
            f"{_ENCRYPTION}:rotate_switch",
            left=f"{_ENCRYPTION}:rotate_left",
        ),
        Step(
            "rewrite",
            "write every Secret again; etcd must hold none under the old key",
            f"{_ENCRYPTION}:rotate_rewrite",
            left=f"{_ENCRYPTION}:rotate_left",
        ),
        Step(
            "drop",
            "every API server has the next key alone; the state keeps it",
            f"{_ENCRYPTION}:rotate_drop",
            left=f"{_ENCRYPTION}:rotate_left",
        ),
    ),
)

KUBERNETES_NODE_ADD = Flow(
    "kubernetes node add",
    (
        Step(
            "join",
            "the kubernetes role on them and the first control-plane node, paced",
            f"{_KUBERNETES}:add_join",
        ),
    ),
)

KUBERNETES_NODE_REMOVE = Flow(
    "kubernetes node remove",
    (
        Step(
            "read",
            "is the Node in the cluster, and cordoned already",
            f"{_KUBERNETES}:remove_read",
            alone=True,
        ),
        Step(
            "cordon",
            "cordon the node",
            f"{_KUBERNETES}:remove_cordon",
            done=f"{_KUBERNETES}:remove_deleted_already",
        ),
        Step(
            "drain",
            "drain it (--force: pods no controller manages too)",
            f"{_KUBERNETES}:remove_drain",
            left=f"{_KUBERNETES}:remove_left_drain",
            done=f"{_KUBERNETES}:remove_deleted_already",
        ),
        Step(
            "delete",
            "delete the Node object",
            f"{_KUBERNETES}:remove_delete",
            left=f"{_KUBERNETES}:remove_left_drained",
            done=f"{_KUBERNETES}:remove_deleted_already",
        ),
        Step(
            "reset",
            "kubeadm reset on the node",
            f"{_KUBERNETES}:remove_reset",
            left=f"{_KUBERNETES}:remove_left_deleted",
        ),
    ),
)


_JOB = "day2.fleetjob"

# `gpuinfra drift --job` (day2/fleetjob.py); whatever step fails, the Job's objects are deleted.
DRIFT_JOB = Flow(
    "drift --job",
    (
        Step(
            "sheet",
            "the keys: which hosts a shard can settle, split into shards",
            f"{_JOB}:make_sheets",
        ),
        Step(
            "publish",
            "the shards' ConfigMaps, the drift key's Secret and the Job, applied",
            f"{_JOB}:publish",
        ),
        Step("wait", "until the Job is Complete or Failed", f"{_JOB}:wait"),
        Step("collect", "each index's report, checked against its pod's sha256", f"{_JOB}:collect"),
        Step(
            "exact", "the hosts no shard settled, checked operation by operation", f"{_JOB}:exact"
        ),
        Step("merge", "one report, as local drift makes it", f"{_JOB}:merge"),
    ),
)

_ROLLOUT = "day2.rolloutjob"

ROLLOUT_JOB = Flow(
    "apply --job",
    (
        Step("shards", "the workers selected, split into shards", f"{_ROLLOUT}:make_shards"),
        Step(
            "state",
            "the state entries the selected workers' files read, each one those workers hold",
            f"{_ROLLOUT}:gather_state",
        ),
        Step(
            "token",
            "a join token on the first control-plane node, with a TTL past the deadline",
            f"{_ROLLOUT}:mint_token",
        ),
        Step(
            "key",
            "a key for this run only, certified by the rollout authority until the token's end",
            f"{_ROLLOUT}:certify_key",
        ),
        Step(
            "publish",
            "the ledger, the shards' progress, the Job (suspended until it owns the Secrets of "
            "the key, the token and the state entries)",
            f"{_ROLLOUT}:publish",
        ),
        Step(
            "wait",
            "until the Job is Complete or Failed, renewing the ledger's heartbeat",
            f"{_ROLLOUT}:wait",
        ),
        Step("collect", "each shard's progress and the ledger: one report", f"{_ROLLOUT}:collect"),
    ),
)
