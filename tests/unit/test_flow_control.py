"""API Priority and Fairness for gpuinfra's own clients (roles/fleet_policy, flow-control.yaml):
the priority level and flow schema render for the sample inventory, pass the flowcontrol v1
schema, rank below every schema Kubernetes installs for its own components, and match exactly
the accounts the pods of our manifests run as: the manifests are rendered (the cluster files,
the drift and rollout Jobs as their flows publish them), never listed by hand."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from day2 import fleetjob, rolloutjob
from engine.context import cluster_files, load
from engine.reports import Mode, RunOptions
from inventory.model import StateAccess
from roles.drift_job.files import KEY as DRIFT_KEY
from roles.drift_job.files import MANIFEST as DRIFT_MANIFEST
from roles.fleet_policy import files
from roles.fleet_policy.config import FlowControl
from roles.fleet_policy.schemas import documents, validate_objects
from roles.kubernetes.cni import CALICO_PREFIX
from roles.rollout_job import role as rollout_role
from roles.rollout_job.files import KEY as ROLLOUT_KEY
from tests.unit.test_fleet_job import KEY_LINE, Exact, job_run, keep_records
from tests.unit.test_fleet_job import Kubectl as DriftKubectl
from tests.unit.test_rollout_job import Kubectl as RolloutKubectl

SAMPLE = Path(__file__).resolve().parents[2] / "inventory" / "sample"
KUBERNETES = "1.35.4"
# The matching precedence of every FlowSchema the API server installs itself (mandatory and
# suggested; k8s.io/apiserver pkg/apis/flowcontrol/bootstrap/default.go, Kubernetes 1.35).
SYSTEM_SCHEMAS = {
    "exempt": 1,
    "probes": 2,
    "system-leader-election": 100,
    "endpoint-controller": 150,
    "workload-leader-election": 200,
    "system-node-high": 400,
    "system-nodes": 500,
    "kube-controller-manager": 800,
    "kube-scheduler": 800,
    "kube-system-service-accounts": 900,
}
# The suggested schema that takes every service account not matched before it (workload-low).
SERVICE_ACCOUNTS_SCHEMA = 9000
# The drift Job in a namespace of its own, so the subjects are seen to follow the settings.
DRIFT_NAMESPACE = "gpuinfra-drift-ns"


def flow_objects(rendered: dict[str, str]) -> tuple[dict, dict]:
    """The priority level and the flow schema of flow-control.yaml."""
    objects = {obj["kind"]: obj for obj in documents(rendered[files.FLOW_CONTROL])}
    assert set(objects) == {"PriorityLevelConfiguration", "FlowSchema"}
    return objects["PriorityLevelConfiguration"], objects["FlowSchema"]


def subjects_of(schema: dict) -> list[tuple[str, str]]:
    rules = schema["spec"]["rules"]
    assert len(rules) == 1
    found = []
    for subject in rules[0]["subjects"]:
        assert subject["kind"] == "ServiceAccount", subject
        account = subject["serviceAccount"]
        found.append((account["namespace"], account["name"]))
    return found


@pytest.fixture(scope="module")
def sample() -> dict[str, str]:
    return cluster_files(load(SAMPLE))


def test_the_sample_renders_a_limited_level_and_a_schema_that_uses_it(sample):
    level, schema = flow_objects(sample)
    assert level["metadata"]["name"] == schema["metadata"]["name"] == "gpuinfra-fleet-jobs"
    assert schema["spec"]["priorityLevelConfiguration"] == {"name": "gpuinfra-fleet-jobs"}
    assert schema["spec"]["distinguisherMethod"] == {"type": "ByUser"}
    limited = level["spec"]["limited"]
    assert level["spec"]["type"] == "Limited"
    assert limited["limitResponse"]["type"] == "Queue"
    queuing = limited["limitResponse"]["queuing"]
    assert 0 < queuing["handSize"] <= queuing["queues"] and queuing["queueLengthLimit"] > 0
    # Modest: global-default's share, never more than it owns, half of it lent while idle.
    assert limited["nominalConcurrencyShares"] <= 20
    assert limited["borrowingLimitPercent"] == 0 and 0 < limited["lendablePercent"] <= 50
    # The kubernetes role applies and drift compares everything under kubernetes/.
    assert files.FLOW_CONTROL.startswith("kubernetes/")


def test_dormant_jobs_add_no_subject(sample):
    """The sample enables neither Job: only the GPU health accounts are matched."""
    _, schema = flow_objects(sample)
    assert subjects_of(schema) == [
        ("gpu-health", "gpu-health-periodic"),
        ("gpu-health", "gpu-health-preflight"),
        ("gpu-health", "gpu-health-sampler"),
    ]


def test_the_schema_ranks_below_every_system_schema_and_above_service_accounts(sample):
    _, schema = flow_objects(sample)
    precedence = schema["spec"]["matchingPrecedence"]
    # Lower numbers win: ours must lose to all of Kubernetes' own (node heartbeats, leader
    # election, controllers) and win over the catch-all for service accounts.
    assert precedence > max(SYSTEM_SCHEMAS.values())
    assert precedence < SERVICE_ACCOUNTS_SCHEMA
    # No subject a system schema is for: no group, user, kube-system or wildcard account.
    for namespace, name in subjects_of(schema):
        assert namespace != "kube-system" and "*" not in (namespace, name)


def test_a_precedence_among_the_system_schemas_is_refused():
    with pytest.raises(ValidationError):
        FlowControl(matching_precedence=SYSTEM_SCHEMAS["system-nodes"])
    with pytest.raises(ValidationError):
        FlowControl(matching_precedence=SERVICE_ACCOUNTS_SCHEMA)


@pytest.mark.parametrize(("queues", "hand_size"), [(4, 8), (128, 9)])
def test_a_hand_the_api_server_refuses_is_refused(queues, hand_size):
    """A hand larger than the deck, or over 60 bits of shuffle-sharding entropy (7 * 9 = 63)."""
    with pytest.raises(ValidationError):
        FlowControl(queues=queues, hand_size=hand_size)
    FlowControl(queues=queues, hand_size=min(queues, 8))  # the control: accepted


def test_the_objects_pass_the_flowcontrol_v1_schema(sample):
    level, schema = flow_objects(sample)
    assert level["apiVersion"] == schema["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
    assert validate_objects([level, schema], KUBERNETES) == []
    # Controls: v1beta2's field name (gone in v1) and a misspelt field are refused.
    old = copy.deepcopy(level)
    limited = old["spec"]["limited"]
    limited["assuredConcurrencyShares"] = limited.pop("nominalConcurrencyShares")
    misspelt = copy.deepcopy(schema)
    misspelt["spec"]["matchingPrecedance"] = misspelt["spec"].pop("matchingPrecedence")
    assert len(validate_objects([old, misspelt], KUBERNETES)) == 2


# -- the subjects against the rendered manifests -------------------------------------------------


def pod_specs(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(namespace, pod spec) of every pod an object makes."""
    namespace = obj.get("metadata", {}).get("namespace", "default")
    kind = obj.get("kind")
    if kind == "Pod":
        yield namespace, obj["spec"]
    elif kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        yield namespace, obj["spec"]["template"]["spec"]
    elif kind == "CronJob":
        yield namespace, obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def pods_of(manifests: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    pods = [pod for obj in manifests for pod in pod_specs(obj)]
    # The per-node check Job the sampler creates, from the template its ConfigMap carries.
    for obj in manifests:
        if obj["kind"] == "ConfigMap" and "periodic-job.yaml" in obj.get("data", {}):
            pods += pod_specs(yaml.safe_load(obj["data"]["periodic-job.yaml"]))
    return pods


def named_accounts(pods: list[tuple[str, dict[str, Any]]]) -> set[tuple[str, str]]:
    """(namespace, account) of each pod that names an account other than its namespace's
    default."""
    return {
        (namespace, spec["serviceAccountName"])
        for namespace, spec in pods
        if spec.get("serviceAccountName", "default") != "default"
    }


def both_jobs_cluster(small_cluster, write_cluster, tmp_path: Path):
    known = tmp_path / "known_hosts"
    addresses = [h["address"] for h in small_cluster["hosts"].values()]
    known.write_text("".join(f"{a} {KEY_LINE}\n" for a in addresses))
    small_cluster["ssh"] = {"known_hosts": str(known)}
    small_cluster["group_vars"] = {
        "all": {
            "drift_job": {"enabled": True, "nodes": ["cpu-1"], "namespace": DRIFT_NAMESPACE},
            "rollout_job": {"enabled": True, "nodes": ["cpu-1"]},
        }
    }
    loaded = load(write_cluster(small_cluster))
    DRIFT_KEY.private_key(loaded.state_dir, StateAccess.create)
    ROLLOUT_KEY.private_key(loaded.state_dir, StateAccess.create)
    return loaded


@pytest.fixture
def state_stands(monkeypatch):
    """The drift flow's exact check needs the apply's state; here there is none to check."""
    import engine.clusterstate

    monkeypatch.setattr(engine.clusterstate, "require_state", lambda loaded, roles: loaded)


def is_ours(path: str) -> bool:
    """A _cluster/ file of gpuinfra's own Kubernetes objects. Calico's are its project's (its
    accounts are in kube-system, which kube-system-service-accounts classifies)."""
    kubernetes = path.startswith("kubernetes/") and not path.startswith(CALICO_PREFIX)
    return kubernetes or path == DRIFT_MANIFEST


def every_manifest(loaded) -> list[dict[str, Any]]:
    """Every object gpuinfra puts in the cluster: the cluster files, and the drift and rollout
    Jobs' manifests as their flows publish them."""
    manifests = [
        obj
        for path, text in cluster_files(loaded).items()
        if is_ours(path)
        for obj in documents(text)
    ]
    keep_records(loaded)
    drift = DriftKubectl()
    fleetjob.fleet_drift(job_run(loaded, drift, Exact()))
    rollout = RolloutKubectl({})
    options = RunOptions(mode=Mode.apply, limit=("cpu_worker",))
    rolloutjob.fleet_rollout(
        rolloutjob.Rollout(loaded, options, runner=rollout, sleep=lambda s: None)
    )
    assert drift.manifest and rollout.manifest
    return [*manifests, *drift.manifest, *rollout.manifest]


def test_the_subjects_are_exactly_the_accounts_our_pods_run_as(
    small_cluster, write_cluster, tmp_path, state_stands
):
    """Renaming an account in a template, or adding a pod under a new one, without the flow
    schema following fails here."""
    loaded = both_jobs_cluster(small_cluster, write_cluster, tmp_path)
    manifests = every_manifest(loaded)
    pods = pods_of(manifests)
    named = named_accounts(pods)
    _, schema = flow_objects(cluster_files(loaded))
    subjects = subjects_of(schema)
    assert len(subjects) == len(set(subjects))
    assert set(subjects) == named
    # Every kind of pod was seen: the health DaemonSet, CronJob and check Job, both Jobs.
    assert {name for _, name in named} == {
        "gpu-health-preflight",
        "gpu-health-sampler",
        "gpu-health-periodic",
        "gpuinfra-drift",
        "gpuinfra-rollout",
    }
    assert (DRIFT_NAMESPACE, "gpuinfra-drift") in named
    # The pods left out (device plugin, DCGM exporter, balloons, the older drift Job) run as
    # their namespace's default account with no token: they make no request to classify.
    unnamed = [spec for _, spec in pods if spec.get("serviceAccountName", "default") == "default"]
    assert unnamed and all(spec.get("automountServiceAccountToken") is False for spec in unnamed)


def test_the_subject_check_catches_a_renamed_account(
    small_cluster, write_cluster, tmp_path, state_stands, monkeypatch
):
    """The control: the role's account renamed while its template still says the old name (or
    the other way round) is a difference the comparison above finds."""
    loaded = both_jobs_cluster(small_cluster, write_cluster, tmp_path)
    named = named_accounts(pods_of(every_manifest(loaded)))
    monkeypatch.setattr(rollout_role, "SERVICE_ACCOUNT", "gpuinfra-rollout-v2")
    _, schema = flow_objects(cluster_files(loaded))
    assert set(subjects_of(schema)) ^ named == {
        ("gpuinfra", "gpuinfra-rollout"),
        ("gpuinfra", "gpuinfra-rollout-v2"),
    }
