"""`gpuinfra drift --job` on the Kubernetes lab (docs/design/fleet-jobs.md section 7 step 5).

Part of every run, the first module on the Kubernetes lab that test_kubernetes.py and
test_kubernetes_apply_job.py share after it (tests/integration/kube_lab.py: the Job enabled with
`nodes: [cpu-1]`, the lab's own gpuinfra image, `cni: routes` with `routes_nat_outgoing`); the
lab's apply is its first test's setup. `pytest -m fleetjob` selects the two Job modules. Each
test leaves the hosts as it found them.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from cli.exitcodes import ExitCode
from lab import lifecycle
from roles.drift_job.files import SSHD_DROPIN
from tests.helpers import GPUINFRA
from tests.integration.kube_lab import DRIFT_JOB_NODE as NODE
from tests.integration.kube_lab import Cluster
from tests.integration.roles_helpers import gpuinfra

pytestmark = [pytest.mark.integration, pytest.mark.fleetjob]

NAMESPACE = "gpuinfra"
JOB = "gpuinfra-drift-{cluster}"
SSHD_GLOBALS = ("passwordauthentication", "permitrootlogin", "x11forwarding", "port")


@pytest.fixture(scope="module")
def cluster(kubernetes_lab) -> Cluster:
    return kubernetes_lab


def drift(cluster: Cluster, *extra: str) -> tuple[int, dict]:
    report = cluster.inventory.parent / f"drift-{time.monotonic_ns()}.json"
    result = gpuinfra(
        "drift", str(cluster.inventory), "--format", "json", "--report", str(report), *extra
    )
    return result.returncode, json.loads(report.read_text())


def statuses(report: dict) -> dict[str, str]:
    return {name: host["status"] for name, host in report["hosts"].items()}


def pod_ssh(
    cluster: Cluster, node: str, target: str, *options: str, command: str = ""
) -> subprocess.CompletedProcess:
    """ssh from a throwaway pod on `node` with the drift key, as a shard connects, with these
    options and remote command. The key goes in the pod's manifest on kubectl's stdin, never
    on a command line."""
    image = yaml.safe_load(cluster.inventory.read_text())["group_vars"]["all"]["drift_job"]["image"]
    key = (cluster.inventory.parent / ".state" / "drift" / "id_ed25519").read_text()
    script = (
        'umask 077; mkdir -p /tmp/k; printf "%s" "$KEY" > /tmp/k/id; '
        "ssh -F /dev/null -T -i /tmp/k/id -o BatchMode=yes -o StrictHostKeyChecking=no "
        f"-o UserKnownHostsFile=/dev/null {' '.join(options)} gpuinfra-drift@{target} {command}"
    )
    name = f"drift-ssh-{time.monotonic_ns() % 1000000}"
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)  # made by drift --job too
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                # The namespace enforces the restricted pod security standard.
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "probe",
                        "image": image,
                        "command": ["sh", "-c", script],
                        "env": [{"name": "KEY", "value": key}, {"name": "HOME", "value": "/tmp"}],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            },
        }
    )
    try:
        for _ in range(90):
            pod = cluster.get("pod", "-n", NAMESPACE, name)
            if pod["status"].get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(2)
        ended = pod["status"]["containerStatuses"][0]["state"].get("terminated", {})
        logs = cluster.kubectl("logs", "-n", NAMESPACE, name, check=False)
        return subprocess.CompletedProcess(
            ["ssh", target], ended.get("exitCode", -1), logs.stdout, logs.stdout + logs.stderr
        )
    finally:
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=false", check=False)


INDEX = "batch.kubernetes.io/job-completion-index"


def running_pods(cluster: Cluster, job: str, index: int) -> list[dict]:
    pods = cluster.get("pods", "-n", NAMESPACE, "-l", f"job-name={job}")["items"]
    return [
        pod
        for pod in pods
        if pod["metadata"]["annotations"].get(INDEX) == str(index)
        and pod["status"].get("phase") == "Running"
    ]


def test_job_equals_local_drift(cluster):
    local_code, local = drift(cluster)
    job_code, job = drift(cluster, "--job", "--shards", "2")
    assert job_code == local_code == ExitCode.OK
    assert statuses(job) == statuses(local)
    # Every host settled by the shards, none left to the controller's exact check.
    hosts = len(cluster.lab.loaded.cluster.hosts)
    settled = f"drift --job: 2 shard(s) settled {hosts} of {hosts} hosts"
    assert any(note.startswith(settled) for note in job["notes"]), (local["notes"], job["notes"])


def test_an_edit_on_a_host_outside_the_pod_network_is_found_both_ways(cluster):
    """dns-1 is no Kubernetes node: its answer reaches the pod only through the masquerade."""
    path = "/etc/bind/named.conf.options"
    cluster.lab.ssh("dns-1", f"cp -p {path} /root/named.options.bak && echo '# edit' >> {path}")
    try:
        local_code, local = drift(cluster)
        job_code, job = drift(cluster, "--job")
        assert local_code == job_code == ExitCode.DRIFT
        assert statuses(job)["dns-1"] == statuses(local)["dns-1"] == "drift"
    finally:
        cluster.lab.ssh("dns-1", f"mv /root/named.options.bak {path}")
    # Put back as it was (cp -p: owner, mode and times), for the tests after this one.
    assert drift(cluster)[0] == ExitCode.OK


def test_a_deleted_pod_is_retried_and_the_report_is_complete(cluster):
    """A host of shard 1 whose ssh drops the pods' packets keeps its pod waiting; the pod is
    deleted, the host restored: the retry reports, and the report names every host. Only
    the pods' ssh is cut (from cpu-1's address, which the masquerade gives them, or from the
    pod network): a whole partition left the balancer's health checks marking it down for a
    moment after the heal, which the controller's exact check rightly called drift. The
    connect timeout outlasts the delete: at the default 10 s the shard could report the host
    unreachable and end before the delete reached it (a loaded machine), and no retry came."""
    loaded = cluster.lab.loaded
    shard_one = sorted(loaded.cluster.hosts)[1::2]
    victim = next(name for name in shard_one if name not in ("cp-1", NODE))
    sources = f"{{ {cluster.lab.address(NODE)}, {loaded.cluster.networks.pod} }}"
    cluster.lab.ssh(
        victim,
        "nft add table ip podcut && nft add chain ip podcut in "
        "'{ type filter hook input priority -300; policy accept; }' && "
        f"nft add rule ip podcut in ip saddr '{sources}' tcp dport 22 drop",
    )  # its shard's pod waits on ssh
    name = JOB.format(cluster=loaded.cluster.name)
    job = subprocess.Popen(
        [
            *(GPUINFRA, "drift", str(cluster.inventory), "--job", "--shards", "2"),
            *("--connect-timeout", "300", "--format", "json"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(60):
            running = running_pods(cluster, name, 1)
            if running:
                cluster.kubectl("delete", "pod", "-n", NAMESPACE, running[0]["metadata"]["name"])
                break
            time.sleep(2)
        else:
            pytest.fail("shard 1's pod never ran")
    finally:
        cluster.lab.ssh(victim, "nft delete table ip podcut")
    output, _ = job.communicate(timeout=900)
    report = json.loads(output)
    assert set(report["hosts"]) == set(loaded.cluster.hosts)
    errors = {
        name: host.get("error") for name, host in report["hosts"].items() if host.get("error")
    }
    assert job.returncode == ExitCode.OK, (report["notes"], errors)
    # The retry reported: the controller did not check shard 1 for want of its report.
    assert not any("pod and report gone" in note for note in report["notes"]), report["notes"]


def test_evicting_a_shard_does_not_count_against_its_retries(cluster):
    """The partitioned host is no Kubernetes node: cut off for longer than the node monitor's
    grace period (40 s), a node goes NotReady, and the modules after this one read the
    nodes."""
    loaded = cluster.lab.loaded
    shard_zero = sorted(loaded.cluster.hosts)[0::2]
    nodes = set(cluster.nodes_after_apply)
    victim = next(name for name in shard_zero if name not in nodes)
    lifecycle.partition(cluster.lab.name, victim)  # its shard's pod waits on ssh
    name = JOB.format(cluster=loaded.cluster.name)
    job = subprocess.Popen(
        [
            *(GPUINFRA, "drift", str(cluster.inventory), "--job", "--shards", "2"),
            *("--connect-timeout", "300"),  # the pod waits until evicted, as above
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(60):
            zero = running_pods(cluster, name, 0)
            if zero:
                pod = zero[0]["metadata"]["name"]
                eviction = {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": pod, "namespace": NAMESPACE},
                }
                cluster.kubectl(
                    "create", "--raw",
                    f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction", "-f", "-",
                    stdin=json.dumps(eviction),
                )  # fmt: skip
                time.sleep(5)
                pods = cluster.get("pods", "-n", NAMESPACE, "-l", f"job-name={name}")["items"]
                counts = {
                    p["metadata"]["annotations"].get("batch.kubernetes.io/job-index-failure-count")
                    for p in pods
                    if p["metadata"]["name"] != pod
                    and p["metadata"]["annotations"].get(INDEX) == "0"
                }  # fmt: skip
                assert counts <= {"0", None}, counts
                break
            time.sleep(2)
        else:
            pytest.fail("shard 0's pod never ran")
    finally:
        lifecycle.partition(cluster.lab.name, victim, partitioned=False)
        job.wait(timeout=900)


def test_from_a_pod_the_key_runs_the_probe_and_nothing_else(cluster):
    answer = pod_ssh(cluster, NODE, cluster.lab.address("etcd-1"), command="id")
    assert answer.returncode == 0, answer.stderr
    assert "gpuinfra-drift-probe-begin" in answer.stdout  # the probe, not `id`
    assert "uid=" not in answer.stdout
    # A remote forward is asked for at login (a local one only when used): refused, ssh exits.
    forwarded = pod_ssh(
        cluster, NODE, cluster.lab.address("etcd-1"),
        "-N", "-o", "ExitOnForwardFailure=yes", "-R", "1234:127.0.0.1:22",
    )  # fmt: skip
    assert forwarded.returncode == 255, forwarded.stderr
    assert "forwarding failed" in forwarded.stderr, forwarded.stderr


def test_the_key_is_refused_from_other_pods_and_from_the_controller(cluster):
    other = pod_ssh(cluster, "gpu-1", cluster.lab.address("etcd-1"))
    assert other.returncode == 255 and "Permission denied" in other.stderr
    key = cluster.inventory.parent / ".state" / "drift" / "id_ed25519"
    here = subprocess.run(
        ["ssh", "-F", "/dev/null", "-T", "-i", str(key), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         f"gpuinfra-drift@{cluster.lab.address('etcd-1')}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert here.returncode == 255 and "Permission denied" in here.stderr


def test_the_sshd_globals_are_unchanged(cluster):
    """The drop-in is a trailing Match: every global setting reads as without it."""
    host = "etcd-1"
    keys = "|".join(SSHD_GLOBALS)
    query = f"sshd -T | grep -E '^({keys}) ' | sort"
    with_it = cluster.lab.ssh(host, query).stdout
    cluster.lab.ssh(host, f"mv {SSHD_DROPIN} /root/dropin.bak")
    try:
        without = cluster.lab.ssh(host, query).stdout
    finally:
        cluster.lab.ssh(host, f"mv /root/dropin.bak {SSHD_DROPIN}")
    assert with_it == without and with_it
