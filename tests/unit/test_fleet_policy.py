"""The fleet policy renders from the inventory, every object is schema-valid for the pinned
Kubernetes version, and the admission policies' own CEL expressions (read from the rendered
manifests) admit and refuse what they must.

No API server can run here: the CEL is evaluated with cel-python, a maintained implementation
of the CEL spec, standing in for the API server's evaluator (Kubernetes' own CEL library
extensions, unused by these expressions, are not available in it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes
from typer.testing import CliRunner

from cli.main import app
from engine.context import cluster_files as every_cluster_file
from engine.context import load
from engine.registry import ROLE_CONFIGS, ROLES_BY_NAME
from inventory.errors import InventoryInvalid
from roles import fleet_policy
from roles.fleet_policy import files, gang
from roles.fleet_policy.config import FleetPolicyConfig
from roles.fleet_policy.role import ROLE
from roles.fleet_policy.schemas import crd_schemas, documents, validate_objects
from toolkit.nodes import team_of

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventory" / "sample"
DCGM_SAMPLE = Path(__file__).parent / "data" / "dcgm-exporter-metrics.txt"
EXAMPLE_JOB = ROOT / "docs" / "examples" / "gang-training-job.yaml"
# The sample inventory's Kubernetes, whose schemas the examples are checked against.
KUBERNETES = "1.35.4"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """`gpuinfra render inventory/sample`, as an operator runs it."""
    out = tmp_path_factory.mktemp("render")
    result = CliRunner().invoke(app, ["render", str(SAMPLE), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out / "_cluster"


def objects_in(folder: Path) -> list[tuple[str, dict]]:
    return [
        (str(path.relative_to(folder)), obj)
        for path in sorted(folder.rglob("*.yaml"))
        for obj in documents(path.read_text())
    ]


def find(rendered: Path, path: str, kind: str, name: str | None = None) -> dict:
    return next(
        obj
        for obj in documents((rendered / path).read_text())
        if obj["kind"] == kind and (name is None or obj["metadata"]["name"] == name)
    )


# --- every object, schema-valid ---


def test_render_writes_every_fleet_object(rendered):
    kinds = {(o["kind"], o["metadata"]["name"]) for _, o in objects_in(rendered / "kubernetes")}
    for wanted in [
        ("ValidatingAdmissionPolicy", "gpuinfra-team-tolerations"),
        ("ValidatingAdmissionPolicyBinding", "gpuinfra-team-tolerations"),
        ("ValidatingAdmissionPolicy", "gpuinfra-workload-node-presets"),
        ("ValidatingAdmissionPolicyBinding", "gpuinfra-workload-node-presets"),
        ("ValidatingAdmissionPolicy", "gpuinfra-gpu-health-node-writes"),
        ("Namespace", "research"),
        ("Namespace", "research-batch"),
        ("Namespace", "inference"),
        ("PriorityClass", "gpuinfra-balloon"),
        ("Deployment", "balloon-research-gpu"),
        ("DaemonSet", "nvidia-device-plugin"),
        ("DaemonSet", "dcgm-exporter"),
        ("DaemonSet", "gpu-health-preflight"),
        ("CronJob", "gpu-health-periodic"),
        ("PriorityLevelConfiguration", "gpuinfra-fleet-jobs"),
        ("FlowSchema", "gpuinfra-fleet-jobs"),
    ]:
        assert wanted in kinds
    for path in [
        files.SCHEDULER_CONFIG, files.KUBEADM_CLUSTER_CONFIGURATION, files.NODES,
    ]:  # fmt: skip
        assert (rendered / path).is_file()
    # Gang scheduling is in-tree: no PodGroup CRD, no scheduler-plugins RBAC, no image patch.
    assert not any(kind == "CustomResourceDefinition" for kind, _ in kinds)
    assert not any("scheduler-plugins" in name for _, name in kinds)
    assert not (rendered / "scheduler" / "kubeadm-patches").exists()


def test_every_rendered_object_is_valid_for_the_pinned_kubernetes(rendered):
    # Calico's objects are the kubernetes role's, checked by its own tests.
    objects = [
        (p, o) for p, o in objects_in(rendered / "kubernetes") if not p.startswith("calico/")
    ]
    # The drift Job lives apart from the objects the kubernetes role applies.
    objects += objects_in(rendered / "drift-job")
    # The periodic check's Job template, which the sampler creates per node, is checked too.
    config = find(rendered, "kubernetes/gpu-health.yaml", "ConfigMap")
    objects.append(("periodic-job.yaml", yaml.safe_load(config["data"]["periodic-job.yaml"])))
    # drift job (1), gpu-health (21 + the Job), fleet policy (17), monitoring's kubelet RBAC (2)
    assert len(objects) == 42
    crds = crd_schemas(obj for _, obj in objects)
    version = load(SAMPLE).cluster.versions.kubernetes
    problems = [
        f"{path}: {problem}"
        for path, obj in objects
        for problem in validate_objects([obj], version, crds)
    ]
    assert problems == []


def test_the_validator_refuses_what_the_api_server_would(rendered):
    # Negative controls for the test above: an unknown field, a wrong type, an unknown kind.
    deployment = find(rendered, files.BALLOONS, "Deployment")
    bad = yaml.safe_load(yaml.safe_dump(deployment))
    bad["spec"]["replica"] = 1
    wrong = yaml.safe_load(yaml.safe_dump(deployment))
    wrong["spec"]["replicas"] = "one"
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    problems = validate_objects([deployment, bad, wrong, unknown], KUBERNETES)
    assert len(problems) == 3
    assert "'replica' was unexpected" in problems[0]
    assert "spec/replicas" in problems[1]
    assert "no schema" in problems[2]


def test_the_example_gang_job_is_valid_against_the_schemas_of_its_kubernetes(rendered):
    example = documents(EXAMPLE_JOB.read_text())
    assert [obj["kind"] for obj in example] == ["Workload", "Service", "Job"]
    workload, _, job = example
    assert workload["apiVersion"] == gang.in_tree_gang(KUBERNETES).workload_api
    assert validate_objects(example, KUBERNETES) == []
    # The alpha API is in the bundled 1.35 schemas, and really applied: PodGroup's field names
    # (scheduling.x-k8s.io) are refused in a Workload, and so is a misspelt workloadRef.
    broken = yaml.safe_load(yaml.safe_dump(workload))
    broken["spec"]["podGroups"][0]["policy"]["gang"]["minMember"] = 2
    misspelt = yaml.safe_load(yaml.safe_dump(job))
    misspelt["spec"]["template"]["spec"]["workloadRef"]["replicaKey"] = "0"  # podGroupReplicaKey
    problems = validate_objects([broken, misspelt], KUBERNETES)
    assert len(problems) == 2
    assert problems[0].startswith("Workload research-batch/llm-pretrain: spec/podGroups/0/")
    assert "'minMember' was unexpected" in problems[0]
    assert "spec/template/spec/workloadRef" in problems[1]
    assert "'replicaKey' was unexpected" in problems[1]
    # Kubernetes 1.34 has no Workload API: said, not skipped.
    assert validate_objects([workload], "1.34.0") == [
        "Workload research-batch/llm-pretrain: no schema for scheduling.k8s.io/v1alpha1 Workload"
    ]


def test_the_example_jobs_pods_form_the_gang_their_workload_declares():
    workload, _, job = documents(EXAMPLE_JOB.read_text())
    ref = job["spec"]["template"]["spec"]["workloadRef"]
    assert ref["name"] == workload["metadata"]["name"]
    assert workload["metadata"]["namespace"] == job["metadata"]["namespace"]
    groups = {group["name"]: group["policy"] for group in workload["spec"]["podGroups"]}
    # The API server wants exactly one of basic and gang; the scheduler queues none of the pods
    # before minCount of them exist, so the Job must start that many at once.
    assert list(groups[ref["podGroup"]]) == ["gang"]
    min_count = groups[ref["podGroup"]]["gang"]["minCount"]
    assert min_count == job["spec"]["parallelism"] == job["spec"]["completions"] == 2


def test_a_custom_resource_is_checked_against_its_crd_rendered_beside_it():
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                "openAPIV3Schema": {"type": "object", "properties": {
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                }},
            }}],
        },
    }  # fmt: skip
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
              "spec": {"size": 1}}  # fmt: skip
    crds = crd_schemas([crd])
    assert validate_objects([crd, widget], KUBERNETES, crds) == []
    for bad in ({"size": "one"}, {"sizes": 1}):
        problems = validate_objects([{**widget, "spec": bad}], KUBERNETES, crds)
        assert len(problems) == 1 and problems[0].startswith("Widget w: spec")


# --- team isolation: the policy's own CEL ---


def _cel(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(activation)


def admission(policy: dict, obj: dict, namespace: dict | None, request: dict, old=None):
    """Evaluate a ValidatingAdmissionPolicy as the API server does: match conditions, then
    variables in order, then validations. None when a match condition excludes the request,
    otherwise the messages of the failed validations (empty: admitted)."""
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(request),
        "namespaceObject": celpy.json_to_cel(namespace),
    }
    spec = policy["spec"]
    for condition in spec.get("matchConditions", []):
        if not _cel(condition["expression"], activation):
            return None
    variables: dict[celtypes.StringType, Any] = {}
    for variable in spec.get("variables", []):
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = _cel(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    failed = []
    for validation in spec["validations"]:
        if not _cel(validation["expression"], activation):
            message = validation.get("messageExpression")
            failed.append(str(_cel(message, activation)) if message else validation["message"])
    return failed


def team_namespace(name: str, team: str | None) -> dict:
    labels = {"gpuinfra.io/team": team} if team else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def pod(namespace: str, tolerations: list[dict] | None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": namespace}, "spec": spec}


def team_toleration(team: str, **extra: str) -> dict:
    return {"key": "gpuinfra.io/team", "operator": "Equal", "value": team, "effect": "NoSchedule",
            **extra}  # fmt: skip


@pytest.fixture(scope="module")
def team_policy(rendered) -> dict:
    return find(rendered, files.TEAMS, "ValidatingAdmissionPolicy", "gpuinfra-team-tolerations")


def decide_team(team_policy, namespace: str, team: str | None, tolerations):
    request = {"namespace": namespace, "operation": "CREATE", "userInfo": {"username": "alice"}}
    return admission(team_policy, pod(namespace, tolerations), team_namespace(namespace, team),
                     request)  # fmt: skip


def test_a_pod_tolerating_another_teams_taint_is_refused(team_policy):
    failed = decide_team(team_policy, "research", "research", [team_toleration("inference")])
    assert failed == [
        "pods in namespace research (team research) may only tolerate their own team taint "
        "gpuinfra.io/team=research"
    ]


def test_a_pod_tolerating_its_own_teams_taint_is_admitted(team_policy):
    assert (
        decide_team(team_policy, "research-batch", "research", [team_toleration("research")]) == []
    )


def test_a_pod_with_no_tolerations_is_admitted(team_policy):
    assert decide_team(team_policy, "research", "research", None) == []
    assert decide_team(team_policy, "research", "research", []) == []


@pytest.mark.parametrize(
    "tolerations",
    [
        [{"key": "gpuinfra.io/team", "operator": "Exists"}],  # every team
        [{"operator": "Exists"}],  # every taint there is
        [{"operator": "Exists", "effect": "NoSchedule"}],
        [team_toleration("research"), team_toleration("inference")],
        [{"key": "gpuinfra.io/team", "value": "inference"}],  # Equal is the default operator
    ],
)
def test_tolerations_that_reach_other_teams_are_refused(team_policy, tolerations):
    assert len(decide_team(team_policy, "research", "research", tolerations)) == 1


@pytest.mark.parametrize(
    "tolerations",
    [
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        # NoExecute alone does not tolerate a NoSchedule taint: it lands nowhere new.
        [team_toleration("inference", effect="NoExecute")],
        [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],  # fmt: skip
    ],
)
def test_tolerations_of_other_taints_are_admitted(team_policy, tolerations):
    assert decide_team(team_policy, "research", "research", tolerations) == []


def test_a_namespace_of_no_team_may_tolerate_no_team(team_policy):
    assert decide_team(team_policy, "default", None, [team_toleration("research")]) != []
    assert decide_team(team_policy, "default", None, None) == []


def test_node_agent_namespaces_are_exempt(team_policy):
    # The balloons tolerate a team taint by design, from the fleet's own namespace.
    assert decide_team(team_policy, "gpuinfra-system", None, [{"operator": "Exists"}]) is None
    assert decide_team(team_policy, "kube-system", None, [{"operator": "Exists"}]) is None


def test_the_example_job_is_admitted_in_its_teams_namespace(team_policy):
    job = documents(EXAMPLE_JOB.read_text())[2]
    tolerations = job["spec"]["template"]["spec"]["tolerations"]
    assert decide_team(team_policy, "research-batch", "research", tolerations) == []
    assert decide_team(team_policy, "inference", "inference", tolerations) != []


def placed_pod(namespace: str, node: str, annotations: dict | None = None) -> dict:
    """A pod with spec.nodeName preset: it skips the scheduler and every NoSchedule taint."""
    placed = pod(namespace, None)
    placed["spec"]["nodeName"] = node
    if annotations:
        placed["metadata"]["annotations"] = annotations
    return placed


def decide_placed(team_policy, placed: dict, user: str, groups=(), operation="CREATE"):
    namespace = placed["metadata"]["namespace"]
    request = {"namespace": namespace, "operation": operation,
               "userInfo": {"username": user, "groups": list(groups)}}  # fmt: skip
    return admission(team_policy, placed, team_namespace(namespace, "research"), request)


def test_a_pod_that_presets_its_node_is_refused(team_policy):
    failed = decide_placed(team_policy, placed_pod("research", "gpu-1"), "alice",
                           ["system:authenticated"])  # fmt: skip
    assert failed == [
        "pods in namespace research may not set spec.nodeName: it skips the scheduler and "
        "every taint (preflight, teams)"
    ]
    # The control: the same pod left to the scheduler is admitted.
    assert decide_placed(team_policy, pod("research", None), "alice") == []


def test_mirror_pods_admins_and_bound_pods_may_carry_a_node_name(team_policy):
    mirror = placed_pod("research", "gpu-1", {"kubernetes.io/config.mirror": "abc"})
    assert decide_placed(team_policy, mirror, "system:node:gpu-1", ["system:nodes"]) == []
    # The annotation alone is not enough: only a kubelet creates mirror pods.
    assert decide_placed(team_policy, mirror, "alice") != []
    # A cluster admin (`kubectl debug node/...`) can delete the policy anyway.
    admin = ["system:masters", "system:authenticated"]
    assert decide_placed(team_policy, placed_pod("research", "gpu-1"), "admin", admin) == []
    # kubeadm's admin.conf (the operator's kubeconfig) is not system:masters since 1.29.
    kubeadm = ["kubeadm:cluster-admins", "system:authenticated"]
    placed = placed_pod("research", "gpu-1")
    assert decide_placed(team_policy, placed, "kubernetes-admin", kubeadm) == []
    # The control: another group of the same user name is refused.
    assert decide_placed(team_policy, placed, "kubernetes-admin", ["developers"]) != []
    # A pod the scheduler bound (pods/binding) carries nodeName in every later update.
    bound = placed_pod("research", "gpu-1")
    assert decide_placed(team_policy, bound, "alice", operation="UPDATE") == []


CONTROLLER = "system:serviceaccount:kube-system:statefulset-controller"


def test_the_workload_controllers_may_create_pods_bound_to_a_node(team_policy):
    """A StatefulSet's or a Job's pods carry their template's nodeName, and their creator is
    the controller: what it copies was checked on the workload (below)."""
    placed = placed_pod("research", "gpu-1")
    for name in ("statefulset", "replicaset", "job", "replication"):
        user = f"system:serviceaccount:kube-system:{name}-controller"
        assert decide_placed(team_policy, placed, user, ["system:serviceaccounts"]) == []
    # The controls: another account of kube-system, and a team's account of the same name.
    assert decide_placed(team_policy, placed, "system:serviceaccount:kube-system:default") != []
    impostor = "system:serviceaccount:research:statefulset-controller"
    assert decide_placed(team_policy, placed, impostor) != []


@pytest.fixture(scope="module")
def workload_policy(rendered) -> dict:
    return find(
        rendered, files.TEAMS, "ValidatingAdmissionPolicy", "gpuinfra-workload-node-presets"
    )


def workload(kind: str, namespace: str, node: str | None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox"}]}
    if node is not None:
        spec["nodeName"] = node
    template = {"metadata": {}, "spec": spec}
    body = (
        {"jobTemplate": {"spec": {"template": template}}}
        if kind == "CronJob"
        else {"template": template}
    )
    return {"kind": kind, "metadata": {"name": "w", "namespace": namespace}, "spec": body}


def decide_workload(policy, obj: dict, user: str, groups=(), old: dict | None = None):
    namespace = obj["metadata"]["namespace"]
    request = {"namespace": namespace, "operation": "UPDATE" if old else "CREATE",
               "userInfo": {"username": user, "groups": list(groups)}}  # fmt: skip
    return admission(policy, obj, team_namespace(namespace, "research"), request, old)


WORKLOAD_KINDS = ["StatefulSet", "Deployment", "ReplicaSet", "DaemonSet", "Job", "CronJob",
                  "ReplicationController"]  # fmt: skip


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_a_workload_whose_pods_preset_their_node_is_refused(workload_policy, kind):
    failed = decide_workload(workload_policy, workload(kind, "research", "gpu-1"), "alice")
    assert failed == [
        "pod templates in namespace research may not set spec.nodeName: their pods would skip "
        "the scheduler and every taint (preflight, teams)"
    ]
    # The control: the same workload left to the scheduler is admitted.
    assert decide_workload(workload_policy, workload(kind, "research", None), "alice") == []


def test_admins_and_the_controllers_may_preset_a_workloads_node(workload_policy):
    placed = workload("StatefulSet", "research", "cpu-1")
    assert decide_workload(workload_policy, placed, "kubernetes-admin",
                           ["kubeadm:cluster-admins"]) == []  # fmt: skip
    # A Deployment's ReplicaSets and a CronJob's Jobs are made by their controllers.
    replicas = workload("ReplicaSet", "research", "cpu-1")
    deployments = "system:serviceaccount:kube-system:deployment-controller"
    assert decide_workload(workload_policy, replicas, deployments) == []
    jobs = "system:serviceaccount:kube-system:cronjob-controller"
    assert decide_workload(workload_policy, workload("Job", "research", "cpu-1"), jobs) == []
    # The control: the same user in another group is refused.
    assert decide_workload(workload_policy, placed, "kubernetes-admin", ["developers"]) != []


def test_an_update_may_keep_a_preset_node_but_not_set_or_change_one(workload_policy):
    admitted = workload("StatefulSet", "research", "cpu-1")
    # The garbage collector's finalizer, a label: the node as it was.
    gc = "system:serviceaccount:kube-system:generic-garbage-collector"
    assert decide_workload(workload_policy, admitted, gc, old=admitted) == []
    moved = workload("StatefulSet", "research", "gpu-1")
    assert decide_workload(workload_policy, moved, "alice", old=admitted) != []
    unset = workload("StatefulSet", "research", None)
    assert decide_workload(workload_policy, admitted, "alice", old=unset) != []
    assert decide_workload(workload_policy, unset, "alice", old=admitted) == []


def test_the_workload_rule_skips_the_node_agent_namespaces(workload_policy):
    agent = workload("DaemonSet", "kube-system", "gpu-1")
    assert decide_workload(workload_policy, agent, "alice") is None


@pytest.fixture(scope="module")
def preflight_policy(rendered) -> dict:
    return find(
        rendered, files.TEAMS, "ValidatingAdmissionPolicy", "gpuinfra-preflight-tolerations"
    )


PREFLIGHT_TOLERATION = {"key": "gpuinfra.io/preflight", "operator": "Equal", "value": "true",
                        "effect": "NoSchedule"}  # fmt: skip


def decide_preflight(policy, namespace: str, tolerations, account: str | None = None):
    placed = pod(namespace, tolerations)
    if account:
        placed["spec"]["serviceAccountName"] = account
    request = {"namespace": namespace, "operation": "CREATE", "userInfo": {"username": "alice"}}
    return admission(policy, placed, team_namespace(namespace, None), request)


@pytest.mark.parametrize(
    "tolerations",
    [
        [PREFLIGHT_TOLERATION],
        [{"key": "gpuinfra.io/preflight", "operator": "Exists"}],
        [{"operator": "Exists"}],  # every taint, the preflight one included
        [team_toleration("research"), {**PREFLIGHT_TOLERATION, "effect": ""}],
    ],
)
def test_only_the_gpu_health_checks_may_tolerate_the_preflight_taint(preflight_policy, tolerations):
    message = (
        "only the GPU health checks (namespace gpu-health, service accounts "
        "gpu-health-preflight, gpu-health-periodic) may tolerate gpuinfra.io/preflight"
    )
    assert decide_preflight(preflight_policy, "research", tolerations) == [message]
    assert decide_preflight(preflight_policy, "gpu-health", tolerations, "default") == [message]
    assert decide_preflight(preflight_policy, "gpu-health", tolerations, "gpu-health-sampler") != []
    # The controls: the checks themselves, and the same namespace tolerating only its team.
    for account in ("gpu-health-preflight", "gpu-health-periodic"):
        assert decide_preflight(preflight_policy, "gpu-health", tolerations, account) == []
    assert decide_preflight(preflight_policy, "research", [team_toleration("research")]) == []
    assert decide_preflight(preflight_policy, "research", None) == []


def test_every_rendered_pod_passes_the_preflight_policy(rendered, preflight_policy):
    """The node agents (CNI, device plugin, DCGM: the checks need them on a node still under
    preflight), the checks, the sampler and the balloons, as rendered."""
    checked = 0
    for path, obj in objects_in(rendered):
        template = obj.get("spec", {}).get("template") or obj.get("spec", {}).get(
            "jobTemplate", {}).get("spec", {}).get("template")  # fmt: skip
        if not template:
            continue
        namespace = obj["metadata"]["namespace"]
        spec = template["spec"]
        decided = decide_preflight(preflight_policy, namespace, spec.get("tolerations"),
                                   spec.get("serviceAccountName"))  # fmt: skip
        assert decided in ([], None), (path, obj["metadata"].get("name"), decided)
        checked += 1
    periodic = yaml.safe_load(
        find(rendered, "kubernetes/gpu-health.yaml", "ConfigMap")["data"]["periodic-job.yaml"]
    )["spec"]["template"]["spec"]
    assert decide_preflight(preflight_policy, "gpu-health", periodic["tolerations"],
                            periodic["serviceAccountName"]) == []  # fmt: skip
    assert checked >= 5


def test_team_namespaces_carry_the_team_label(rendered):
    namespaces = [obj for path, obj in objects_in(rendered) if path.endswith("teams.yaml")
                  and obj["kind"] == "Namespace"]  # fmt: skip
    assert {ns["metadata"]["name"]: ns["metadata"]["labels"]["gpuinfra.io/team"]
            for ns in namespaces} == {  # fmt: skip
        "research": "research", "research-batch": "research", "inference": "inference"
    }  # fmt: skip


# --- the gpu-health pods' node writes: the guard policy's own CEL ---


@pytest.fixture(scope="module")
def guard(rendered) -> dict:
    return find(rendered, "kubernetes/gpu-health.yaml", "ValidatingAdmissionPolicy")


def gpu_node(name: str, taints: list[dict], unschedulable: bool = False) -> dict:
    spec: dict = {"taints": taints}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": name, "labels": {"gpuinfra.io/gpu-worker": "true"}},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


PREFLIGHT = {"key": "gpuinfra.io/preflight", "value": "true", "effect": "NoSchedule"}
TEAM = {"key": "gpuinfra.io/team", "value": "research", "effect": "NoSchedule"}


def node_write(guard, old, new, account="gpu-health-preflight", on="gpu-1", subresource=""):
    request = {
        "operation": "UPDATE",
        "subResource": subresource,
        "userInfo": {
            "username": f"system:serviceaccount:gpu-health:{account}",
            "extra": {"authentication.kubernetes.io/node-name": [on]},
        },
    }
    return admission(guard, new, None, request, old)


def test_the_guard_admits_lifting_the_preflight_taint_on_the_pods_own_node(guard):
    old = gpu_node("gpu-1", [TEAM, PREFLIGHT])
    assert node_write(guard, old, gpu_node("gpu-1", [TEAM])) == []


def test_the_guard_refuses_removing_any_other_taint(guard):
    old = gpu_node("gpu-1", [TEAM, PREFLIGHT])
    assert node_write(guard, old, gpu_node("gpu-1", [PREFLIGHT])) == [
        "gpu-health pods may only remove the gpuinfra.io/preflight taint"
    ]


def test_the_guard_refuses_writes_to_another_node(guard):
    old = gpu_node("gpu-2", [PREFLIGHT])
    assert node_write(guard, old, gpu_node("gpu-2", []), on="gpu-1") == [
        "gpu-health pods may only write the node they run on"
    ]


def test_only_the_periodic_check_may_cordon(guard):
    old, new = gpu_node("gpu-1", []), gpu_node("gpu-1", [], unschedulable=True)
    assert node_write(guard, old, new, account="gpu-health-periodic") == []
    assert node_write(guard, old, new, account="gpu-health-preflight") == [
        "only the periodic check may cordon, and none may uncordon"
    ]
    assert node_write(guard, new, old, account="gpu-health-periodic") != []


def test_the_guard_allows_only_the_gpu_health_condition(guard):
    old = gpu_node("gpu-1", [])
    ours = gpu_node("gpu-1", [])
    ours["status"]["conditions"].append({"type": "GPUHealthy", "status": "False"})
    assert node_write(guard, old, ours, subresource="status") == []
    theirs = gpu_node("gpu-1", [])
    theirs["status"]["conditions"][0]["status"] = "False"
    assert node_write(guard, old, theirs, subresource="status") == [
        "gpu-health pods may only set the GPUHealthy condition"
    ]


def test_the_guard_ignores_everyone_else(guard):
    request = {"operation": "UPDATE", "subResource": "", "userInfo": {"username": "kubelet"}}
    old = gpu_node("gpu-1", [PREFLIGHT])
    assert admission(guard, gpu_node("gpu-1", []), None, request, old) is None


# --- balloons ---


def test_balloon_priority_is_below_zero_and_above_the_autoscaler_cutoff(rendered):
    priority = find(rendered, files.BALLOONS, "PriorityClass")
    assert -10 < priority["value"] < 0
    assert priority["preemptionPolicy"] == "Never" and priority["globalDefault"] is False
    for value in (-10, 0, 5):
        with pytest.raises(ValueError):
            FleetPolicyConfig(balloon_priority=value)


def test_a_gpu_balloon_pool_sits_on_its_teams_gpu_nodes(rendered):
    deployment = find(rendered, files.BALLOONS, "Deployment", "balloon-research-gpu")
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1
    assert spec["priorityClassName"] == "gpuinfra-balloon"
    assert spec["nodeSelector"] == {
        "gpuinfra.io/gpu-worker": "true",
        "gpuinfra.io/team": "research",
    }
    assert spec["tolerations"] == [team_toleration("research")]
    resources = spec["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    assert resources["limits"]["nvidia.com/gpu"] == 8


def write_cluster(tmp_path: Path, text: str) -> Path:
    base = (SAMPLE / "cluster.yml").read_text()
    path = tmp_path / "cluster.yml"
    path.write_text(base + text)
    return path


def test_a_balloon_pool_of_an_unknown_team_is_refused_with_its_line(tmp_path):
    text = (SAMPLE / "cluster.yml").read_text().replace("team: research", "team: reserch")
    path = tmp_path / "cluster.yml"
    path.write_text(text)
    with pytest.raises(InventoryInvalid) as caught:
        load(path)
    (error,) = caught.value.errors
    line = text.splitlines().index("          team: reserch") + 1
    assert str(error).endswith(
        f"cluster.yml:{line}: group_vars.all.fleet_policy.balloons.research-gpu.team: "
        "unknown team reserch (teams: research, inference)"
    )


def test_a_bad_balloon_quantity_is_refused_at_load_with_its_line(tmp_path):
    text = (SAMPLE / "cluster.yml").read_text().replace("memory: 1Gi", "memory: lots")
    path = tmp_path / "cluster.yml"
    path.write_text(text)
    (error,) = errors_of(path)
    line = text.splitlines().index("          memory: lots") + 1
    assert error.startswith(f":{line}: group_vars.all.fleet_policy.balloons.research-gpu.memory:")


# --- teams in the inventory ---


def sample_with_teams(tmp_path: Path, teams: str) -> Path:
    """The sample with its teams replaced; research (which its balloon pool names) stays."""
    text = (SAMPLE / "cluster.yml").read_text()
    head = text[: text.index("teams:")]
    teams = teams.replace("teams:\n", "teams:\n  research:\n    hosts: [gpu-4]\n", 1)
    path = tmp_path / "cluster.yml"
    path.write_text(head + teams + text[text.index("\nhosts:") :])
    return path


def errors_of(path: Path) -> list[str]:
    with pytest.raises(InventoryInvalid) as caught:
        load(path)
    return [str(error).split("cluster.yml", 1)[1] for error in caught.value.errors]


def test_team_of_reads_hosts_and_groups(tmp_path):
    loaded = load(SAMPLE)
    assert team_of(loaded.cluster, "gpu-1") == "research"
    assert team_of(loaded.cluster, "gpu-6") == "inference"
    assert team_of(loaded.cluster, "gpu-8") is None
    path = sample_with_teams(tmp_path, "teams:\n  ops:\n    groups: [cpu_worker]\n")
    cluster = load(path).cluster
    assert team_of(cluster, "cpu-2") == "ops" and team_of(cluster, "gpu-1") is None


def test_a_host_in_two_teams_is_refused_with_its_line(tmp_path):
    teams = "teams:\n  a:\n    hosts: [gpu-1]\n  b:\n    hosts:\n      - gpu-2\n      - gpu-1\n"
    path = sample_with_teams(tmp_path, teams)
    line = path.read_text().splitlines().index("      - gpu-1") + 1
    assert errors_of(path) == [
        f":{line}: teams.b.hosts.1: gpu-1 is already in team a: a host has one team"
    ]


def test_unknown_hosts_and_groups_are_refused(tmp_path):
    teams = "teams:\n  a:\n    hosts: [gpu-99]\n    groups: [dns, loadbalancer]\n"
    path = sample_with_teams(tmp_path, teams)
    line = path.read_text().splitlines().index("    hosts: [gpu-99]") + 1
    errors = errors_of(path)
    assert f":{line}: teams.a.hosts.0: unknown host gpu-99" in errors
    # dns hosts exist but are not workers: a team taint there would mean nothing.
    assert any("teams.a.groups.0: dns-1 is not a worker" in e for e in errors)


def test_a_namespace_in_two_teams_is_refused(tmp_path):
    teams = "teams:\n  a:\n    hosts: [gpu-1]\n  b:\n    hosts: [gpu-2]\n    namespaces: [a]\n"
    errors = errors_of(sample_with_teams(tmp_path, teams))
    assert (
        len(errors) == 1
        and "teams.b.namespaces.0: namespace a already belongs to team a" in errors[0]
    )


def test_node_placement_gives_the_kubernetes_role_labels_and_taints(rendered):
    placement = yaml.safe_load((rendered / files.NODES).read_text())["hosts"]
    assert placement["gpu-1"] == {
        "labels": {
            "gpuinfra.io/gpu-worker": "true",
            "gpuinfra.io/team": "research",
            # Ubuntu with NVIDIA's repository: the container toolkit, hence the runtime.
            "gpuinfra.io/nvidia-runtime": "true",
        },
        "taints": ["gpuinfra.io/preflight=true:NoSchedule", "gpuinfra.io/team=research:NoSchedule"],
    }
    assert placement["gpu-8"]["taints"] == ["gpuinfra.io/preflight=true:NoSchedule"]
    assert "cpu-1" not in placement and "cp-1" not in placement
    cluster = load(SAMPLE).cluster
    assert fleet_policy.node_taints(cluster, "gpu-5") == ["gpuinfra.io/team=inference:NoSchedule"]
    assert fleet_policy.node_labels(cluster, "gpu-8") == {}


# --- gang scheduling ---


def test_gang_scheduling_is_in_tree_from_the_sources_of_kubernetes_1_35_and_1_36():
    assert (
        gang.in_tree_gang("1.35.4")
        == gang.in_tree_gang("v1.35.0")
        == gang.InTreeGang(
            workload_api="scheduling.k8s.io/v1alpha1",
            api_server_gates=("GenericWorkload",),
            scheduler_gates=("GenericWorkload", "GangScheduling"),
        )
    )
    assert gang.in_tree_gang("1.36.3") == gang.InTreeGang(
        workload_api="scheduling.k8s.io/v1alpha2",
        api_server_gates=("GenericWorkload",),
        scheduler_gates=("GenericWorkload", "GangScheduling"),
        controller_manager_gates=("GenericWorkload",),
    )
    for other in ("1.34.2", "v1.37.2"):
        with pytest.raises(gang.UnsupportedKubernetes, match="for Kubernetes 1.35, 1.36 only"):
            gang.in_tree_gang(other)


def test_on_1_36_the_controller_manager_gets_the_workload_gate(small_cluster, load_small):
    """1.36's API server stamps a finalizer on every PodGroup; the controller manager's
    podgroup-protection controller, on only with GenericWorkload, removes it."""
    small_cluster["versions"] = {**small_cluster.get("versions", {}), "kubernetes": "1.36.3"}
    loaded = load_small()
    section = files.scheduler_files(loaded).controller_manager
    assert section == {"extraArgs": [{"name": "feature-gates", "value": "GenericWorkload=true"}]}


def test_the_api_server_and_the_scheduler_get_the_gates_the_scheduler_no_image_patch(rendered):
    kubeadm = yaml.safe_load((rendered / files.KUBEADM_CLUSTER_CONFIGURATION).read_text())
    assert kubeadm["apiServer"]["extraArgs"] == [
        {"name": "feature-gates", "value": "GenericWorkload=true"},
        {"name": "runtime-config", "value": "scheduling.k8s.io/v1alpha1=true"},
    ]
    path = FleetPolicyConfig().scheduler_config_path
    assert kubeadm["scheduler"]["extraArgs"] == [
        {"name": "config", "value": path},
        {"name": "feature-gates", "value": "GenericWorkload=true,GangScheduling=true"},
    ]
    assert kubeadm["scheduler"]["extraVolumes"][0]["hostPath"] == path
    # Only the API server and the scheduler: kube-controller-manager reads neither gate, and
    # nothing changes the scheduler's image (no kubeadm patch, the upstream kube-scheduler).
    assert set(kubeadm) == {"apiVersion", "kind", "apiServer", "scheduler"}
    assert not [p for p in rendered.rglob("*") if "strategic" in p.name]


def test_the_scheduler_runs_the_default_profile_with_no_out_of_tree_plugin(rendered):
    text = (rendered / files.SCHEDULER_CONFIG).read_text()
    config = yaml.safe_load(text)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    # No plugins named: with GangScheduling on, the default profile already holds the plugin.
    assert config["profiles"] == [{"schedulerName": "default-scheduler"}]
    assert "Coscheduling" not in text and "pluginConfig" not in text
    assert config["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"
    assert config["enableProfiling"] is False


def test_a_kubernetes_minor_without_in_tree_gang_settings_is_refused_at_load(tmp_path):
    text = (SAMPLE / "cluster.yml").read_text().replace("kubernetes: 1.35.4", "kubernetes: 1.31.4")
    path = tmp_path / "cluster.yml"
    path.write_text(text)
    # The supported range first (the kubernetes role's check), then what gang scheduling lacks.
    supported, error = errors_of(path)
    assert "versions.kubernetes: gpuinfra supports Kubernetes 1.35 to 1.36, not 1.31" in supported
    assert "versions.kubernetes: gang scheduling is set up for Kubernetes 1.35, 1.36 only" in error
    assert error.endswith("not 1.31")


def test_the_coscheduling_settings_are_gone_from_the_inventory():
    for removed in ("scheduler_plugins_version", "coscheduling_permit_wait_s"):
        with pytest.raises(ValueError, match="Extra inputs are not permitted"):
            FleetPolicyConfig.model_validate({removed: "v0.31.8"})


# --- GPU metrics ---


def relabel(name: str, rules: list[dict]) -> bool:
    """Prometheus metric_relabel keep/drop on __name__: the regex is anchored at both ends."""
    for rule in rules:
        matched = re.fullmatch(f"(?:{rule['regex']})", name) is not None
        if (rule["action"] == "keep") != matched:
            return False
    return True


def sample_series() -> list[str]:
    """Metric names of every series in the hand-written dcgm-exporter /metrics sample."""
    lines = DCGM_SAMPLE.read_text().splitlines()
    return [line.split("{", 1)[0] for line in lines if line and not line.startswith("#")]


def loaded_scrape_jobs(rendered: Path) -> dict[str, dict]:
    """The scrape jobs of the Prometheus configuration the monitoring host loads."""
    config = rendered.parent / "mon-1" / "etc" / "prometheus" / "prometheus.yml"
    return {job["job_name"]: job for job in yaml.safe_load(config.read_text())["scrape_configs"]}


def test_the_loaded_dcgm_scrape_job_keeps_only_the_used_series(rendered):
    """The keep-list reaches the prometheus.yml that Prometheus reads (it once went to a file
    under _cluster/ that nothing loaded)."""
    jobs = loaded_scrape_jobs(rendered)
    rules = jobs["dcgm"]["metric_relabel_configs"]
    series = sample_series()
    kept = [name for name in series if relabel(name, rules)]
    assert len(series) == 48  # 24 fields of the default counter set x 2 GPUs
    assert len(kept) == 26  # 13 fields x 2 GPUs
    assert sorted(set(kept)) == sorted(FleetPolicyConfig().dcgm_keep_metrics)
    dropped = set(series) - set(kept)
    assert "DCGM_FI_DEV_ENC_UTIL" in dropped and "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in dropped
    targets = [t["targets"][0] for t in jobs["dcgm"]["static_configs"]]
    assert targets[0] == "gpu-1.sample.gpu.internal:9400" and len(targets) == 8


def test_the_keep_list_is_the_inventorys(tmp_path):
    """A keep-list set in the inventory is the one in the loaded configuration (and the
    default's series are then dropped): a positive control for the test above."""
    data = yaml.safe_load((SAMPLE / "cluster.yml").read_text())
    data["group_vars"]["all"].setdefault("fleet_policy", {})["dcgm_keep_metrics"] = [
        "DCGM_FI_DEV_GPU_TEMP"
    ]
    (tmp_path / "cluster.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["render", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rules = loaded_scrape_jobs(out / "_cluster")["dcgm"]["metric_relabel_configs"]
    assert relabel("DCGM_FI_DEV_GPU_TEMP", rules)
    assert not relabel("DCGM_FI_DEV_GPU_UTIL", rules)


def test_the_loaded_etcd_job_drops_its_debugging_series(rendered):
    etcd = loaded_scrape_jobs(rendered)["etcd"]["metric_relabel_configs"]
    assert not relabel("etcd_debugging_mvcc_keys_total", etcd)
    assert relabel("etcd_disk_wal_fsync_duration_seconds_bucket", etcd)


def test_no_fleet_scrape_fragment_that_nothing_loads(rendered):
    assert not (rendered / "prometheus").exists()


def test_gpu_daemonsets_are_pinned_and_land_on_every_gpu_worker_with_the_runtime(rendered):
    for name in ("nvidia-device-plugin", "dcgm-exporter"):
        spec = find(rendered, files.GPU_METRICS, "DaemonSet", name)["spec"]["template"]["spec"]
        image = spec["containers"][0]["image"]
        assert re.search(r":v?\d+\.\d+\.\d+", image) and not image.endswith(":latest")
        assert spec["nodeSelector"] == {
            "gpuinfra.io/gpu-worker": "true",
            "gpuinfra.io/nvidia-runtime": "true",
        }
        assert {"operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["runtimeClassName"] == "nvidia"


# --- the role record ---


def test_the_role_record_has_no_host_phases_and_is_registered():
    assert ROLE.name == "fleet_policy" and ROLE.phases == () and ROLE.groups == ()
    assert ROLE.config is FleetPolicyConfig is ROLE_CONFIGS["fleet_policy"]
    assert ROLES_BY_NAME["fleet_policy"] is ROLE
    loaded = load(SAMPLE)
    rendered = every_cluster_file(loaded)
    assert all(rendered[path] == text for path, text in ROLE.cluster_files(loaded).items())
    assert list(ROLE.checks(loaded, loaded.settings)) == []


def test_validate_reports_a_host_in_two_teams_on_one_line_with_exit_2(tmp_path):
    teams = "teams:\n  a:\n    hosts: [gpu-1]\n  b:\n    hosts: [gpu-1]\n"
    path = sample_with_teams(tmp_path, teams)
    result = CliRunner().invoke(app, ["inventory", "validate", str(path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "teams.b.hosts.0: gpu-1 is already in team a" in lines[0]
    assert "Traceback" not in result.output


def test_a_gpu_worker_without_the_container_toolkit_gets_no_runtime_label(tmp_path):
    """Debian's own packages have no container toolkit (NVIDIA's repository only): its GPU
    workers register without the runtime label, so the DaemonSets that need the runtime pass
    them by instead of waiting in ContainerCreating for ever (the lab's gpu-1)."""
    data = yaml.safe_load((SAMPLE / "cluster.yml").read_text())
    data["os"] = "debian-13"
    (tmp_path / "cluster.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    placement = files.node_placement(load(tmp_path))["hosts"]
    assert placement["gpu-1"]["labels"] == {
        "gpuinfra.io/gpu-worker": "true",
        "gpuinfra.io/team": "research",
    }
