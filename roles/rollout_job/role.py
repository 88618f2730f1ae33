"""The rollout Job's record: with `enabled`, the worker groups admit the rollout key as root
from the Job's nodes (a keys file and an sshd Match for root); nothing on any other host."""

from __future__ import annotations

from collections.abc import Iterator

from inventory.model import Cluster, LoadedCluster
from roles.rollout_job.config import RolloutJobConfig
from toolkit.spec import HostSettings, Phase, Role, lazy

# The groups a rollout may reach: the batch-policy Kubernetes nodes. The rest (etcd, control
# plane, load balancers, DNS) roll one at a time or together, which a Job's shards cannot
# coordinate: `apply --job` refuses them (day2/rolloutjob.py).
WORKER_GROUPS = ("gpu_worker", "cpu_worker")
NODE_GROUPS = ("control_plane", "gpu_worker", "cpu_worker")


def fleet_config(loaded: LoadedCluster) -> RolloutJobConfig:
    return cluster_config(loaded.cluster)


def cluster_config(cluster: Cluster) -> RolloutJobConfig:
    return RolloutJobConfig.model_validate(cluster.group_vars.get("all", {}).get("rollout_job", {}))


def checks(loaded: LoadedCluster, settings: HostSettings) -> Iterator[tuple[str, str]]:
    """One object for the fleet: settings only in group_vars.all; its nodes are Kubernetes
    nodes."""
    cluster = loaded.cluster
    for group, values in cluster.group_vars.items():
        if group != "all" and "rollout_job" in values:
            yield (f"group_vars.{group}.rollout_job", "set rollout_job in group_vars.all only")
    for name, host in cluster.hosts.items():
        if "rollout_job" in host.vars:
            yield (f"hosts.{name}.vars.rollout_job", "set rollout_job in group_vars.all only")
    try:
        cfg = fleet_config(loaded)
    except ValueError:
        return  # the settings' own validation names the key
    if not cfg.enabled:
        return
    if not cfg.nodes:
        yield ("group_vars.all.rollout_job.nodes", "name the Kubernetes nodes the Job runs on")
    for node in cfg.nodes:
        host = cluster.hosts.get(node)
        if host is None or not any(group in NODE_GROUPS for group in host.groups):
            yield (
                "group_vars.all.rollout_job.nodes",
                f"{node} is not a Kubernetes node of this inventory ({', '.join(NODE_GROUPS)})",
            )
    if cluster.ssh.bastion:
        yield ("group_vars.all.rollout_job.enabled", "the Job's pods cannot use ssh.bastion")


ROLE = Role(
    name="rollout_job",
    config=RolloutJobConfig,
    phases=(
        Phase(
            WORKER_GROUPS,
            lazy("roles.rollout_job.files:managed_files"),
            lazy("roles.rollout_job.deploy:apply"),
            # No `when`: a phase the inventory turns off moves the later phases' positions,
            # which tests/unit/test_drift_job.py pins; off, this one has no file and no
            # operation and asks no fact.
        ),
    ),
    checks=checks,
    summary="worker rollouts as a Kubernetes Job: the rollout key on the workers",
)
