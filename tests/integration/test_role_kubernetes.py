"""The kubernetes role's orchestration on lab hosts, against a STAND-IN kubeadm/kubectl/kubelet:
what has not run against the real cluster yet (tests/integration/test_kubernetes.py), the
upgrade, node removal and the node-local proxy above all.

Each test here runs the role's real code path (facts, `kubeadm config validate`, init, joins,
waits, the operator kubeconfig) against the stand-in of tests/integration/kube_standin.py,
which the TEST installs on the hosts and which records every call with its start and end time.
What these tests show is the order and pacing of the calls, idempotence and secret handling,
not a running control plane.

Own lab `<GPUINFRA_LAB_NAME>-kube` (GPUINFRA_KUBE_LAB_NAME overrides): one etcd member (the
inventory needs one), three control-plane nodes, one load balancer, three workers.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from cli.exitcodes import ExitCode
from inventory.versions import DEFAULT_ETCD
from lab import lifecycle
from lab.topology import HostSpec, Topology
from roles.kubernetes.operations import JOIN_SLOT_CHECK
from tests.integration import kube_standin
from tests.integration.conftest import KEEP_ENV, LAB_NAME, boot_lab
from tests.integration.roles_helpers import (
    STANDIN_APISERVER,
    ask_https,
    gpuinfra,
    install_standin_cert,
    pending,
)

pytestmark = pytest.mark.integration

KUBE_LAB = os.environ.get("GPUINFRA_KUBE_LAB_NAME", f"{LAB_NAME}-kube")
CONTROL_PLANE = ["cp-1", "cp-2", "cp-3"]
WORKERS = ["cpu-1", "cpu-2", "gpu-1"]
NODES = CONTROL_PLANE + WORKERS
JOIN_RATE_SECONDS = 3.0  # join_rate "1/3s": one worker per 3 s
# The report's slot times come from the controller's clock, the stand-in's starts from the
# hosts', which is the same kernel clock in the lab (LAB.md: systemd-nspawn hosts). The slots
# are spaced by the pacer itself; what lies between a slot and its host's join start is an SSH
# round trip and the stand-in's `kubeadm config validate`, which a loaded machine stretches to
# a second and more (stop 59's CI): the spacing is read from the slots, never from the starts.
CLOCK_EPSILON_S = 0.01
TEAM = "research"


def kube_topology() -> Topology:
    hosts = (
        HostSpec("etcd-1", ("etcd",)),
        *(HostSpec(name, ("control_plane",)) for name in CONTROL_PLANE),
        HostSpec("lb-1", ("loadbalancer",)),
        HostSpec("cpu-1", ("cpu_worker",)),
        HostSpec("cpu-2", ("cpu_worker",)),
        HostSpec("gpu-1", ("gpu_worker",), gpu=True),
    )
    return Topology(hosts, "kube")


@pytest.fixture(scope="module")
def lab():
    inventory = Path(f"/tmp/gpuinfra-itest-{KUBE_LAB}/cluster.yml")
    cluster = boot_lab(KUBE_LAB, kube_topology(), inventory)
    yield cluster
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(KUBE_LAB)


# The machine mounts cgroup v1 (LAB.md), which kubelet 1.35 refuses: the lab's own escape, as
# lab/inventory.py declares it, or the role stops every node before anything else.
CGROUP_V1_ESCAPE = {"fail_cgroup_v1": False, "accept_unsafe": ["fail_cgroup_v1"]}


def inventory_with(
    lab, path: Path, teams: dict | None = None, escape: dict = CGROUP_V1_ESCAPE, **settings
) -> Path:
    data = yaml.safe_load(lab.inventory_path.read_text())
    data.setdefault("group_vars", {}).setdefault("all", {})["kubernetes"] = {**escape, **settings}
    # This lab runs no Kubernetes build, so its inventory pins Debian's etcd 3.5.16, which
    # kubeadm 1.35 refuses (validate says so); the stand-in never reads etcd and no test here
    # applies the etcd role, so the pins are the installable set's.
    data["versions"] = {**data.get("versions", {}), "etcd": DEFAULT_ETCD}
    if teams:
        data["teams"] = teams
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def standin_inventory(lab) -> Path:
    """The lab's inventory with `source: preinstalled` (the stand-in is the host image's
    kubeadm), a join rate of one worker per 3 s and gpu-1 in a team of its own; the stand-in
    installed, logs cleared."""
    version = lab.loaded.cluster.versions.kubernetes
    for node in NODES:
        # A kept lab starts over: nothing joined, nothing recorded.
        lab.ssh(node, f"rm -rf /etc/kubernetes {kube_standin.LOG} /var/lib/kube-standin")
        lab.ssh(node, kube_standin.install_commands(version))
    return inventory_with(
        lab,
        lab.inventory_path.with_name("kube.yml"),
        teams={TEAM: {"hosts": ["gpu-1"]}},
        source="preinstalled",
        join_rate=f"1/{JOIN_RATE_SECONDS:g}s",
    )


def apply(inventory: Path, report: Path, *extra: str):
    return gpuinfra(
        "apply", str(inventory), "--roles", "kubernetes", "--yes", "--report", str(report), *extra
    )


def kubeadm(entries: list[dict], *words: str) -> list[dict]:
    def head(entry: dict) -> list[str]:
        return [a for a in entry["argv"] if not a.startswith("-")][: len(words)]

    return [e for e in entries if e["tool"] == "kubeadm" and head(e) == list(words)]


def test_without_packages_the_role_stops_with_one_clear_message(lab, tmp_path):
    """A package repository the host cannot reach: the role stops on that host with one line
    saying so and what to set instead (runs before the stand-in exists). The repository is the
    host's own loopback on a port where nothing listens, never pkgs.k8s.io itself: lab hosts
    only ever talk to the lab and the Debian mirror."""
    inventory = inventory_with(lab, tmp_path / "cluster.yml", repo_url="http://127.0.0.1:9")
    report_path = tmp_path / "report.json"
    result = apply(inventory, report_path, "--limit", "cpu-1")
    assert result.returncode == ExitCode.ERROR, result.stdout[-2000:] + result.stderr[-2000:]
    host = json.loads(report_path.read_text())["hosts"]["cpu-1"]
    assert host["status"] == "failed"
    assert "kubernetes: cannot fetch the Kubernetes package key" in host["error"], host["error"]
    assert "kubernetes.source" in host["error"]


def test_a_cgroup_v1_host_stops_before_anything_is_installed(lab, tmp_path):
    """Issue 46: the lab's hosts run cgroup v1, which kubelet 1.35 refuses. Without the lab's
    declared escape the role stops the host at its first step, saying so and what to set,
    where a join would have waited minutes on a kubelet that exits at once. The control: the
    test above, with the escape, reaches the package step."""
    # The repository of the test above (nothing listens there): the check comes before it.
    inventory = inventory_with(
        lab, tmp_path / "cluster.yml", escape={}, repo_url="http://127.0.0.1:9"
    )
    report_path = tmp_path / "report.json"
    result = apply(inventory, report_path, "--limit", "cpu-1")
    assert result.returncode == ExitCode.ERROR, result.stdout[-2000:] + result.stderr[-2000:]
    host = json.loads(report_path.read_text())["hosts"]["cpu-1"]
    assert host["status"] == "failed"
    said = json.dumps(host)
    assert "this host runs cgroup v1, which kubelet 1." in said, said[-2000:]
    assert "kubernetes.fail_cgroup_v1: false" in said
    assert not [op for op in host["operations"] if op["changed"] and "Install" in op["name"]]


def test_init_once_control_plane_one_at_a_time_workers_paced_no_token_shown(
    lab, standin_inventory, tmp_path
):
    """Against the stand-in: one `kubeadm init` (on cp-1), `kubeadm config validate` before it
    and before each join, the other control-plane joins strictly one after the other, worker
    joins never faster than the rate limit, and no issued token or certificate key in the CLI
    output or the report."""
    planned = gpuinfra("plan", str(standin_inventory), "--roles", "kubernetes", "--format", "json")
    assert planned.returncode == ExitCode.DRIFT, planned.stderr[-2000:]
    pending_ops = pending(json.loads(planned.stdout))
    for node in NODES:
        wanted = "Write /etc/kubernetes/gpuinfra/kubeadm.yaml"
        assert any(name.endswith(wanted) for name in pending_ops[node]), pending_ops[node]
    assert kube_standin.changes(kube_standin.calls(lab, NODES)) == []  # plan changed nothing
    report_path = tmp_path / "report.json"
    result = apply(standin_inventory, report_path)
    assert result.returncode == ExitCode.OK, result.stdout[-4000:] + result.stderr[-3000:]
    entries = kube_standin.calls(lab, NODES)

    inits = kubeadm(entries, "init")
    assert [(e["host"], e["rc"]) for e in inits if "phase" not in e["argv"]] == [("cp-1", 0)]
    joins = kubeadm(entries, "join")
    assert sorted(e["host"] for e in joins) == sorted(NODES[1:])
    assert all(e["rc"] == 0 for e in joins)
    validations = kubeadm(entries, "config", "validate")
    for call in inits[:1] + joins:
        before = [v for v in validations if v["host"] == call["host"] and v["end"] <= call["start"]]
        assert before, f"{call['host']}: no kubeadm config validate before {call['argv']}"

    control_joins = [e for e in joins if e.get("control_plane")]
    assert sorted(e["host"] for e in control_joins) == ["cp-2", "cp-3"]
    for earlier, later in pairwise(control_joins):
        assert later["start"] >= earlier["end"], (earlier, later)
    assert control_joins[0]["start"] >= inits[0]["end"]

    report = json.loads(report_path.read_text())
    slots = {
        name: [c["at"] for c in report["hosts"][name]["checks"] if c["check"] == JOIN_SLOT_CHECK]
        for name in NODES
    }
    assert {name: len(times) for name, times in slots.items()} == {
        **{name: 0 for name in CONTROL_PLANE},  # control-plane joins go one at a time, unpaced
        **{name: 1 for name in WORKERS},
    }
    slot_times = sorted(times[0] for times in slots.values() if times)
    gaps = [b - a for a, b in pairwise(slot_times)]
    print("worker join slot gaps (s):", [round(g, 2) for g in gaps])
    assert min(gaps) >= JOIN_RATE_SECONDS - CLOCK_EPSILON_S, gaps
    worker_joins = [e for e in joins if not e.get("control_plane")]
    for join in worker_joins:  # each host's join began only once its slot had come
        (slot,) = slots[join["host"]]
        assert join["start"] >= slot - CLOCK_EPSILON_S, (join, slot)
    print(
        "slot to join start (s):",
        [round(j["start"] - slots[j["host"]][0], 2) for j in worker_joins],
    )

    secrets = kube_standin.issued_secrets(lab, "cp-1")
    assert len(secrets) >= 2  # a token and a certificate key were issued and used
    report_text = report_path.read_text()
    for secret in secrets:
        assert secret not in result.stdout and secret not in result.stderr
        assert secret not in report_text
    # Positive control of the search: the issued values are real and findable where they are.
    assert all(secret in lab.ssh("cp-1", f"cat {kube_standin.ISSUED}").stdout for secret in secrets)
    left = lab.ssh("cp-2", "ls -A /etc/kubernetes/gpuinfra/private").stdout.strip()
    assert left == ""  # the filled-in join file is removed after the join

    kubeconfig = standin_inventory.parent / ".state" / "kubernetes" / "admin.conf"
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
    assert "stand-in admin.conf" in kubeconfig.read_text()


def test_second_apply_makes_no_changing_call(lab, standin_inventory, tmp_path):
    """Against the stand-in, after the test above: a second apply changes no host and makes no
    init, join, token or reset call."""
    before = kube_standin.calls(lab, NODES)
    report_path = tmp_path / "report.json"
    result = apply(standin_inventory, report_path)
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    after = kube_standin.calls(lab, NODES)
    new = after[len(before) :]
    assert kube_standin.changes(new) == [], kube_standin.changes(new)
    assert kube_standin.changes(before)  # positive control: the first apply made such calls
    report = json.loads(report_path.read_text())
    changed = {
        n: [o["name"] for o in h["operations"] if o["changed"]]
        for n, h in report["hosts"].items()
        if h["status"] != "ok"
    }
    assert changed == {}
    planned = gpuinfra("plan", str(standin_inventory), "--roles", "kubernetes", "--format", "json")
    assert planned.returncode == ExitCode.OK, planned.stdout[-3000:]


_words = kube_standin.words


def test_node_remove_then_add_again(lab, standin_inventory):
    """Against the stand-in: `node remove cpu-2` cordons, drains and deletes it (on cp-1) before
    `kubeadm reset` on cpu-2; `node add cpu-2` joins it again, once."""
    before = len(kube_standin.calls(lab, NODES))
    result = gpuinfra("kubernetes", "node", "remove", str(standin_inventory), "cpu-2", "--yes")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    entries = kube_standin.calls(lab, NODES)[before:]
    steps = [
        (e["host"], _words(e)[0])
        for e in entries
        if _words(e)[:1] in (["cordon"], ["drain"], ["delete"], ["reset"])
    ]
    assert steps == [("cp-1", "cordon"), ("cp-1", "drain"), ("cp-1", "delete"), ("cpu-2", "reset")]
    assert lab.ssh("cpu-2", "test -e /etc/kubernetes/kubelet.conf", check=False).returncode == 1

    before = len(kube_standin.calls(lab, NODES))
    added = gpuinfra("kubernetes", "node", "add", str(standin_inventory), "cpu-2")
    assert added.returncode == ExitCode.OK, added.stdout[-3000:] + added.stderr[-2000:]
    joins = kubeadm(kube_standin.calls(lab, NODES)[before:], "join")
    assert [(e["host"], e["rc"]) for e in joins] == [("cpu-2", 0)]
    for secret in kube_standin.issued_secrets(lab, "cp-1"):
        assert secret not in added.stdout and secret not in added.stderr


def test_node_local_proxy_reaches_the_api_servers_without_a_balancer(
    lab, standin_inventory, tmp_path
):
    """Real HAProxy (Debian's) on every node when the inventory has no load balancer: the same
    lab without lb-1 in its inventory. With a throwaway HTTPS server on cp-2:6443 standing in
    for kube-apiserver (kubeadm ran as the stand-in) and answering the proxy's /readyz
    checks, cpu-1's 127.0.0.1:6444 reaches cp-2."""
    data = yaml.safe_load(standin_inventory.read_text())
    del data["hosts"]["lb-1"]
    inventory = standin_inventory.with_name("kube-no-lb.yml")
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    report_path = tmp_path / "report.json"
    result = apply(inventory, report_path, "--limit", ",".join(NODES))
    assert result.returncode == ExitCode.OK, result.stdout[-4000:] + result.stderr[-2000:]
    for node in NODES:
        state = lab.ssh(node, "systemctl is-active kube-api-proxy", check=False).stdout.strip()
        assert state == "active", node
    install_standin_cert(lab, "cp-2")
    listener = f"python3 -c {shlex.quote(STANDIN_APISERVER)} 6443"
    lab.ssh("cp-2", f"systemd-run --unit=gpuinfra-test-apiserver {listener}")
    try:
        ask = ask_https("https://127.0.0.1:6444/hostname")
        answer = lab.ssh("cpu-1", f"python3 -c {shlex.quote(ask)}", timeout=120).stdout
        assert answer.strip() == "cp-2"
    finally:
        lab.ssh("cp-2", "systemctl stop gpuinfra-test-apiserver", check=False)
    # Negative control: with the listener gone, the proxy has nothing to hand the connection to.
    refused = lab.ssh(
        "cpu-1",
        'python3 -c "import socket; s=socket.create_connection(('
        "'127.0.0.1', 6444), timeout=3); print(s.recv(100) or b'closed')\"",
        check=False,
    )
    assert "cp-2" not in refused.stdout


def test_upgrade_runs_in_the_documented_order(lab, standin_inventory):
    """Against the stand-in, on the cluster joined above (last: the stand-in's kubeadm on cp-1
    then reports the new version): `upgrade apply` on cp-1, then
    `upgrade node` on cp-2 and cp-3 strictly one after the other, then each worker (budget 34%
    of three: one at a time) drained before its upgrade and uncordoned after it, before the
    next worker is drained."""
    before = len(kube_standin.calls(lab, NODES))
    result = gpuinfra(
        "kubernetes",
        "upgrade",
        str(standin_inventory),
        "1.36.0",
        "--budget",
        "34",
        "--yes",
        "--format",
        "json",
    )
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    entries = kube_standin.calls(lab, NODES)[before:]
    upgrades = [e for e in entries if _words(e)[:1] == ["upgrade"] and _words(e)[1] != "plan"]
    order = [(e["host"], _words(e)[1]) for e in upgrades]
    assert order == [
        ("cp-1", "apply"),
        ("cp-2", "node"),
        ("cp-3", "node"),
        ("gpu-1", "node"),
        ("cpu-1", "node"),
        ("cpu-2", "node"),
    ]
    for earlier, later in pairwise(upgrades):
        assert later["start"] >= earlier["end"], (earlier, later)
    for worker in ("cpu-1", "cpu-2", "gpu-1"):
        node_upgrade = next(e for e in upgrades if e["host"] == worker)
        drain = next(e for e in entries if _words(e)[:2] == ["drain", worker])
        uncordon = next(e for e in entries if _words(e)[:2] == ["uncordon", worker])
        assert drain["host"] == uncordon["host"] == "cp-1"
        assert drain["end"] <= node_upgrade["start"] and uncordon["start"] >= node_upgrade["end"]
    drains = [e for e in entries if _words(e)[:1] == ["drain"]]
    uncordons = [e for e in entries if _words(e)[:1] == ["uncordon"]]
    for uncordon, next_drain in zip(uncordons, drains[1:], strict=False):
        assert next_drain["start"] >= uncordon["end"]  # one worker out at a time
