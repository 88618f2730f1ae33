"""The in-cluster gate: what a verdict does to a node's taints, condition and schedulability.

The API server cannot run here: `FakeNodes` stands in for it, holding node objects and applying
the gate's writes the way the API server would (JSON patch with its `test` op, cordon, a
strategic merge of one condition).
"""

from __future__ import annotations

import copy
import json
import random
from datetime import UTC, datetime

import pytest

from gpuhealth import gate
from gpuhealth.commands import CommandResult
from roles import gpu_health

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
PREFLIGHT = {"key": "gpuinfra.io/preflight", "value": "true", "effect": "NoSchedule"}
TEAM = {"key": "gpuinfra.io/team", "value": "research", "effect": "NoSchedule"}
OPERATOR = {"key": "example.com/maintenance", "effect": "NoSchedule"}


def node(name: str, taints: list[dict] | None = None, cordoned: bool = False) -> dict:
    spec: dict = {"taints": copy.deepcopy(taints)} if taints else {}
    if cordoned:
        spec["unschedulable"] = True
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {gpu_health.GPU_WORKER_LABEL_KEY: "true"},
        },
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


class FakeNodes:
    """Stand-in for the API server's node and event endpoints."""

    def __init__(self, nodes: list[dict]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.events: list[dict] = []
        self.writes: list[tuple[str, str]] = []

    def get_node(self, name: str) -> dict:
        return copy.deepcopy(self.nodes[name])

    def gpu_workers(self) -> list[dict]:
        return [copy.deepcopy(n) for n in self.nodes.values()]

    def patch_taints(self, name: str, patch: list[dict]) -> None:
        test, replace = patch
        assert test["op"] == "test" and replace["op"] == "replace"
        current = self.nodes[name]["spec"].get("taints", [])
        if current != test["value"]:
            raise gate.KubectlFailed("the test operation failed: taints changed")
        self.nodes[name]["spec"]["taints"] = replace["value"]
        self.writes.append((name, "taints"))

    def set_condition(self, name: str, condition: dict) -> None:
        conditions = self.nodes[name]["status"]["conditions"]
        conditions[:] = [c for c in conditions if c["type"] != condition["type"]] + [condition]
        self.writes.append((name, "condition"))

    def cordon(self, name: str) -> None:
        self.nodes[name]["spec"]["unschedulable"] = True
        self.writes.append((name, "cordon"))

    def create_event(self, event: dict) -> None:
        self.events.append(event)


def condition_of(api: FakeNodes, name: str) -> dict:
    conditions = api.nodes[name]["status"]["conditions"]
    return next(c for c in conditions if c["type"] == gpu_health.HEALTH_CONDITION)


@pytest.mark.parametrize("verdict", ["ok", "degraded"])
def test_a_passing_check_removes_only_the_preflight_taint(verdict):
    api = FakeNodes([node("gpu-1", [TEAM, PREFLIGHT, OPERATOR])])
    gate.run_preflight(api, "gpu-1", verdict, "all checks passed", NOW)
    assert api.nodes["gpu-1"]["spec"]["taints"] == [TEAM, OPERATOR]
    assert condition_of(api, "gpu-1")["status"] == "True"
    assert api.events == []
    assert "unschedulable" not in api.nodes["gpu-1"]["spec"]


@pytest.mark.parametrize("verdict", ["failed", "error"])
def test_a_failing_check_keeps_the_taint_with_an_event_and_a_condition(verdict):
    api = FakeNodes([node("gpu-1", [TEAM, PREFLIGHT])])
    gate.run_preflight(api, "gpu-1", verdict, "ecc, matmul", NOW)
    assert api.nodes["gpu-1"]["spec"]["taints"] == [TEAM, PREFLIGHT]
    assert (("gpu-1", "taints")) not in api.writes
    condition = condition_of(api, "gpu-1")
    assert condition["status"] == "False" and "ecc, matmul" in condition["message"]
    (event,) = api.events
    assert event["involvedObject"] == {
        "apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "uid-gpu-1"
    }  # fmt: skip
    assert event["type"] == "Warning" and event["reason"] == "GPUPreflightFailed"
    assert event["metadata"]["namespace"] == "default"
    # Kubelet and the other conditions are left alone.
    assert api.nodes["gpu-1"]["status"]["conditions"][0] == {"type": "Ready", "status": "True"}


def test_a_pass_on_a_node_without_the_taint_writes_no_taints():
    api = FakeNodes([node("gpu-1", [TEAM])])
    actions = gate.run_preflight(api, "gpu-1", "ok", "all checks passed", NOW)
    assert actions.taint_patch is None
    assert api.writes == [("gpu-1", "condition")]


def test_the_taint_patch_refuses_to_overwrite_a_concurrent_change():
    api = FakeNodes([node("gpu-1", [PREFLIGHT])])
    actions = gate.decide_preflight(api.get_node("gpu-1"), "ok", "", NOW)
    api.nodes["gpu-1"]["spec"]["taints"].append(OPERATOR)  # someone else writes in between
    with pytest.raises(gate.KubectlFailed):
        gate.apply(api, "gpu-1", actions)
    assert api.nodes["gpu-1"]["spec"]["taints"] == [PREFLIGHT, OPERATOR]


def test_a_fleet_where_most_nodes_fail_cordons_at_most_the_budget():
    # 20 GPU workers, 15 of them fail their periodic check: 10% of 20 is 2.
    names = [f"gpu-{i}" for i in range(1, 21)]
    api = FakeNodes([node(name) for name in names])
    failing = names[:15]
    alerts = []
    for name in names:
        verdict = "failed" if name in failing else "ok"
        actions = gate.run_periodic(api, name, verdict, "xid", "10%", NOW)
        alerts += actions.alerts
    cordoned = [n for n in names if api.nodes[n]["spec"].get("unschedulable")]
    assert cordoned == ["gpu-1", "gpu-2"]
    assert len(alerts) == 13  # every failed node left in service is said out loud
    reasons = [e["reason"] for e in api.events]
    assert reasons.count("GPUHealthCordoned") == 2
    assert reasons.count("GPUHealthCordonBudgetSpent") == 13


def test_nodes_already_cordoned_spend_the_budget():
    nodes = [node(f"gpu-{i}", cordoned=i <= 2) for i in range(1, 21)]
    api = FakeNodes(nodes)
    actions = gate.run_periodic(api, "gpu-5", "failed", "ecc", "10%", NOW)
    assert not actions.cordon and actions.alerts
    assert not api.nodes["gpu-5"]["spec"].get("unschedulable")


def test_one_failure_in_a_healthy_fleet_is_cordoned():
    # Positive control for the budget tests: the budget is not simply zero.
    api = FakeNodes([node(f"gpu-{i}") for i in range(1, 21)])
    actions = gate.run_periodic(api, "gpu-7", "failed", "ecc", "10%", NOW)
    assert actions.cordon and api.nodes["gpu-7"]["spec"]["unschedulable"] is True
    assert condition_of(api, "gpu-7")["status"] == "False"


@pytest.mark.parametrize("verdict", ["ok", "degraded", "error"])
def test_the_periodic_check_cordons_only_failed_nodes(verdict):
    api = FakeNodes([node(f"gpu-{i}") for i in range(1, 11)])
    actions = gate.run_periodic(api, "gpu-1", verdict, "", "10%", NOW)
    assert not actions.cordon and "unschedulable" not in api.nodes["gpu-1"]["spec"]


def test_plan_cordons_takes_failures_in_order_up_to_the_budget():
    nodes = [node(f"gpu-{i}") for i in range(1, 101)]  # 10% of 100 is 10
    failed = [f"gpu-{i}" for i in range(1, 81)]
    cordon, spared = gate.plan_cordons(failed, nodes, "10%")
    assert cordon == failed[:10] and spared == failed[10:]
    cordon, spared = gate.plan_cordons(failed[:3], nodes, "10%")
    assert cordon == failed[:3] and spared == []


def test_kubectl_argv_patches_the_taints_and_the_status_subresource():
    calls: list[list[str]] = []

    def run(argv: list[str], timeout: float) -> CommandResult:
        calls.append(argv)
        return CommandResult(0, json.dumps(node("gpu-1", [PREFLIGHT])))

    api = gate.Kubectl(run)
    gate.run_preflight(api, "gpu-1", "ok", "fine", NOW)
    assert calls[0] == ["kubectl", "get", "node", "gpu-1", "-o", "json"]
    assert calls[1][:6] == [
        "kubectl", "patch", "node", "gpu-1", "--subresource=status", "--type=strategic"
    ]  # fmt: skip
    assert calls[2][:5] == ["kubectl", "patch", "node", "gpu-1", "--type=json"]
    patch = json.loads(calls[2][-1])
    assert patch[1]["value"] == []


def test_main_writes_the_budget_alert_for_the_textfile_collector(tmp_path, monkeypatch):
    api = FakeNodes([node(f"gpu-{i}", cordoned=i == 1) for i in range(1, 11)])
    monkeypatch.setattr(gate, "Kubectl", lambda: api)
    alert = tmp_path / "gate.prom"
    rc = gate.main(
        ["periodic", "--node", "gpu-2", "--verdict", "failed", "--alert-file", str(alert)]
    )
    assert rc == 0
    assert "gpuinfra_gpu_health_cordon_budget_spent 1" in alert.read_text()
    rc = gate.main(["periodic", "--node", "gpu-3", "--verdict", "ok", "--alert-file", str(alert)])
    assert "gpuinfra_gpu_health_cordon_budget_spent 0" in alert.read_text()


# --- the periodic CronJob's random draw ---

JOB_TEMPLATE = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"generateName": "gpu-health-periodic-", "namespace": "gpu-health"},
    "spec": {
        "template": {
            "spec": {
                "containers": [
                    {"name": "gpu-health", "resources": {"limits": {"nvidia.com/gpu": 8}}}
                ]
            }
        }
    },
}


def ready_gpu_node(name: str, gpus: int = 8, **kwargs) -> dict:
    n = node(name, **kwargs)
    n["status"]["allocatable"] = {"nvidia.com/gpu": str(gpus)}
    return n


class RecordingJobs(FakeNodes):
    def __init__(self, nodes: list[dict]) -> None:
        super().__init__(nodes)
        self.jobs: list[dict] = []

    def create_job(self, job: dict) -> str:
        self.jobs.append(job)
        return f"job.batch/gpu-health-periodic-{len(self.jobs)}"


def pinned_to(job: dict) -> str:
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return terms[0]["matchFields"][0]["values"][0]


def test_the_sample_skips_nodes_in_preflight_cordoned_not_ready_or_without_gpus():
    nodes = [
        ready_gpu_node("gpu-1"),
        ready_gpu_node("gpu-2", taints=[PREFLIGHT]),
        ready_gpu_node("gpu-3", cordoned=True),
        ready_gpu_node("gpu-4", gpus=0),
        ready_gpu_node("gpu-5", taints=[TEAM]),  # a team's node is checked like any other
    ]
    nodes.append(node("gpu-6"))  # no allocatable GPUs reported at all
    not_ready = ready_gpu_node("gpu-7")
    not_ready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    nodes.append(not_ready)
    names = [n["metadata"]["name"] for n in gate.eligible(nodes, "nvidia.com/gpu")]
    assert names == ["gpu-1", "gpu-5"]


def test_each_drawn_node_gets_one_job_pinned_to_it_with_all_its_gpus():
    nodes = [ready_gpu_node(f"gpu-{i}", gpus=4 if i == 3 else 8) for i in range(1, 11)]
    api = RecordingJobs(nodes)
    created = gate.run_sample(api, 3, JOB_TEMPLATE, "nvidia.com/gpu", random.Random(7))
    assert len(created) == 3 and len(api.jobs) == 3
    pinned = [pinned_to(job) for job in api.jobs]
    assert len(set(pinned)) == 3
    for job, name in zip(api.jobs, pinned, strict=True):
        limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == (4 if name == "gpu-3" else 8)
        assert job["metadata"]["labels"]["gpuinfra.io/node"] == name
    # The template itself is left as it was for the next draw.
    assert "affinity" not in JOB_TEMPLATE["spec"]["template"]["spec"]


def test_the_draw_is_uniform_over_the_eligible_nodes():
    nodes = [ready_gpu_node(f"gpu-{i}") for i in range(1, 11)]
    rng = random.Random(2026)
    counts = dict.fromkeys((f"gpu-{i}" for i in range(1, 11)), 0)
    for _ in range(2000):
        for chosen in gate.choose_nodes(nodes, 2, "nvidia.com/gpu", rng):
            counts[chosen["metadata"]["name"]] += 1
    # 4000 draws over 10 nodes: 400 each expected; a fixed seed makes this exact, not flaky.
    assert all(300 < count < 500 for count in counts.values()), counts


def test_a_large_sample_draws_distinct_nodes():
    # The sample grows with the fleet (roles/gpu_health/sampling.py): 63 a run of 7,500.
    nodes = [ready_gpu_node(f"gpu-{i}") for i in range(7500)]
    api = RecordingJobs(nodes)
    gate.run_sample(api, 63, JOB_TEMPLATE, "nvidia.com/gpu", random.Random(3))
    assert len({pinned_to(job) for job in api.jobs}) == 63


def test_a_sample_larger_than_the_fleet_takes_every_eligible_node():
    nodes = [ready_gpu_node("gpu-1"), ready_gpu_node("gpu-2", cordoned=True)]
    chosen = gate.choose_nodes(nodes, 5, "nvidia.com/gpu", random.Random(1))
    assert [n["metadata"]["name"] for n in chosen] == ["gpu-1"]


def test_the_condition_transition_time_moves_only_when_its_status_changes():
    later = datetime(2026, 1, 2, 4, 0, 0, tzinfo=UTC)
    api = FakeNodes([node("gpu-1", [TEAM])])
    gate.run_passive(api, "gpu-1", "ok", "all checks passed", NOW)
    first = condition_of(api, "gpu-1")
    gate.run_passive(api, "gpu-1", "degraded", "pcie", later)
    again = condition_of(api, "gpu-1")
    assert again["lastTransitionTime"] == first["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert again["lastHeartbeatTime"] == "2026-01-02T04:00:00Z"
    gate.run_passive(api, "gpu-1", "failed", "ecc", later)
    failed = condition_of(api, "gpu-1")
    assert failed["status"] == "False" and failed["lastTransitionTime"] == "2026-01-02T04:00:00Z"
    # Passive checks never touch taints, and never cordon.
    assert api.nodes["gpu-1"]["spec"] == {"taints": [TEAM]} and api.events == []


def test_kubectl_records_the_event_and_creates_jobs_from_a_file():
    calls: list[tuple[list[str], dict]] = []

    def run(argv: list[str], timeout: float) -> CommandResult:
        with open(argv[argv.index("-f") + 1]) as handle:
            calls.append((argv, json.load(handle)))
        return CommandResult(0, "job.batch/gpu-health-periodic-x7k2\n")

    api = gate.Kubectl(run)
    event = gate.node_event(node("gpu-1"), "GPUPreflightFailed", "ecc", NOW)
    api.create_event(event)
    assert api.create_job(JOB_TEMPLATE) == "job.batch/gpu-health-periodic-x7k2"
    (event_argv, posted), (job_argv, created) = calls
    assert event_argv[:2] == ["kubectl", "create"]
    assert event_argv[-2:] == ["--raw", "/api/v1/namespaces/default/events"]
    assert posted == event and created == JOB_TEMPLATE
    assert job_argv[-2:] == ["-o", "name"]
