"""The rollout Job's record: with `enabled`, the worker groups admit the rollout key as root
from the Job's nodes (a keys file and an sshd Match for root); nothing on any other host. And
the Job's service account, for fleet_policy's flow schema."""

from __future__ import annotations

from collections.abc import Iterator

from inventory.model import Cluster, LoadedCluster
from roles.rollout_job.config import RolloutJobConfig
from toolkit import jobs
from toolkit.spec import HostSettings, Phase, Role, lazy

# The groups a rollout may reach: the batch-policy Kubernetes nodes. The rest (etcd, control
# plane, load balancers, DNS) roll one at a time or together, which a Job's shards cannot
# coordinate: `apply --job` refuses them (day2/rolloutjob.py).
WORKER_GROUPS = ("gpu_worker", "cpu_worker")
# The account `apply --job`'s pods update the ledger as (templates/rollout_job/rollout-job.yaml.j2).
SERVICE_ACCOUNT = "gpuinfra-rollout"


def fleet_config(loaded: LoadedCluster) -> RolloutJobConfig:
    return cluster_config(loaded.cluster)


def cluster_config(cluster: Cluster) -> RolloutJobConfig:
    return jobs.fleet_settings(cluster, "rollout_job", RolloutJobConfig)


def service_accounts(loaded: LoadedCluster) -> list[tuple[str, str]]:
    """(namespace, name) of the Job's account while it is enabled (dormant, it leaves no trace
    in the cluster's objects)."""
    cfg = fleet_config(loaded)
    return [(cfg.namespace, SERVICE_ACCOUNT)] if cfg.enabled else []


def checks(loaded: LoadedCluster, settings: HostSettings) -> Iterator[tuple[str, str]]:
    """One object for the fleet: settings only in group_vars.all; its nodes are Kubernetes
    nodes."""
    cluster = loaded.cluster
    cfg = yield from jobs.enabled_settings(cluster, "rollout_job", RolloutJobConfig)
    if cfg is None:
        return
    if not cfg.nodes:
        yield ("group_vars.all.rollout_job.nodes", "name the Kubernetes nodes the Job runs on")
    for node in cfg.nodes:
        problem = jobs.not_a_node(cluster, "rollout_job", node)
        if problem is not None:
            yield problem
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
    provides={"service_accounts": service_accounts},
    summary="worker rollouts as a Kubernetes Job: the rollout key on the workers",
)
