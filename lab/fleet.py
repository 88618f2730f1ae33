"""Simulated GPU nodes on a lab's real cluster: Node objects kwok keeps Ready, for scale work.

Issue 44 measures the control plane the way the seeds' fleet loads it: thousands of nodes
against the real API servers, behind the same HAProxy address, on the same external etcd. A lab
host costs about 55 MB and a Kubernetes node far more (LAB.md), so the machine holds a dozen
real nodes, not thousands. kwok (`sigs.k8s.io/kwok`, built by lab/gobuild.py from go/kwok)
stands in for their kubelets: it marks each simulated node Ready, renews its Lease every 10 s
and reports its status as kubelet does, and plays the pods that land on it (the DaemonSets'),
so the API servers and etcd carry a fleet's writes without its machines.

The nodes are the lab's gpu_worker as the inventory gives it (its GPU model and count) on the
server that holds eight such GPUs, with the labels and taints the kubernetes and fleet_policy
roles give a real GPU worker (toolkit/nodes.py): the GPU worker label, the nvidia runtime's
label (the sample's workers get the container toolkit), the preflight taint (no
GPU test ever passes on a simulated node, so it stays, as on a node whose burn-in failed) and
each team's label and taint, the nodes dealt round the inventory's teams in turn.

kwok runs on this machine, beside `gpuinfra`, not in a lab host: every lab host is a container
of this same machine, so a host would add its own memory and nothing a measurement needs, and
kwok outside the cluster sees it only through the operator's kubeconfig and the balancer, as an
external fleet of kubelets does. It lives in the lab's state folder and `lab down` stops it.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from inventory.versions import KubernetesVersion
from lab import gobuild, naming, processes
from lab.errors import LabError, LabInvalid, LabMissingTool
from lab.naming import check_lab_name
from lab.state import read_state
from toolkit import nodes

if TYPE_CHECKING:
    from inventory.model import LoadedCluster

KWOK_MODULE = "kwok"
KWOK = "sigs.k8s.io/kwok"
# kwok's own convention for the nodes it manages; it leaves every other node (the lab's real
# kubelets) alone.
MANAGED_KEY = "kwok.x-k8s.io/node"
MANAGED_VALUE = "fake"
NAME_PREFIX = "sim-gpu-"
NAME_DIGITS = 5  # up to 99,999 nodes: beyond the 5,000-node upstream limit
# kubelet's default nodeLeaseDurationSeconds; kubelet (and kwok) renew at a quarter of it: 10 s.
LEASE_DURATION_S = 40
# kubelet's default nodeStatusReportFrequency with leases on: a full status every 5 minutes
# when nothing changed (kwok's own stage reports every 10 to 20 minutes).
STATUS_REPORT_MS = 5 * 60 * 1000
STATUS_REPORT_JITTER_MS = 10 * 1000  # the spread of kwok's stage, kept
# kwok's stages, from its module: Ready at once, the status heartbeat, and pods played Running,
# completed and deleted as a kubelet would (the DaemonSets' pods land on every node).
STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
HEARTBEAT_STAGE = "node-heartbeat-with-lease"
# kwok's workers (its KwokConfiguration's options; each defaults to 4). A kubelet renews its
# Lease every 10 s, so 7,500 nodes are 750 renewals a second: 64 workers keep up while one
# renewal takes under 85 ms through the balancer. At 4, renewals at about 20 ms each are 200 a
# second: about 2,000 nodes, near where the first 2,500-node run stopped (1,790). The
# node stages (Ready at once, a status every 5 minutes) and the played pods (a DaemonSet's pod
# per node at each rollout step) get 32.
KWOK_OPTIONS = {
    "nodeLeaseParallelism": 64,
    "nodePlayStageParallelism": 32,
    "podPlayStageParallelism": 32,
}
# The server around the sample's gpu_worker (8x H100 SXM5 on an HGX board): NVIDIA's DGX H100
# datasheet gives two Xeon Platinum 8480C (2 x 56 cores, 224 threads: the CPUs kubelet counts)
# and 2 TB of memory. The inventory names the GPUs only.
SERVER_CPUS = 224
SERVER_MEMORY = "2Ti"
# kubelet's maxPods default, which the kubernetes role keeps (its max_pods).
MAX_PODS = 110
# The GPU resource the device plugin advertises and gpu_health's gate reads (its gpu_resource).
GPU_RESOURCE = "nvidia.com/gpu"
# The labels kubelet registers a GPU worker with besides toolkit/nodes.py's
# (roles/kubernetes/files.py: node_labels).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
NODE_INFO_FIELDS = (
    "machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "containerRuntimeVersion",
    "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture",
)  # fmt: skip
# kubectl processes creating nodes at once: hundreds of kubelets registering together.
CREATE_PARALLEL = 8
CREATE_CHUNK = 50
START_WAIT_S = 5.0
# How long the nodes may take to be Ready with a Lease once the last of them was created: the
# creation itself is not counted (2,500 nodes took 290 s to create on 2 cores, so a deadline
# from the start left the 5,000-node step 51 nodes short at 600 s).
READY_TIMEOUT_S = 600.0
READY_POLL_S = 5.0


@dataclass(frozen=True)
class ServerShape:
    """What one simulated node reports: the inventory's GPUs on an 8-GPU server."""

    gpu_model: str
    gpus: int
    cpus: int = SERVER_CPUS
    memory: str = SERVER_MEMORY
    pods: int = MAX_PODS
    kubelet_version: str = ""

    def resources(self) -> dict[str, str]:
        return {
            "cpu": str(self.cpus),
            "memory": self.memory,
            "pods": str(self.pods),
            GPU_RESOURCE: str(self.gpus),
        }


@dataclass(frozen=True)
class FleetResult:
    name: str
    nodes: int  # simulated nodes now in the cluster
    created: int
    deleted: int
    create_seconds: float  # until the API servers accepted every new node
    ready_seconds: float  # until every simulated node was Ready with a Lease
    controller_pid: int | None


def server_shape(loaded: LoadedCluster) -> ServerShape:
    """The shape of the inventory's first GPU worker."""
    cluster = loaded.cluster
    for name in cluster.in_group("gpu_worker"):
        gpu = cluster.hosts[name].gpu
        if gpu is not None:
            tag = KubernetesVersion.parse(cluster.versions.kubernetes).tag
            return ServerShape(gpu.model, gpu.count, kubelet_version=tag)
    raise LabInvalid("the lab's inventory has no gpu_worker with a gpu: nothing to simulate")


def node_name(index: int) -> str:
    return f"{NAME_PREFIX}{index:0{NAME_DIGITS}d}"


def node_object(name: str, shape: ServerShape, team: str | None) -> dict[str, Any]:
    """A Node as a GPU worker's kubelet registers it (labels, taints, capacity)."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        nodes.GPU_WORKER_LABEL_KEY: nodes.GPU_WORKER_LABEL_VALUE,
        # The sample's GPU workers get the container toolkit (roles/nvidia), so the DaemonSets
        # that need its runtime (device plugin, DCGM exporter) land on them; kwok plays their
        # pods, so no runtime is needed here. The lab's gpu-1 has none (no NVIDIA repository).
        nodes.NVIDIA_RUNTIME_LABEL_KEY: nodes.NVIDIA_RUNTIME_LABEL_VALUE,
        GPU_PRODUCT_LABEL: shape.gpu_model,
        GPU_COUNT_LABEL: str(shape.gpus),
    }
    taints = [
        {
            "key": nodes.PREFLIGHT_TAINT_KEY,
            "value": nodes.PREFLIGHT_TAINT_VALUE,
            "effect": nodes.PREFLIGHT_TAINT_EFFECT,
        }
    ]
    if team is not None:
        labels[nodes.TEAM_LABEL_KEY] = team
        taints.append(
            {"key": nodes.TEAM_TAINT_KEY, "value": team, "effect": nodes.TEAM_TAINT_EFFECT}
        )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {MANAGED_KEY: MANAGED_VALUE}},
        "spec": {"taints": taints},
        "status": {
            "capacity": shape.resources(),
            "allocatable": shape.resources(),
            # Every field is required; kwok's node-initialize stage fills the empty ones.
            "nodeInfo": {
                **dict.fromkeys(NODE_INFO_FIELDS, ""),
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": shape.kubelet_version,
            },
        },
    }


def fleet_nodes(loaded: LoadedCluster, indices: Iterable[int]) -> list[dict[str, Any]]:
    """The fleet's nodes of these numbers (from 1). Node i belongs to the inventory's i-th team
    in turn, so a fleet that grows keeps every node's team; all are shared without teams."""
    shape = server_shape(loaded)
    teams = list(loaded.cluster.teams) or [None]
    return [node_object(node_name(i), shape, teams[(i - 1) % len(teams)]) for i in indices]


def pod_cidr(loaded: LoadedCluster) -> ipaddress.IPv4Network:
    """The addresses kwok gives the pods it plays: the pod network's last /16, far above the
    blocks real nodes take from its start (cni: routes numbers them by node address)."""
    network = loaded.cluster.networks.pod
    return list(network.subnets(new_prefix=max(16, network.prefixlen)))[-1]


# ---------------------------------------------------------------- the kwok controller


def fleet_dir(name: str) -> Path:
    return naming.LABS_DIR / name / "fleet"


def _pid_file(name: str) -> Path:
    return fleet_dir(name) / "kwok.pid"


def kubeconfig(loaded: LoadedCluster) -> Path:
    """The operator's kubeconfig that the kubernetes role fetched: the API through the balancer."""
    # Where the kubernetes role fetches it (its deploy's OPERATOR_KUBECONFIG).
    path = loaded.state_dir / "kubernetes" / "admin.conf"
    if not path.is_file():
        raise LabInvalid(f"no {path}: apply the lab's inventory first (`gpuinfra apply`)")
    return path


def configuration_document() -> dict[str, Any]:
    """kwok's own configuration: its workers sized for the fleet (KWOK_OPTIONS)."""
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": dict(KWOK_OPTIONS),
    }


def stage_documents() -> list[dict[str, Any]]:
    """kwok's stages as its module ships them (read from Go's module cache, where the build
    found them), the status heartbeat at kubelet's cadence."""
    go = shutil.which("go")
    if go is None:
        raise LabMissingTool("go is not installed: kwok's stages are read from its Go module")
    module = gobuild.module(KWOK_MODULE)
    source = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", KWOK],
        cwd=module.path,
        capture_output=True,
        text=True,
        check=False,
    )
    if source.returncode != 0 or not source.stdout.strip():
        raise LabError(f"cannot find kwok's module source: {source.stderr.strip()}")
    documents = []
    for stage in STAGES:
        document = yaml.safe_load((Path(source.stdout.strip()) / stage).read_text())
        documents.append(at_kubelet_cadence(document))
    return documents


def at_kubelet_cadence(stage: dict[str, Any]) -> dict[str, Any]:
    """The status heartbeat stage reporting as often as kubelet does; other stages unchanged."""
    if stage["metadata"]["name"] != HEARTBEAT_STAGE:
        return stage
    delay = {
        "durationMilliseconds": STATUS_REPORT_MS,
        "jitterDurationMilliseconds": STATUS_REPORT_MS + STATUS_REPORT_JITTER_MS,
    }
    return {**stage, "spec": {**stage["spec"], "delay": delay}}


def controller_argv(binary: Path, config: Path, admin: Path, cidr: str) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={admin}",
        f"--config={config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={MANAGED_KEY}={MANAGED_VALUE}",
        f"--node-lease-duration-seconds={LEASE_DURATION_S}",
        f"--cidr={cidr}",
    ]


def controller_pid(name: str) -> int | None:
    try:
        pid = int(_pid_file(name).read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if processes.alive(pid) and str(fleet_dir(name)).encode() in cmdline else None


def start_controller(name: str, loaded: LoadedCluster) -> int:
    """Start kwok for the lab unless it runs; its own session, so it outlives the command."""
    pid = controller_pid(name)
    if pid is not None:
        return pid
    module = gobuild.module(KWOK_MODULE)
    gobuild.build(module)  # the first fleet builds it (gobuild.ON_FIRST_USE): minutes, once
    binary = module.binary("kwok")
    folder = fleet_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "kwok.yaml"
    documents = [configuration_document(), *stage_documents()]
    config.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    argv = controller_argv(binary, config, kubeconfig(loaded), str(pod_cidr(loaded)))
    log = (folder / "kwok.log").open("ab")
    child = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
    )
    _pid_file(name).write_text(f"{child.pid}\n")
    time.sleep(START_WAIT_S)  # a bad flag or kubeconfig ends it within a second or two
    if child.poll() is not None:
        raise LabError(f"kwok exited with {child.returncode}; see {log.name}")
    return child.pid


def stop_controller(name: str) -> bool:
    """Stop the lab's kwok (`lab down` does); whether one ran."""
    pid = controller_pid(name)
    if pid is None:
        return False
    processes.send(pid, signal.SIGTERM)
    processes.stop([pid], deadline_s=5)
    return True


# ---------------------------------------------------------------- the nodes


def kubectl(loaded: LoadedCluster, *args: str, stdin: str | None = None) -> str:
    """kubectl of the lab's release with the lab's admin.conf; its output, or LabError."""
    binary = gobuild.kubernetes_module(loaded.cluster.versions.kubernetes).binary("kubectl")
    result = subprocess.run(
        [str(binary), f"--kubeconfig={kubeconfig(loaded)}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise LabError(f"kubectl {' '.join(args[:2])}: {tail}")
    return result.stdout


def simulated_nodes(loaded: LoadedCluster) -> dict[str, dict[str, Any]]:
    """The fleet's nodes in the cluster, by name."""
    listed = json.loads(kubectl(loaded, "get", "nodes", "-o", "json"))
    return {
        item["metadata"]["name"]: item
        for item in listed["items"]
        if item["metadata"].get("annotations", {}).get(MANAGED_KEY) == MANAGED_VALUE
    }


def node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def create(loaded: LoadedCluster, objects: list[dict[str, Any]]) -> None:
    """Create objects from several kubectl processes at once: nodes, as kubelets register
    together, or a batch of pods, as a controller creates them."""
    chunks = [objects[i : i + CREATE_CHUNK] for i in range(0, len(objects), CREATE_CHUNK)]
    binary = gobuild.kubernetes_module(loaded.cluster.versions.kubernetes).binary("kubectl")
    argv = [str(binary), f"--kubeconfig={kubeconfig(loaded)}", "create", "-f", "-"]
    running: list[subprocess.Popen[str]] = []
    failures: list[str] = []

    def finish(child: subprocess.Popen[str]) -> None:
        # Not communicate(): it flushes the stdin already written and closed below.
        assert child.stderr is not None
        err = child.stderr.read()
        child.wait()
        if child.returncode != 0:
            failures.append((err.strip().splitlines() or ["(no output)"])[-1])

    for chunk in chunks:
        if len(running) >= CREATE_PARALLEL:
            finish(running.pop(0))
        child = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None
        child.stdin.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": chunk}))
        child.stdin.close()
        running.append(child)
    for child in running:
        finish(child)
    if failures:
        raise LabError(f"{len(failures)} kubectl create failed; the last: {failures[-1]}")


def _wait_ready(name: str, loaded: LoadedCluster, count: int, deadline: float) -> None:
    while True:
        fleet = simulated_nodes(loaded)
        leases = json.loads(kubectl(loaded, "get", "leases", "-n", "kube-node-lease", "-o", "json"))
        leased = {item["metadata"]["name"] for item in leases["items"]}
        ready = {n for n, node in fleet.items() if node_ready(node)}
        if len(ready & leased) >= count:
            return
        if time.monotonic() > deadline:
            raise LabError(
                f"{len(ready & leased)} of {count} simulated nodes Ready with a Lease "
                f"{READY_TIMEOUT_S:.0f} s after the last was created ({len(ready)} Ready, "
                f"{len(leased & set(fleet))} with a Lease); see {fleet_dir(name)}/kwok.log"
            )
        # Each look lists every node: at thousands, a second apart, that was a load of its own.
        time.sleep(READY_POLL_S)


def lab_cluster(name: str) -> LoadedCluster:
    """The lab's inventory as its file says (teams added by hand included)."""
    from inventory.loader import load

    check_lab_name(name)
    state = read_state(name)
    if state is None or state.inventory_path is None:
        raise LabInvalid(f"no lab named {name}: start it with `gpuinfra lab up --name {name}`")
    if not state.kubernetes:
        raise LabInvalid(f"lab {name} runs no Kubernetes (it was booted with --no-kubernetes)")
    return load(state.inventory_path)


def scale(name: str, count: int) -> FleetResult:
    """Make the lab's fleet `count` simulated nodes: start kwok, create the missing ones, delete
    those above count, then wait until each is Ready with a Lease (READY_TIMEOUT_S from the
    last creation)."""
    if count < 0:
        raise LabInvalid(f"--nodes must be at least 0 (got {count})")
    loaded = lab_cluster(name)
    pid = start_controller(name, loaded) if count else controller_pid(name)
    existing = simulated_nodes(loaded)
    wanted = {node_name(i) for i in range(1, count + 1)}
    missing = [i for i in range(1, count + 1) if node_name(i) not in existing]
    extra = sorted(set(existing) - wanted)
    started = time.monotonic()
    if missing:
        create(loaded, fleet_nodes(loaded, missing))
    created = time.monotonic() - started
    if extra:
        kubectl(loaded, "delete", "nodes", "--wait=false", "--ignore-not-found", *extra)
    if count:
        _wait_ready(name, loaded, count, time.monotonic() + READY_TIMEOUT_S)
    return FleetResult(
        name=name,
        nodes=count,
        created=len(missing),
        deleted=len(extra),
        create_seconds=round(created, 1),
        ready_seconds=round(time.monotonic() - started, 1),
        controller_pid=pid,
    )
