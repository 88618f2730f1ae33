"""A Kubernetes upgrade by one minor, for real: a lab cluster on the oldest version go/ builds
(1.35) taken to the next (1.36) by `gpuinfra kubernetes upgrade`, both built on this machine
and served by the lab's file server and registry, while a client reads and writes through the
balancer the whole time and counts its errors.

Run by `make test-long` beside the fault suite, by hand, not in CI (`pytest -m
upgrade` alone): its own 13-host lab `<GPUINFRA_LAB_NAME>-k8s-up` (GPUINFRA_K8S_UPGRADE_LAB_NAME
overrides) with one apply and one upgrade takes about 15 minutes on the project's 2-core
machine, more than `make test` can spare. docs/kubernetes-lab.md keeps its figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from cli.exitcodes import ExitCode
from lab import gobuild, offline
from roles.kubernetes.audit import AUDIT_LOG_DIR
from tests.helpers import GPUINFRA
from tests.integration.conftest import LAB_NAME
from tests.integration.kube_lab import CONTROL_PLANE, NODES, Cluster, applied_lab, ready
from tests.integration.roles_helpers import failed_run, gpuinfra
from tests.integration.test_kubernetes import stored_in_etcd

pytestmark = [pytest.mark.integration, pytest.mark.upgrade]

UPGRADE_LAB = os.environ.get("GPUINFRA_K8S_UPGRADE_LAB_NAME", f"{LAB_NAME}-k8s-up")
# One prefix per run: a kept lab (GPUINFRA_LAB_KEEP=1) still holds an earlier run's ConfigMaps.
PROBE = f"upgrade-probe-{int(time.time())}-"
SECRET = f"upgrade-secret-{int(time.time())}"
AUDIT_ID = re.compile(r"Audit-Id: ([0-9a-f-]{36})")
# Each run's figures (build/upgrade/upgrade.json): docs/kubernetes-lab.md keeps them.
RESULTS = Path(__file__).resolve().parents[2] / "build" / "upgrade"


@dataclass
class Client:
    """Writes a ConfigMap and reads it back through the balancer, one pair after another, until
    stopped; records every failure (the operation, when, and kubectl's message)."""

    cluster: Cluster
    writes: list[str] = field(default_factory=list)  # names whose create succeeded
    operations: int = 0
    errors: list[tuple[float, str, str, str]] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)  # each failed request's kubectl -v=8 tail
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        index = 0
        while not self.stop.is_set():
            name = f"{PROBE}{index}"
            index += 1
            made = self.cluster.kubectl(
                "-v=8", "create", "configmap", name, "-n", "default", f"--from-literal=i={index}",
                check=False, timeout=30,
            )  # fmt: skip
            self._count("write", made)
            if made.returncode != 0:
                continue
            self.writes.append(name)
            read = self.cluster.kubectl(
                "-v=8", "get", "configmap", name, "-n", "default", "-o", "name",
                check=False, timeout=30,
            )  # fmt: skip
            self._count("read", read)
            time.sleep(0.5)

    def _count(self, what: str, result) -> None:
        self.operations += 1
        if result.returncode != 0:
            # kubectl -v=8 prints each response's headers: the Audit-Id names the request in the
            # audit log of the API server that answered it (none: no server answered).
            audit = AUDIT_ID.findall(result.stderr)
            message = result.stderr.strip().splitlines()[-1:] or [""]
            self.errors.append((time.time(), what, message[0][-300:], audit[-1] if audit else ""))
            self.stderr.append("\n".join(result.stderr.strip().splitlines()[-12:]))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    # `make install` builds the lab's own version only; the target is built here (about 12
    # minutes cold, nothing once built) and `lab up` publishes every build.
    for newer in gobuild.kubernetes_modules()[1:]:
        gobuild.build(newer)
    report = tmp_path_factory.mktemp("k8s-up") / "apply.json"
    for applied in applied_lab(UPGRADE_LAB, report, storage=False):
        assert offline.upgrades(), "lab up published no newer Kubernetes build"
        yield applied


def versions(cluster: Cluster) -> dict[str, str]:
    return {
        node["metadata"]["name"]: node["status"]["nodeInfo"]["kubeletVersion"]
        for node in cluster.get("nodes")["items"]
        if ready(node)
    }


def answered_by(cluster: Cluster, audit_id: str) -> list[tuple[str, dict]]:
    """The control-plane nodes whose audit log holds the request (its metadata: writes only),
    each with the event's user, decision and annotations."""
    if not audit_id:
        return []
    found = []
    for node in CONTROL_PLANE:
        logs = f"{AUDIT_LOG_DIR}/audit*.log"
        hit = cluster.lab.ssh(node, f"grep -h {audit_id} {logs}", check=False)
        for line in hit.stdout.splitlines():
            event = json.loads(line)
            keep = ("stage", "user", "responseStatus", "annotations", "requestReceivedTimestamp")
            found.append((node, {key: event.get(key) for key in keep}))
    return found


def run_stamped(*args: str, timeout: float) -> tuple[int, str, list[tuple[float, str]]]:
    """`gpuinfra ARGS` with each progress line (stderr) stamped as it comes: the failed client
    requests are set against the step the upgrade was in."""
    process = subprocess.Popen(
        [GPUINFRA, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    progress: list[tuple[float, str]] = []
    stdout: list[str] = []

    def read_stderr() -> None:
        for line in process.stderr:
            progress.append((time.time(), line.rstrip()))

    # Each stream read by a thread of its own (communicate() would read stderr too and take
    # lines from the stamped list); the wait carries the timeout.
    readers = [
        threading.Thread(target=read_stderr, daemon=True),
        threading.Thread(target=lambda: stdout.append(process.stdout.read()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        process.wait(timeout=timeout)
    finally:
        process.kill()
        for reader in readers:
            reader.join(timeout=10)
    return process.returncode, "".join(stdout), progress


def balancer_log(cluster: Cluster, since: float) -> list[tuple[float, str, str]]:
    """Every load balancer's HAProxy journal since `since` (epoch seconds): its server state
    changes and one tcplog line per client connection, naming the API server that took it and
    how the connection ended. The lab's hosts share this machine's clock."""
    lines = []
    for host in cluster.lab.loaded.cluster.in_group("loadbalancer"):
        journal = cluster.lab.ssh(
            host, f"journalctl -u haproxy -o short-unix --no-pager --since @{int(since)}",
            check=False, timeout=120,
        )  # fmt: skip
        for line in journal.stdout.splitlines():
            stamp, _, text = line.partition(" ")
            try:
                lines.append((float(stamp), host, text))
            except ValueError:
                continue
    return sorted(lines)


def test_an_upgrade_by_one_minor_keeps_the_api_serving(cluster):
    old = offline.published()
    (new, *_) = offline.upgrades()
    assert versions(cluster) == dict.fromkeys(NODES, old.kubernetes_version)
    cluster.kubectl("create", "secret", "generic", SECRET, "-n", "default", "--from-literal=v=1")
    client = Client(cluster)
    thread = threading.Thread(target=client.run, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        returncode, stdout, progress = run_stamped(
            "kubernetes", "upgrade", str(cluster.inventory), new.kubernetes_version.lstrip("v"),
            "--yes", "--format", "json", timeout=3600,
        )  # fmt: skip
    finally:
        client.stop.set()
        thread.join(timeout=120)
    seconds = time.monotonic() - started
    log = balancer_log(cluster, time.time() - seconds - 5) if client.errors else []
    for error, stderr in zip(client.errors, client.stderr, strict=True):
        print(f"failed request {error}: answered by {answered_by(cluster, error[3])}")
        step = [line for stamp, line in progress if stamp <= error[0]][-1:]
        print(f"  during: {step}")
        print("  kubectl:", stderr.replace("\n", "\n    "))
        for stamp, host, text in log:
            if error[0] - 8 <= stamp <= error[0] + 2:
                print(f"  {stamp:.3f} {host}: {text}")
    for stamp, line in progress:
        print(f"upgrade progress {stamp:.3f}: {line}")
    print(
        f"upgrade {old.kubernetes_version} -> {new.kubernetes_version}: {seconds:.0f} s; client: "
        f"{client.operations} operations, {len(client.errors)} errors: {client.errors}"
    )
    # The run's figures, kept whether or not it passes (a passing test's output is not shown).
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "upgrade.json").write_text(json.dumps({
        "from": old.kubernetes_version, "to": new.kubernetes_version, "seconds": round(seconds),
        "operations": client.operations, "errors": [list(e) for e in client.errors],
    }, indent=1) + "\n")  # fmt: skip
    assert returncode == ExitCode.OK, stdout[-4000:]
    assert versions(cluster) == dict.fromkeys(NODES, new.kubernetes_version)
    server = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert server["gitVersion"] == new.kubernetes_version
    for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        pods = cluster.get("pods", "-n", "kube-system", "-l", f"component={component}")["items"]
        images = {pod["spec"]["containers"][0]["image"] for pod in pods}
        assert images == {f"registry.k8s.io/{component}:{new.kubernetes_version}"}, component
    proxy = cluster.get("daemonset", "kube-proxy", "-n", "kube-system")
    image = proxy["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"registry.k8s.io/kube-proxy:{new.kubernetes_version}"
    # The new API servers kept the Secrets' encryption: the one written before reads back, one
    # written now reaches etcd as ciphertext.
    assert cluster.get("secret", SECRET, "-n", "default")["data"]["v"] == "MQ=="
    cluster.kubectl("create", "secret", "generic", f"{SECRET}-after", "-n", "default",
                    "--from-literal=v=2")  # fmt: skip
    stored = stored_in_etcd(cluster, f"/registry/secrets/default/{SECRET}-after")
    assert stored.startswith(b"k8s:enc:secretbox:v1:"), stored[:40]
    # Every write the client saw acknowledged is still there, and not one request failed while
    # each API server restarted in turn: the balancers check /readyz and each API server
    # serves on past their detection once told to stop (--shutdown-delay-duration).
    items = cluster.get("configmaps", "-n", "default")["items"]
    kept = {item["metadata"]["name"] for item in items}
    assert client.operations > 20
    assert client.errors == []
    # The probes stay: the lab goes with the module (one kubectl delete of some 400 names took
    # over two minutes), and a kept lab's next run has a prefix of its own.
    assert [name for name in client.writes if name not in kept] == []


def test_the_inventory_moved_to_the_new_version_converges_and_drift_is_clean(cluster, tmp_path):
    """The operator's next step: versions.kubernetes and the binaries' pins moved to the new
    release. One apply brings the role's own files in line (its kubeadm configuration names the
    version); kubeadm, kubelet and kubectl are left alone, and then drift is clean."""
    (new, *_) = offline.upgrades()
    data = yaml.safe_load(cluster.inventory.read_text())
    data["versions"]["kubernetes"] = new.kubernetes_version.lstrip("v")
    kubernetes = data["group_vars"]["all"]["kubernetes"]
    kubernetes["binary_sha256"] = dict(new.sha256)
    kubernetes["release_sha256"] = {}
    cluster.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    report = tmp_path / "moved.json"
    result = gpuinfra("apply", str(cluster.inventory), "--yes", "--report", str(report))
    assert result.returncode == ExitCode.OK, failed_run(result)
    installs = [
        (name, op["name"])
        for name, host in json.loads(report.read_text())["hosts"].items()
        for op in host["operations"]
        if op["changed"] and "Install kubeadm" in op["name"]
    ]
    assert installs == []
    for mode in ((), ("--exact",)):
        drift = gpuinfra("drift", str(cluster.inventory), "--format", "json", *mode)
        assert drift.returncode == ExitCode.OK, drift.stdout[-3000:] + drift.stderr[-2000:]
