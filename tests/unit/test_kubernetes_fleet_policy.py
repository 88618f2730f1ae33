"""How the kubernetes role applies the fleet policy, offline: team labels and taints in kubelet's
registration, in-tree gang scheduling wired into kubeadm (the scheduler's configuration file and
volume, feature gates on the API server and the scheduler, the Workload API served, no image
patch), and every role's cluster objects placed in apply stages and applied server-side, CRDs
first, only when a file or a live object differs (the operation against facts keyed by their
arguments)."""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import pytest
import yaml
from pyinfra.facts.files import Sha1File

from engine.context import cluster_files, host_context
from roles.fleet_policy import files as fleet_files
from roles.kubernetes import operations as kube_ops
from roles.kubernetes.coredns import COREDNS_PATCH
from roles.kubernetes.facts import DIFF_LINES, ApiAnswers, LiveObjectsDiffer
from roles.kubernetes.files import managed_files
from roles.kubernetes.kubeadm import (
    ADMIN_CONF,
    INIT_CONFIG,
    JOIN_CONFIG,
    KUBELET_PATCH,
    PATCHES_DIR,
)
from roles.kubernetes.stages import CLUSTER_OBJECTS_DIR, ApplyStage, apply_stages, cluster_objects
from tests.helpers import files_of as shared_files_of
from tests.unit.fake_host import KeyedHost, keyed_host

TEAM = "research"


@pytest.fixture
def loaded(small_cluster, load_small):
    small_cluster["teams"] = {TEAM: {"hosts": ["gpu-1"]}}
    return load_small()


files_of = functools.partial(shared_files_of, role="kubernetes")


def kubeadm_documents(text: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


def registration(loaded, name: str, path: str) -> tuple[list[dict] | None, dict[str, str]]:
    """A node's registration taints and kubelet labels, from its placed kubeadm file."""
    docs = kubeadm_documents(files_of(loaded, name)[path])
    kind = "InitConfiguration" if "InitConfiguration" in docs else "JoinConfiguration"
    node = docs[kind]["nodeRegistration"]
    extra = {arg["name"]: arg["value"] for arg in node["kubeletExtraArgs"]}
    labels = dict(item.split("=", 1) for item in extra.get("node-labels", "").split(",") if item)
    return node.get("taints"), labels


# ---------------------------------------------------------------- teams at registration


def test_a_team_worker_registers_with_its_team_label_and_taint_a_teamless_one_without(loaded):
    taints, labels = registration(loaded, "gpu-1", JOIN_CONFIG)
    team_taint = {"key": "gpuinfra.io/team", "value": TEAM, "effect": "NoSchedule"}
    preflight = {"key": "gpuinfra.io/preflight", "value": "true", "effect": "NoSchedule"}
    assert taints == [preflight, team_taint]
    assert labels["gpuinfra.io/team"] == TEAM

    taints, labels = registration(loaded, "cpu-1", JOIN_CONFIG)  # in no team
    assert taints == [] and "gpuinfra.io/team" not in labels
    # The first control-plane node keeps kubeadm's own taint (none given) and no team label.
    taints, labels = registration(loaded, "cp-1", INIT_CONFIG)
    assert taints is None and "gpuinfra.io/team" not in labels


def test_a_cpu_worker_of_a_team_is_tainted_by_the_team_only(small_cluster, load_small):
    small_cluster["teams"] = {"inference": {"hosts": ["cpu-1"]}}
    loaded = load_small()
    taints, labels = registration(loaded, "cpu-1", JOIN_CONFIG)
    assert taints == [{"key": "gpuinfra.io/team", "value": "inference", "effect": "NoSchedule"}]
    assert labels == {"gpuinfra.io/team": "inference"}


def test_registration_agrees_with_the_fleet_policys_nodes_file(loaded):
    """The kubelet registration and _cluster/fleet-policy/nodes.yaml say the same per node."""
    placement = yaml.safe_load(cluster_files(loaded)[fleet_files.NODES])["hosts"]
    taints, labels = registration(loaded, "gpu-1", JOIN_CONFIG)
    as_flags = [f"{t['key']}={t['value']}:{t['effect']}" for t in taints]
    assert as_flags == placement["gpu-1"]["taints"]
    assert placement["gpu-1"]["labels"].items() <= labels.items()


# ---------------------------------------------------------------- the scheduler


def test_every_control_plane_node_gets_the_scheduler_configuration_and_no_image_patch(loaded):
    rendered = cluster_files(loaded)
    config_path = fleet_files.fleet_config(loaded).scheduler_config_path
    for node in ("cp-1", "cp-2"):
        placed = files_of(loaded, node)
        assert placed[config_path] == rendered[fleet_files.SCHEDULER_CONFIG]
        # kubeadm applies every file of the patches directory: the kubelet's and CoreDNS's are
        # the only ones, so the static kube-scheduler pod keeps kubeadm's upstream image.
        patches = [path for path in placed if path.startswith(PATCHES_DIR + "/")]
        assert patches == [KUBELET_PATCH, COREDNS_PATCH]
    for node in ("gpu-1", "cpu-1"):
        assert config_path not in files_of(loaded, node)
    # kubeadm reads that directory because its init and join files name it.
    init = kubeadm_documents(files_of(loaded, "cp-1")[INIT_CONFIG])["InitConfiguration"]
    assert init["patches"]["directory"] == PATCHES_DIR
    join = kubeadm_documents(files_of(loaded, "cp-2")[JOIN_CONFIG])["JoinConfiguration"]
    assert join["patches"]["directory"] == PATCHES_DIR


def flags(component: dict) -> dict[str, str]:
    return {arg["name"]: arg["value"] for arg in component.get("extraArgs", [])}


def test_cluster_configuration_gates_gang_scheduling_on_the_api_server_and_the_scheduler(loaded):
    path = fleet_files.fleet_config(loaded).scheduler_config_path
    docs = kubeadm_documents(files_of(loaded, "cp-1")[INIT_CONFIG])
    cluster = docs["ClusterConfiguration"]
    scheduler = cluster["scheduler"]
    assert scheduler["extraArgs"] == [
        {"name": "config", "value": path},
        {"name": "feature-gates", "value": "GenericWorkload=true,GangScheduling=true"},
        # Prometheus reads its /metrics (tests/unit/test_monitoring_kubernetes.py).
        {"name": "bind-address", "value": "0.0.0.0"},
    ]
    assert scheduler["extraVolumes"] == [
        {
            "name": "gpuinfra-scheduler-config",
            "hostPath": path,
            "mountPath": path,
            "readOnly": True,
            "pathType": "File",
        }
    ]
    api_server = flags(cluster["apiServer"])
    assert api_server["feature-gates"] == "GenericWorkload=true"
    assert api_server["runtime-config"] == "scheduling.k8s.io/v1alpha1=true"
    assert api_server["audit-policy-file"]  # added to the role's own flags, not instead of them
    assert "feature-gates" not in flags(cluster["controllerManager"])
    # The flags kube-scheduler ignores with --config are settings of the file instead.
    config = yaml.safe_load(files_of(loaded, "cp-1")[path])
    assert config["clientConnection"]["qps"] == 100 and config["clientConnection"]["burst"] == 200
    assert config["enableProfiling"] is False


def test_the_init_file_says_why_each_gang_flag_is_set(loaded):
    header = [
        line
        for line in files_of(loaded, "cp-1")[INIT_CONFIG].splitlines()
        if line.startswith("#   ")
    ]
    why = {line.split(":", 1)[0].strip("# "): line.split(":", 1)[1] for line in header}
    assert "Workload API" in why["kube-apiserver --feature-gates"]
    assert "not served by default" in why["kube-apiserver --runtime-config"]
    assert "GangScheduling" in why["kube-scheduler --feature-gates"]
    assert "Coscheduling" not in "\n".join(header)


# ---------------------------------------------------------------- the cluster objects


WIDGET_CRD_NAME = "widgets.example.com"
WIDGET_CRD = f"""\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {WIDGET_CRD_NAME}
spec:
  group: example.com
  names: {{kind: Widget, plural: widgets}}
  scope: Namespaced
  versions:
    - {{name: v1, served: true, storage: true, schema: {{openAPIV3Schema: {{type: object}}}}}}
"""


def with_a_crd(rendered: dict[str, str]) -> dict[str, str]:
    """The cluster's files and one CRD, so the CRD stage (and its wait) is exercised."""
    return {**rendered, "kubernetes/example/widgets.yaml": WIDGET_CRD}


def object_names(stage: ApplyStage) -> list[str]:
    return [f"{doc['kind']}/{doc['metadata']['name']}" for doc in yaml.safe_load_all(stage.content)]


def test_stages_hold_every_object_once_crds_first_then_namespaces(loaded):
    rendered = with_a_crd(cluster_files(loaded))
    stages = apply_stages(rendered)
    assert [s.path for s in stages] == [
        f"{CLUSTER_OBJECTS_DIR}/00-crds.yaml",
        f"{CLUSTER_OBJECTS_DIR}/10-namespaces.yaml",
        f"{CLUSTER_OBJECTS_DIR}/20-objects.yaml",
    ]
    # The sample's roles render no CRD (gang scheduling's Workload is a built-in kind): the one
    # in the first stage is the test's own.
    assert object_names(stages[0]) == [f"CustomResourceDefinition/{WIDGET_CRD_NAME}"]
    assert stages[0].crds and not any(stage.crds for stage in stages[1:])
    assert {name.split("/")[0] for name in object_names(stages[1])} == {"Namespace"}
    assert not any(
        name.split("/")[0] in ("Namespace", "CustomResourceDefinition")
        for name in object_names(stages[2])
    )
    staged = [doc for stage in stages for doc in yaml.safe_load_all(stage.content)]
    wanted = [obj for _, obj in cluster_objects(rendered)]
    assert sorted(map(repr, staged)) == sorted(map(repr, wanted))
    # Every Kubernetes object under _cluster/ but Calico's, which the Calico step applies after
    # the upstream manifest that defines its kinds.
    sources = {path for path in rendered if path.startswith("kubernetes/")}
    assert {path for path, _ in cluster_objects(rendered)} == sources - {
        "kubernetes/calico/calico-config.yaml",
        "kubernetes/calico/calico-resources.yaml",
    }
    assert "kubernetes/fleet-policy/teams.yaml" in sources
    assert "kubernetes/gpu-health.yaml" in sources


def test_stages_are_placed_on_every_control_plane_node_0600_and_only_there(loaded):
    stages = apply_stages(cluster_files(loaded))
    for node in ("cp-1", "cp-2"):
        placed = {f.path: f for f in managed_files(host_context(loaded, node))}
        for stage in stages:
            assert placed[stage.path].content == stage.content
            assert placed[stage.path].mode == "0600"
    assert not any(path.startswith(CLUSTER_OBJECTS_DIR) for path in files_of(loaded, "gpu-1"))


def test_a_secret_among_the_objects_makes_its_stage_secret():
    rendered = {
        "kubernetes/x.yaml": yaml.safe_dump_all(
            [
                {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}},
            ]
        )
    }
    stages = {stage.path.rsplit("/", 1)[1]: stage for stage in apply_stages(rendered)}
    assert stages["20-objects.yaml"].secret and not stages["10-namespaces.yaml"].secret
    assert "00-crds.yaml" not in stages  # no empty stage


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def placed_facts(stages: list[ApplyStage], healthy: bool, live: str) -> dict[tuple, Any]:
    """The facts of placed stages; `live` is LiveObjectsDiffer's status."""
    facts: dict[tuple, Any] = {
        (Sha1File, (("path", stage.path),)): sha1(stage.content) for stage in stages
    }
    facts[(ApiAnswers, (("kubeconfig", ADMIN_CONF),))] = {"kubeconfig": True, "healthy": healthy}
    paths = tuple(stage.path for stage in stages)
    facts[
        (
            LiveObjectsDiffer,
            (("field_manager", "gpuinfra"), ("kubeconfig", ADMIN_CONF), ("paths", paths)),
        )
    ] = {"status": live, "differences": DIFFERENCES if live == "differs" else []}
    return facts


DIFFERENCES = ["PriorityClass gpuinfra-balloon: live: description: edited by hand"]


def run(facts: dict[tuple, Any], first: bool, stages: list[ApplyStage]) -> tuple[list, KeyedHost]:
    with keyed_host(facts) as host:
        done = [
            str(c)
            for c in kube_ops.cluster_objects_applied._inner(
                first=first, stages=stages, timeout_s=300
            )
        ]
    return done, host


SSA = (
    "kubectl --kubeconfig /etc/kubernetes/admin.conf apply --server-side "
    "--field-manager=gpuinfra --force-conflicts -f "
)


def test_apply_runs_server_side_per_stage_crds_first_and_waits_for_them(loaded):
    stages = apply_stages(with_a_crd(cluster_files(loaded)))
    facts = placed_facts(stages, healthy=True, live="same")
    facts[(Sha1File, (("path", stages[2].path),))] = "0" * 40  # a file about to change
    done, host = run(facts, True, stages)
    assert done == [
        SSA + f"{CLUSTER_OBJECTS_DIR}/00-crds.yaml",
        "kubectl --kubeconfig /etc/kubernetes/admin.conf wait --for condition=established "
        f"--timeout=300s -f {CLUSTER_OBJECTS_DIR}/00-crds.yaml",
        SSA + f"{CLUSTER_OBJECTS_DIR}/10-namespaces.yaml",
        SSA + f"{CLUSTER_OBJECTS_DIR}/20-objects.yaml",
    ]
    assert not any(key[0] is LiveObjectsDiffer for key in host.asked)  # no need to ask the API


def test_apply_is_a_noop_when_files_and_live_objects_match_and_runs_when_live_ones_differ(
    loaded,
):
    stages = apply_stages(with_a_crd(cluster_files(loaded)))
    done, host = run(placed_facts(stages, healthy=True, live="same"), True, stages)
    assert done == [] and host.noops
    assert any(key[0] is LiveObjectsDiffer for key in host.asked)
    for live in ("differs", "failed"):  # edited or deleted by hand; a kind not served yet
        done, host = run(placed_facts(stages, healthy=True, live=live), True, stages)
        assert len(done) == 4 and all(c.startswith("kubectl") for c in done)
        # What differs is named in the report (the drift's host notes), object and field.
        named = [f"live object differs from the files: {DIFFERENCES[0]}"]
        assert [n for n in host.noops if "differs" in n] == (named if live == "differs" else [])
    # No API to ask (kubeadm init runs first in this very run): apply after it.
    done, _ = run(placed_facts(stages, healthy=False, live="same"), True, stages)
    assert len(done) == 4


def test_apply_runs_on_the_first_control_plane_node_only(loaded):
    stages = apply_stages(cluster_files(loaded))
    done, host = run({}, False, stages)
    assert done == [] and host.asked == [] and host.noops


def test_live_objects_fact_reads_kubectl_diffs_status_and_names_what_differs():
    fact = LiveObjectsDiffer()
    command = fact.command(ADMIN_CONF, ("/a b.yaml", "/c.yaml"), "gpuinfra")
    assert command.startswith(
        "out=$(kubectl --kubeconfig /etc/kubernetes/admin.conf --request-timeout=30s diff "
        "--server-side --field-manager=gpuinfra --force-conflicts -f '/a b.yaml' -f /c.yaml"
    )
    # Only changed lines leave the node, a bounded number, and none of a Secret's.
    assert "[/.]v1[.]Secret[.]" in command and f"head -n {DIFF_LINES}" in command
    assert [fact.process([f"exit={rc}"])["status"] for rc in ("0", "1", "2", "")] == [
        "same",
        "differs",
        "failed",
        "failed",
    ]
    assert fact.process([])["status"] == "failed"
    answer = fact.process(
        [
            "diff -u -N /tmp/LIVE-1/scheduling.k8s.io.v1.PriorityClass..gpuinfra-balloon "
            "/tmp/MERGED-1/scheduling.k8s.io.v1.PriorityClass..gpuinfra-balloon",
            "-description: edited by hand",
            "+description: Placeholder pods",
            "-  generation: 2",
            "+  generation: 3",
            "diff -u -N /tmp/LIVE-1/apps.v1.Deployment.team-a.balloon "
            "/tmp/MERGED-1/apps.v1.Deployment.team-a.balloon",
            "-  replicas: 5",
            "+  replicas: 1",
            "diff -u -N /tmp/LIVE-1/v1.Secret.gpuinfra.key /tmp/MERGED-1/v1.Secret.gpuinfra.key",
            "-  key: c2VjcmV0",
            "exit=1",
        ]
    )
    assert answer == {
        "status": "differs",
        "differences": [
            "PriorityClass gpuinfra-balloon: live: description: edited by hand; "
            "files: description: Placeholder pods",
            "Deployment team-a/balloon: live: replicas: 5; files: replicas: 1",
            "Secret gpuinfra/key: data differs (not shown)",
        ],
    }
