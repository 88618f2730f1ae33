"""The fleet policy's cluster-wide files under OUT/_cluster/: Kubernetes manifests (team
isolation, balloons, GPU metrics, API Priority and Fairness for gpuinfra's own clients), the
scheduler's configuration and the control plane's
kubeadm settings for in-tree gang scheduling, and per-node labels and taints for the kubernetes
role. The series kept at scrape time go to the monitoring role (`metric_rules`).

Every Kubernetes object is validated against the pinned Kubernetes version's schemas before it
is returned, so `gpuinfra render` never writes an object the API server would refuse on shape.
"""

from __future__ import annotations

from typing import Any

import yaml

from inventory.model import Cluster, LoadedCluster
from inventory.topology import DCGM_EXPORTER_PORT
from roles.fleet_policy import gang
from roles.fleet_policy.config import FleetPolicyConfig
from roles.fleet_policy.schemas import crd_schemas, documents, validate_objects
from toolkit import nodes
from toolkit.nodes import (
    TEAM_LABEL_KEY,
    TEAM_TAINT_EFFECT,
    TEAM_TAINT_KEY,
    SchedulerFiles,
    node_labels,
    node_taints,
    team_namespaces,
)
from toolkit.spec import default_settings, provided, settings_of
from toolkit.templates import render_template

KUBERNETES_DIR = "kubernetes/fleet-policy"
NAMESPACE = f"{KUBERNETES_DIR}/namespace.yaml"
TEAMS = f"{KUBERNETES_DIR}/teams.yaml"
BALLOONS = f"{KUBERNETES_DIR}/balloons.yaml"
GPU_METRICS = f"{KUBERNETES_DIR}/gpu-metrics.yaml"
FLOW_CONTROL = f"{KUBERNETES_DIR}/flow-control.yaml"
# The priority level and the flow schema that puts gpuinfra's own accounts in it.
FLEET_PRIORITY_LEVEL = "gpuinfra-fleet-jobs"
# Files for the control plane hosts, placed by the kubernetes role with kubeadm.
SCHEDULER_CONFIG = "scheduler/kube-scheduler-config.yaml"
KUBEADM_CLUSTER_CONFIGURATION = "scheduler/kubeadm-cluster-configuration.yaml"
NODES = "fleet-policy/nodes.yaml"
# Cluster admins, who may preset a pod's node (`kubectl debug node/...`) and could delete the
# policies anyway: system:masters (kubeadm's super-admin.conf) and kubeadm:cluster-admins (its
# admin.conf since Kubernetes 1.29, the operator's kubeconfig).
ADMIN_GROUPS = ("system:masters", "kubeadm:cluster-admins")
# kube-controller-manager's controllers that create pods, ReplicaSets and Jobs from a template
# (each under its own account: kubeadm runs it with --use-service-account-credentials). They
# may preset a pod's node because the template they copy was checked where its author is known
# (templates/fleet_policy/teams.yaml.j2, gpuinfra-workload-node-presets).
WORKLOAD_CONTROLLERS = tuple(
    f"system:serviceaccount:kube-system:{name}-controller"
    for name in ("statefulset", "replicaset", "job", "replication", "deployment", "cronjob")
)
# Namespaces whose pods tolerate every taint by design (node agents): the team policy skips them.
SYSTEM_NAMESPACES = ("kube-system", "kube-node-lease", "kube-public")

# gpu_health's cluster-wide settings (its namespace is exempt from the team policy).
gpu_health_config = provided("gpu_health", "cluster_config")
# Whether a GPU worker gets the nvidia container runtime (the nvidia role's packages).
nvidia_runtime_installed = provided("nvidia", "runtime_installed")
# The accounts the roles' in-cluster pods call the API server as: the GPU health checks and
# sampler, the drift Job, the rollout Job. The device plugin, DCGM exporter and balloons (this
# role's) run as their namespace's default account with no token: they never call it.
fleet_accounts = (
    provided("gpu_health", "service_accounts"),
    provided("drift_job", "service_accounts"),
    provided("rollout_job", "service_accounts"),
)

# etcd's debugging and per-method gRPC series; the alerts use fsync/commit latency and leader.
ETCD_DROP = ["etcd_debugging_.*", "grpc_server_handled_total", "grpc_server_msg_.*", "go_.*"]


class FleetPolicyInvalid(ValueError):
    """A rendered object failed schema validation: a defect in a template or a setting."""


def fleet_config(loaded: LoadedCluster) -> FleetPolicyConfig:
    """Fleet-wide settings: group vars of `all` only (one set of objects for all hosts)."""
    merged = dict(loaded.cluster.group_vars.get("all", {}).get("fleet_policy", {}))
    return FleetPolicyConfig.model_validate(merged)


def balloon_pools(cluster: Cluster, cfg: FleetPolicyConfig) -> list[tuple[str, dict[str, Any]]]:
    """Each pool with the node selector it lands on: its team's nodes, GPU workers for GPUs."""
    pools = []
    for name, pool in cfg.balloons.items():
        selector: dict[str, str] = {}
        if pool.gpus:
            selector[nodes.GPU_WORKER_LABEL_KEY] = nodes.GPU_WORKER_LABEL_VALUE
        if pool.team:
            selector[TEAM_LABEL_KEY] = pool.team
        selector.update(pool.node_selector)
        pools.append((name, {**pool.model_dump(), "selector": selector}))
    return pools


def node_placement(loaded: LoadedCluster) -> dict[str, Any]:
    """Labels and taints each worker registers with (kubelet --node-labels and
    --register-with-taints), for the kubernetes role; the preflight taint on GPU workers, and
    the nvidia runtime's label where the nvidia role installs it."""
    cluster = loaded.cluster
    hosts: dict[str, Any] = {}
    for name in cluster.hosts:
        labels = node_labels(cluster, name)
        taints = node_taints(cluster, name)
        if name in cluster.in_group("gpu_worker"):
            labels = {nodes.GPU_WORKER_LABEL_KEY: nodes.GPU_WORKER_LABEL_VALUE, **labels}
            if nvidia_runtime_installed(loaded, name):
                labels[nodes.NVIDIA_RUNTIME_LABEL_KEY] = nodes.NVIDIA_RUNTIME_LABEL_VALUE
            taints = [nodes.PREFLIGHT_TAINT, *taints]
        if labels or taints:
            hosts[name] = {"labels": labels, "taints": taints}
    return {"hosts": hosts}


def metric_rules(loaded: LoadedCluster) -> dict[str, list[dict[str, str]]]:
    """Series kept or dropped at scrape time, by the monitoring role's scrape job: only the
    DCGM fields the alerts and dashboards use, and etcd without its debugging series (too many
    series was its own failure at scale). The monitoring role writes them into the Prometheus
    configuration it loads."""
    cfg = fleet_config(loaded)
    return {
        "dcgm": [{"regex": "|".join(cfg.dcgm_keep_metrics), "action": "keep"}],
        "etcd": [{"regex": "|".join(ETCD_DROP), "action": "drop"}],
        # The Events cluster's members (etcd.events), the same etcd with the same series.
        "etcd-events": [{"regex": "|".join(ETCD_DROP), "action": "drop"}],
    }


def template_context(loaded: LoadedCluster) -> dict[str, Any]:
    """What every fleet policy template is rendered with."""
    cluster = loaded.cluster
    cfg = fleet_config(loaded)
    health = gpu_health_config(loaded)
    in_tree = gang.in_tree_gang(cluster.versions.kubernetes)
    return {
        "cluster_name": cluster.name,
        "cfg": cfg,
        "label_key": nodes.GPU_WORKER_LABEL_KEY,
        "label_value": nodes.GPU_WORKER_LABEL_VALUE,
        "runtime_label_key": nodes.NVIDIA_RUNTIME_LABEL_KEY,
        "runtime_label_value": nodes.NVIDIA_RUNTIME_LABEL_VALUE,
        "taint_key": TEAM_TAINT_KEY,
        "taint_effect": TEAM_TAINT_EFFECT,
        "gpu_resource": health.gpu_resource,
        "minor": cluster.versions.kubernetes_version.major_minor,
        "gang": in_tree,
        "gang_plugin": gang.PLUGIN,
        "api_server_gates": gang.feature_gates(in_tree.api_server_gates),
        "scheduler_gates": gang.feature_gates(in_tree.scheduler_gates),
        "controller_manager_gates": gang.feature_gates(in_tree.controller_manager_gates),
        # The port the firewall opens to the monitoring hosts (gpu_health's record).
        "dcgm_port": DCGM_EXPORTER_PORT,
        # kube-scheduler ignores --kube-api-qps/--kube-api-burst once it reads --config: the
        # kubernetes role's client limits go into the configuration file instead.
        "scheduler_client": scheduler_client(loaded),
    }


def service_accounts(loaded: LoadedCluster) -> list[tuple[str, str]]:
    """(namespace, name) of every gpuinfra account the flow schema matches, sorted, each once
    (the two Jobs share a namespace by default)."""
    return sorted({account for accounts in fleet_accounts for account in accounts(loaded)})


def scheduler_client(loaded: LoadedCluster) -> Any:
    """The kubernetes role's settings of the first control-plane node (its defaults without one):
    the scheduler's client limits come from there."""
    control_plane = loaded.cluster.in_group("control_plane")
    if not control_plane:
        return default_settings("kubernetes")
    return settings_of(loaded, control_plane[0], "kubernetes")


def scheduler_files(loaded: LoadedCluster, context: dict[str, Any] | None = None) -> SchedulerFiles:
    common = context or template_context(loaded)
    kubeadm = yaml.safe_load(
        render_template("fleet_policy/kubeadm-cluster-configuration.yaml.j2", **common)
    )
    return SchedulerFiles(
        config_path=common["cfg"].scheduler_config_path,
        config=render_template("fleet_policy/kube-scheduler-config.yaml.j2", **common),
        kubeadm=kubeadm["scheduler"],
        api_server=kubeadm["apiServer"],
        controller_manager=kubeadm.get("controllerManager", {}),
    )


def cluster_files(loaded: LoadedCluster) -> dict[str, str]:
    cluster = loaded.cluster
    common = template_context(loaded)
    cfg: FleetPolicyConfig = common["cfg"]
    namespaces = [
        (namespace, team) for team in cluster.teams for namespace in team_namespaces(cluster, team)
    ]
    exempt = [*SYSTEM_NAMESPACES, cfg.namespace, gpu_health_config(loaded).namespace]
    manifests = {
        NAMESPACE: render_template("fleet_policy/namespace.yaml.j2", **common),
        TEAMS: render_template(
            "fleet_policy/teams.yaml.j2",
            **{**common, "label_key": TEAM_LABEL_KEY},
            namespaces=namespaces,
            exempt=exempt,
            admin_groups=list(ADMIN_GROUPS),
            workload_controllers=list(WORKLOAD_CONTROLLERS),
            agent_namespaces=[*SYSTEM_NAMESPACES, cfg.namespace],
            health_namespace=gpu_health_config(loaded).namespace,
            health_accounts=list(nodes.GPU_HEALTH_CHECK_ACCOUNTS),
            preflight_key=nodes.PREFLIGHT_TAINT_KEY,
            preflight_effect=nodes.PREFLIGHT_TAINT_EFFECT,
        ),
        BALLOONS: render_template(
            "fleet_policy/balloons.yaml.j2", **common, pools=balloon_pools(cluster, cfg)
        ),
        GPU_METRICS: render_template("fleet_policy/gpu-metrics.yaml.j2", **common),
        FLOW_CONTROL: render_template(
            "fleet_policy/flow-control.yaml.j2",
            **common,
            flow=cfg.flow_control,
            level=FLEET_PRIORITY_LEVEL,
            accounts=service_accounts(loaded),
        ),
    }
    check_manifests(manifests, cluster.versions.kubernetes)
    scheduler = scheduler_files(loaded, common)
    return {
        **manifests,
        SCHEDULER_CONFIG: scheduler.config,
        KUBEADM_CLUSTER_CONFIGURATION: render_template(
            "fleet_policy/kubeadm-cluster-configuration.yaml.j2", **common
        ),
        NODES: "# Rendered by gpuinfra (roles/fleet_policy): labels and taints per node, applied "
        "by the kubernetes role at join.\n"
        + yaml.safe_dump(node_placement(loaded), sort_keys=False),
    }


def check_manifests(manifests: dict[str, str], kubernetes_version: str) -> None:
    objects = [(path, obj) for path, text in manifests.items() for obj in documents(text)]
    crds = crd_schemas(obj for _, obj in objects)
    problems = [
        f"{path}: {problem}"
        for path, obj in objects
        for problem in validate_objects([obj], kubernetes_version, crds)
    ]
    if problems:
        raise FleetPolicyInvalid("; ".join(problems))
