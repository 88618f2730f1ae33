"""The Kubernetes lab: the default topology (the lab `make demo` converges, its three storage
hosts' CephFS included) with Kubernetes on, booted and applied once per run and shared by every
module that tests the real cluster, in this order: test_drift_job.py (the fleet's converged
records are the apply's own), test_kubernetes.py (its joins are the apply's, its simulated
fleet deleted again) and test_kubernetes_apply_job.py (the rollout re-joins the workers from
pods), through the `kubernetes_lab` fixture (tests/integration/conftest.py). It goes down after
the last of them.

Its inventory carries what each of them exercises: a team and a second one owning no node, a
balloon pool, a join rate slow enough to see, the drift Job on cpu-1 and the rollout Job on cp-2
(the workers are what it rolls, so its pods cannot run there), both with the lab's own gpuinfra
image, and `cni: routes` masquerading pod traffic as it does by default (the drift Job's pods
and CoreDNS reach hosts outside the pod network). The storage hosts are there for the rollout:
its pods apply every role to the workers, the CephFS client's with the state entries it reads
(issue 47.10: `apply --job` failed on every cluster with storage hosts).
test_kubernetes_upgrade.py boots a lab of its own with `applied_lab`, without them
(`storage=False`): an upgrade touches no storage host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from cli.exitcodes import ExitCode
from lab import gobuild, lifecycle
from lab.topology import Topology, default_topology
from tests.helpers import FIRST_APPLY_S
from tests.integration.conftest import KEEP_ENV, LAB_NAME, LabCluster, boot_lab
from tests.integration.roles_helpers import gpuinfra

KUBE_LAB = os.environ.get("GPUINFRA_K8S_LAB_NAME", f"{LAB_NAME}-k8s")
CONTROL_PLANE = ["cp-1", "cp-2", "cp-3"]
WORKERS = ["cpu-1", "gpu-1"]
NODES = CONTROL_PLANE + WORKERS
TEAM = "research"
# A second team, owning no lab node: its namespace is where another team's pods come from.
OTHER_TEAM = "inference"
JOIN_RATE_S = 20
BALLOON_CPU = "700m"  # of cpu-1's 1 CPU allocatable (2 cores less the role's reservations)
DRIFT_JOB_NODE = "cpu-1"
ROLLOUT_JOB_NODE = "cp-2"


@dataclass(frozen=True)
class Cluster:
    lab: LabCluster
    inventory: Path
    apply_report: dict
    apply_seconds: float
    # The nodes as the apply left them, read at its end: their Ready conditions' times are
    # the joins', which a later module's fault (a node partitioned) moves on.
    nodes_after_apply: dict = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.inventory.parent / ".state" / "kubernetes" / "admin.conf"

    @property
    def gateway(self) -> str:
        return str(self.lab.loaded.cluster.networks.admin[0].network_address)

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        version = self.lab.loaded.cluster.versions.kubernetes
        binary = gobuild.kubernetes_module(version).binary("kubectl")
        result = subprocess.run(
            [str(binary), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def create(self, *documents: dict, dry_run: bool = False, check: bool = True):
        text = yaml.safe_dump_all(documents)
        extra = ["--dry-run=server"] if dry_run else []
        return self.kubectl("create", "-f", "-", *extra, stdin=text, check=check)


def lab_inventory(path: Path) -> None:
    """The lab's own inventory, with what its modules exercise (see the module's docstring)."""
    data = yaml.safe_load(path.read_text())
    data["teams"] = {TEAM: {"hosts": ["gpu-1"]}, OTHER_TEAM: {"hosts": []}}
    everyone = data["group_vars"]["all"]
    everyone["kubernetes"]["join_rate"] = f"1/{JOIN_RATE_S}s"
    everyone["fleet_policy"] = {
        "balloons": {"warm": {"replicas": 1, "cpu": BALLOON_CPU, "memory": "32Mi"}}
    }
    image = everyone["gpu_health"]["image"]  # the lab's gpuinfra image, built from this checkout
    job = {"enabled": True, "image": image, "cpu": "100m"}
    everyone["drift_job"] = {**job, "nodes": [DRIFT_JOB_NODE], "parallel": 16}
    everyone["rollout_job"] = {
        **job, "nodes": [ROLLOUT_JOB_NODE], "shards": 2, "budget": 1, "deadline_seconds": 1800
    }  # fmt: skip
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def kubernetes_topology(storage: bool = True) -> Topology:
    """The default lab's hosts, without the storage group's unless `storage`."""
    hosts = default_topology().hosts
    if not storage:
        hosts = tuple(host for host in hosts if "storage" not in host.groups)
    return Topology(hosts, "kubernetes")


def applied_lab(name: str, report: Path, prepare=None, storage: bool = True) -> Iterator[Cluster]:
    """A lab with Kubernetes on (`prepare` edits its inventory first), applied once; taken
    down when the generator is closed unless kept (GPUINFRA_LAB_KEEP=1)."""
    inventory = Path(f"/tmp/gpuinfra-itest-{name}/cluster.yml")
    lab = boot_lab(name, kubernetes_topology(storage), inventory, kubernetes=True)
    if lab.fresh:
        # An earlier run's state describes a cluster that went down with its lab (a killed
        # run left a key rotation's next key there once, and every later apply stopped on it).
        shutil.rmtree(lab.loaded.state_dir, ignore_errors=True)
    try:
        if prepare is not None:
            prepare(inventory)
        started = time.monotonic()
        result = gpuinfra(
            "apply", str(inventory), "--yes", "--report", str(report), timeout=FIRST_APPLY_S
        )
        seconds = time.monotonic() - started
        assert result.returncode == ExitCode.OK, result.stdout[-4000:] + result.stderr[-3000:]
        print(f"apply of the {name} lab, Kubernetes included: {seconds:.0f} s")
        cluster = Cluster(lab, inventory, json.loads(report.read_text()), seconds)
        nodes = cluster.get("nodes")["items"]
        yield replace(cluster, nodes_after_apply={n["metadata"]["name"]: n for n in nodes})
    finally:
        # Also when the apply failed: 13 hosts left running would weigh on every later module.
        if os.environ.get(KEEP_ENV) != "1":
            lifecycle.down(name)


def ready(node: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
