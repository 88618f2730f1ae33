"""The drift job's record: the forced-command user on every host (with `enabled`), one firewall
rule on the fleet-ops nodes, the older Indexed Job manifest as a cluster file, and the Job's
service account."""

from __future__ import annotations

from collections.abc import Iterator

from inventory.model import Cluster, LoadedCluster
from inventory.topology import FirewallRule, collapse_sources, host_rules_key
from roles.drift_job.config import DriftJobConfig
from toolkit import jobs, nodes
from toolkit.spec import HostSettings, Phase, Role, lazy, settings_of
from toolkit.ssh import ssh_settings
from toolkit.sshkeys import pod_sources

# The account `drift --job`'s pods run as (templates/drift_job/fleet-job.yaml.j2).
SERVICE_ACCOUNT = "gpuinfra-drift"


def fleet_config(loaded: LoadedCluster) -> DriftJobConfig:
    """The drift Job's settings, the same on every host: group_vars.all only (`checks` refuses
    them anywhere else)."""
    return cluster_config(loaded.cluster)


def cluster_config(cluster: Cluster) -> DriftJobConfig:
    return jobs.fleet_settings(cluster, "drift_job", DriftJobConfig)


def service_accounts(loaded: LoadedCluster) -> list[tuple[str, str]]:
    """(namespace, name) of the Job's account while it is enabled (dormant, it leaves no trace
    in the cluster's objects): its pods mount no token today (they reach the hosts over ssh),
    but the account is the Job's and fleet_policy classifies it all the same."""
    cfg = fleet_config(loaded)
    return [(cfg.namespace, SERVICE_ACCOUNT)] if cfg.enabled else []


def phase_on(cluster: Cluster) -> bool:
    """The host phase runs while the Job is enabled, or once more to remove what it installed:
    otherwise it is on no host (no operation, no fact, not among a record's roles)."""
    cfg = cluster_config(cluster)
    return cfg.enabled or cfg.remove


def ports(loaded: LoadedCluster) -> dict[str, list[FirewallRule]]:
    """The one rule the Job adds, on each fleet-ops node only: ssh from its own pods. Other
    hosts see the pods masqueraded to a node's address, which base's rule already admits."""
    cfg = fleet_config(loaded)
    if not cfg.enabled:
        return {}
    cluster = loaded.cluster
    return {
        host_rules_key(node): [
            FirewallRule(
                "SSH from this node's drift Job pods",
                ssh_settings(loaded).port,
                "tcp",
                collapse_sources(
                    pod_sources(cluster, node, settings_of(loaded, node, "kubernetes"))
                ),
            )
        ]
        for node in cfg.nodes
    }


def checks(loaded: LoadedCluster, settings: HostSettings) -> Iterator[tuple[str, str]]:
    """The Job is one object for the fleet: its settings only in group_vars.all; its nodes are
    Kubernetes nodes; under "routes" the pods' traffic must be masqueraded."""
    cluster = loaded.cluster
    cfg = yield from jobs.enabled_settings(cluster, "drift_job", DriftJobConfig)
    if cfg is None:
        return
    if cfg.remove:
        yield ("group_vars.all.drift_job.remove", "remove: true needs enabled: false")
    if not cfg.nodes and not cfg.sources:
        # With sources only, the Job runs in another cluster (`drift --job --job-cluster`).
        yield (
            "group_vars.all.drift_job.nodes",
            "name the Kubernetes nodes the Job runs on (or, for a Job in another cluster, "
            "its nodes' addresses in sources)",
        )
    for node in cfg.nodes:
        problem = jobs.not_a_node(cluster, "drift_job", node)
        if problem is not None:
            yield problem
            continue
        team = nodes.team_of(cluster, node)
        if team is not None and cfg.namespace not in nodes.team_namespaces(cluster, team):
            yield (
                "group_vars.all.drift_job.nodes",
                f"{node} belongs to the team {team}: fleet_policy admits a pod tolerating its "
                f"taint only in the team's namespaces, not in {cfg.namespace} (pick shared nodes)",
            )
        kubernetes = settings.get(node, {}).get("kubernetes")
        if getattr(kubernetes, "enabled", False) is False:
            yield ("group_vars.all.drift_job.nodes", f"{node}: kubernetes is not enabled there")
        elif kubernetes.cni == "routes" and not kubernetes.routes_nat_outgoing:
            yield (
                "kubernetes.routes_nat_outgoing",
                f"false on {node}, a drift Job node: hosts outside the pod network could not "
                "answer its pods (set group_vars.all.kubernetes.routes_nat_outgoing: true)",
            )


ROLE = Role(
    name="drift_job",
    config=DriftJobConfig,
    phases=(
        Phase(
            None,
            lazy("roles.drift_job.files:managed_files"),
            lazy("roles.drift_job.deploy:apply"),
            when=phase_on,
        ),
    ),
    ports=ports,
    cluster_files=lazy("roles.drift_job.files:cluster_files"),
    checks=checks,
    provides={"service_accounts": service_accounts},
    summary="the fleet drift check as a Kubernetes Job: the probe's forced-command user, the Job",
)
