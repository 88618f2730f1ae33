"""What the in-cluster GPU health pods do with a verdict: lift or keep the preflight taint,
set the node's GPUHealthy condition, record an Event, and cordon within a budget; and which
random GPU workers the periodic CronJob checks.

The decisions are pure functions of the node object and the verdict (unit tested); `main` wires
them to kubectl for the pods of templates/gpu_health/gpu-health.yaml.j2:

    python3 -m gpuhealth.gate preflight --node NODE --verdict ok --report REPORT.json
    python3 -m gpuhealth.gate passive --node NODE --verdict ok --report REPORT.json
    python3 -m gpuhealth.gate periodic --node NODE --verdict failed --budget 10%
    python3 -m gpuhealth.gate sample --count 2 --job /etc/gpu-health/periodic-job.yaml
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import yaml

from gpuhealth.commands import CommandRunner, run_command
from roles.gpu_health import (
    GPU_WORKER_LABEL_KEY,
    GPU_WORKER_LABEL_VALUE,
    HEALTH_CONDITION,
    PREFLIGHT_TAINT_KEY,
)
from roles.gpu_health.config import parse_budget

# Verdicts that let a node take work: degraded keeps computing correctly, only slower.
PASSING = frozenset({"ok", "degraded"})
# Node events live in `default`, as kubelet's own do (a Node has no namespace).
EVENT_NAMESPACE = "default"
EVENT_SOURCE = "gpuinfra-gpu-health"


@dataclass(frozen=True)
class NodeActions:
    """What to write on one node; None/empty where nothing changes."""

    taint_patch: list[dict[str, Any]] | None  # a JSON patch of spec.taints, guarded by `test`
    condition: dict[str, Any]
    event: dict[str, Any] | None
    cordon: bool = False
    alerts: list[str] = field(default_factory=list)  # for the pod log and the textfile metric


def taints_without_preflight(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every taint but the preflight one: team taints and anything an operator set stay."""
    return [taint for taint in taints if taint.get("key") != PREFLIGHT_TAINT_KEY]


def _taint_patch(node: dict[str, Any]) -> list[dict[str, Any]] | None:
    taints = node.get("spec", {}).get("taints") or []
    kept = taints_without_preflight(taints)
    if kept == taints:
        return None
    # `test` first: if anything else changed the taints since we read them, the API server
    # refuses the patch instead of our stale list overwriting it.
    return [
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]


def condition(
    verdict: str, summary: str, now: datetime, node: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The GPUHealthy condition; its transition time moves only when its status changes, as
    Kubernetes conditions' do (the heartbeat moves on every check)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    status = "True" if verdict in PASSING else "False"
    conditions = (node or {}).get("status", {}).get("conditions") or []
    previous = next((c for c in conditions if c.get("type") == HEALTH_CONDITION), {})
    same = previous.get("status") == status and previous.get("lastTransitionTime")
    return {
        "type": HEALTH_CONDITION,
        "status": status,
        "reason": f"GPUHealth{verdict.capitalize()}",
        "message": summary[:1024],
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": previous["lastTransitionTime"] if same else stamp,
    }


def node_event(
    node: dict[str, Any], reason: str, message: str, now: datetime, kind: str = "Warning"
) -> dict[str, Any]:
    name = node["metadata"]["name"]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.gpu-health.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": node["metadata"].get("uid", ""),
        },
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": EVENT_SOURCE, "host": name},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def decide_preflight(
    node: dict[str, Any], verdict: str, summary: str, now: datetime
) -> NodeActions:
    """A pass lifts the preflight taint and nothing else; a failure keeps it and says why."""
    if verdict in PASSING:
        return NodeActions(_taint_patch(node), condition(verdict, summary, now, node), None)
    message = f"preflight {verdict}: {summary}; keeping the {PREFLIGHT_TAINT_KEY} taint"
    event = node_event(node, "GPUPreflightFailed", message, now)
    return NodeActions(None, condition(verdict, summary, now, node), event)


def is_gpu_worker(node: dict[str, Any]) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    return labels.get(GPU_WORKER_LABEL_KEY) == GPU_WORKER_LABEL_VALUE


def cordoned_count(nodes: list[dict[str, Any]]) -> int:
    """GPU workers already cordoned for any reason: they all spend the same budget."""
    return sum(bool(node.get("spec", {}).get("unschedulable")) for node in nodes)


def decide_periodic(
    node: dict[str, Any],
    gpu_workers: list[dict[str, Any]],
    verdict: str,
    summary: str,
    budget: str,
    now: datetime,
) -> NodeActions:
    """A failed node is cordoned only while fewer than the budget are cordoned; past it the
    node stays schedulable and an alert says so: many failures at once are more often a bad
    check or a shared cause (a driver push, a switch) than many broken GPUs, and cordoning
    them all would empty the fleet."""
    actions = NodeActions(None, condition(verdict, summary, now, node), None)
    if verdict != "failed":
        return actions
    if node.get("spec", {}).get("unschedulable"):
        return actions  # already out of service: nothing to spend
    allowed = parse_budget(budget, len(gpu_workers))
    cordoned = cordoned_count(gpu_workers)
    if cordoned >= allowed:
        message = (
            f"periodic check failed ({summary}) but {cordoned} of {len(gpu_workers)} GPU "
            f"workers are already cordoned (budget {allowed}): NOT cordoning; look at the fleet"
        )
        event = node_event(node, "GPUHealthCordonBudgetSpent", message, now)
        return NodeActions(None, actions.condition, event, cordon=False, alerts=[message])
    message = f"periodic check failed: {summary}; cordoned ({cordoned + 1} of {allowed} budget)"
    event = node_event(node, "GPUHealthCordoned", message, now)
    return NodeActions(None, actions.condition, event, cordon=True)


def plan_cordons(
    failed: list[str], nodes: list[dict[str, Any]], budget: str
) -> tuple[list[str], list[str]]:
    """The fleet view of `decide_periodic` (failed hosts taken in order): (cordon, spared)."""
    allowed = parse_budget(budget, len(nodes))
    room = max(0, allowed - cordoned_count(nodes))
    return failed[:room], failed[room:]


def _ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _gpus(node: dict[str, Any], gpu_resource: str) -> int:
    allocatable = node.get("status", {}).get("allocatable") or {}
    try:
        return int(allocatable.get(gpu_resource, 0))
    except (TypeError, ValueError):
        return 0


def eligible(nodes: list[dict[str, Any]], gpu_resource: str) -> list[dict[str, Any]]:
    """GPU workers worth a periodic check: Ready, schedulable, past preflight (the DaemonSet
    owns those), and advertising GPUs (a node whose device plugin is down is not idle)."""
    return [
        node
        for node in nodes
        if is_gpu_worker(node)
        and _ready(node)
        and not node.get("spec", {}).get("unschedulable")
        and not any(
            t.get("key") == PREFLIGHT_TAINT_KEY for t in node.get("spec", {}).get("taints") or []
        )
        and _gpus(node, gpu_resource) > 0
    ]


def choose_nodes(
    nodes: list[dict[str, Any]], count: int, gpu_resource: str, rng: random.Random
) -> list[dict[str, Any]]:
    """`count` eligible nodes drawn uniformly without replacement (all of them if fewer)."""
    pool = eligible(nodes, gpu_resource)
    return rng.sample(pool, min(count, len(pool)))


def pinned_job(template: dict[str, Any], node: dict[str, Any], gpu_resource: str) -> dict[str, Any]:
    """The periodic check Job for one node: pinned to it by name, asking for all its GPUs."""
    job = copy.deepcopy(template)
    name = node["metadata"]["name"]
    job["metadata"].setdefault("labels", {})["gpuinfra.io/node"] = name
    pod = job["spec"]["template"]["spec"]
    pod["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}
                ]
            }
        }
    }
    for container in pod["containers"]:
        container.setdefault("resources", {}).setdefault("limits", {})[gpu_resource] = _gpus(
            node, gpu_resource
        )
    return job


# --- wiring to the API server (kubectl in the pod, with its service account) ---


class NodeApi(Protocol):
    """The few calls the gate makes; `Kubectl` in the pods, a stand-in in unit tests."""

    def get_node(self, name: str) -> dict[str, Any]: ...
    def gpu_workers(self) -> list[dict[str, Any]]: ...
    def patch_taints(self, name: str, patch: list[dict[str, Any]]) -> None: ...
    def set_condition(self, name: str, condition: dict[str, Any]) -> None: ...
    def cordon(self, name: str) -> None: ...
    def create_event(self, event: dict[str, Any]) -> None: ...
    def create_job(self, job: dict[str, Any]) -> str: ...


class KubectlFailed(RuntimeError):
    pass


@dataclass
class Kubectl:
    run: CommandRunner = run_command

    def _call(self, *args: str) -> str:
        result = self.run(["kubectl", *args], 60)
        if result.rc != 0:
            said = (result.stderr.strip().splitlines() or [f"exit {result.rc}"])[-1]
            raise KubectlFailed(f"kubectl {args[0]} {args[1] if len(args) > 1 else ''}: {said}")
        return result.stdout

    def get_node(self, name: str) -> dict[str, Any]:
        return json.loads(self._call("get", "node", name, "-o", "json"))

    def gpu_workers(self) -> list[dict[str, Any]]:
        selector = f"{GPU_WORKER_LABEL_KEY}={GPU_WORKER_LABEL_VALUE}"
        return json.loads(self._call("get", "nodes", "-l", selector, "-o", "json"))["items"]

    def patch_taints(self, name: str, patch: list[dict[str, Any]]) -> None:
        self._call("patch", "node", name, "--type=json", "-p", json.dumps(patch))

    def set_condition(self, name: str, condition: dict[str, Any]) -> None:
        body = json.dumps({"status": {"conditions": [condition]}})
        self._call("patch", "node", name, "--subresource=status", "--type=strategic", "-p", body)

    def cordon(self, name: str) -> None:
        self._call("cordon", name)

    def create_event(self, event: dict[str, Any]) -> None:
        # POSTed as is (`create --raw`): kubectl has no command that records a custom Event.
        path = f"/api/v1/namespaces/{event['metadata']['namespace']}/events"
        self._create(event, "--raw", path)

    def create_job(self, job: dict[str, Any]) -> str:
        return self._create(job, "-o", "name").strip()

    def _create(self, body: dict[str, Any], *args: str) -> str:
        # From a file, not argv: the object can be long, and no shell is involved either way.
        with tempfile.NamedTemporaryFile("w", suffix=".json") as handle:
            json.dump(body, handle)
            handle.flush()
            return self._call("create", "-f", handle.name, *args)


def apply(api: NodeApi, name: str, actions: NodeActions) -> None:
    """Condition first (controllers read it), then the taint or cordon, then the Event."""
    api.set_condition(name, actions.condition)
    if actions.taint_patch:
        api.patch_taints(name, actions.taint_patch)
    if actions.cordon:
        api.cordon(name)
    if actions.event:
        api.create_event(actions.event)


def run_preflight(
    api: NodeApi, name: str, verdict: str, summary: str, now: datetime
) -> NodeActions:
    actions = decide_preflight(api.get_node(name), verdict, summary, now)
    apply(api, name, actions)
    return actions


def run_passive(api: NodeApi, name: str, verdict: str, summary: str, now: datetime) -> NodeActions:
    """The node's lifetime loop: the condition follows the verdict; taints stay as they are (a
    node that fails later is the periodic check's, within its budget)."""
    actions = NodeActions(None, condition(verdict, summary, now, api.get_node(name)), None)
    apply(api, name, actions)
    return actions


def run_periodic(
    api: NodeApi, name: str, verdict: str, summary: str, budget: str, now: datetime
) -> NodeActions:
    actions = decide_periodic(api.get_node(name), api.gpu_workers(), verdict, summary, budget, now)
    apply(api, name, actions)
    return actions


def run_sample(
    api: NodeApi, count: int, template: dict[str, Any], gpu_resource: str, rng: random.Random
) -> list[str]:
    """Draw the nodes and create one pinned check Job each; the created Jobs' names."""
    chosen = choose_nodes(api.gpu_workers(), count, gpu_resource, rng)
    return [api.create_job(pinned_job(template, node, gpu_resource)) for node in chosen]


def summarize(report_path: str | None) -> str:
    """The failed and degraded checks of a `gpuinfra health run --format json` report."""
    if not report_path:
        return "no report"
    try:
        with open(report_path) as handle:
            checks = json.load(handle)["checks"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no readable report"
    bad = sorted({c["check"] for c in checks if c.get("verdict") in ("degraded", "failed")})
    return ", ".join(bad) or "all checks passed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m gpuhealth.gate")
    parser.add_argument("mode", choices=["preflight", "passive", "periodic", "sample"])
    parser.add_argument("--node")
    parser.add_argument("--verdict", choices=["ok", "degraded", "failed", "error"])
    parser.add_argument("--report", help="the JSON report of gpuinfra health run")
    parser.add_argument("--budget", default="10%", help="cordon budget: 10%% or a node count")
    parser.add_argument("--alert-file", help="textfile-collector file for the budget alert")
    parser.add_argument("--count", type=int, default=2, help="sample: nodes to draw")
    parser.add_argument("--job", help="sample: the check Job template (YAML)")
    parser.add_argument("--gpu-resource", default="nvidia.com/gpu")
    args = parser.parse_args(argv)
    api, now, summary = Kubectl(), datetime.now(UTC), summarize(args.report)
    if args.mode == "sample":
        if not args.job:
            parser.error("sample needs --job")
        with open(args.job) as handle:
            template = yaml.safe_load(handle)
        try:
            created = run_sample(
                api, args.count, template, args.gpu_resource, random.SystemRandom()
            )
        except KubectlFailed as exc:
            print(f"gate: {exc}", file=sys.stderr)
            return 1
        print(f"sampled {len(created)} GPU workers: {' '.join(created) or 'none eligible'}")
        return 0
    if not args.node or not args.verdict:
        parser.error(f"{args.mode} needs --node and --verdict")
    try:
        if args.mode == "preflight":
            actions = run_preflight(api, args.node, args.verdict, summary, now)
        elif args.mode == "passive":
            actions = run_passive(api, args.node, args.verdict, summary, now)
        else:
            actions = run_periodic(api, args.node, args.verdict, summary, args.budget, now)
    except KubectlFailed as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return 1
    for alert in actions.alerts:
        print(f"ALERT: {alert}", file=sys.stderr)
    if args.alert_file:
        gauge = "gpuinfra_gpu_health_cordon_budget_spent"
        with open(args.alert_file, "w") as handle:
            handle.write(f"# HELP {gauge} 1 when a failed node was left uncordoned: budget spent\n")
            handle.write(f"# TYPE {gauge} gauge\n{gauge} {int(bool(actions.alerts))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
