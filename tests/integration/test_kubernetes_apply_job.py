"""`gpuinfra apply --job` on the Kubernetes lab (docs/design/fleet-jobs.md sections 5 and 7).

Part of every run, the last module on the Kubernetes lab that test_drift_job.py and
test_kubernetes.py share before it (tests/integration/kube_lab.py: the rollout Job enabled on
cp-2, the workers being what it rolls so its pods cannot run there, budget 1, two shards);
`pytest -m fleetjob` selects the two Job modules alone. Each test removes both workers from the
cluster (`kubernetes node remove --force`) and has the Job apply every role to them, joining
them again: both workers Ready again. It runs last because a rollout from pods leaves the
controller's converged records of the workers as they were (the pods' own records stay in the
pods, docs/fleet-jobs.md), and re-joins the workers that test_kubernetes.py's join test reads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from itertools import pairwise

import pytest

from cli.exitcodes import ExitCode
from engine.context import load
from roles.rollout_job.files import KEY
from roles.rollout_job.files import STATE_KEY as ROLLOUT_STATE_KEY
from roles.rollout_job.role import fleet_config
from tests.helpers import GPUINFRA
from tests.integration.kube_lab import ROLLOUT_JOB_NODE as NODE
from tests.integration.kube_lab import WORKERS, Cluster
from tests.integration.roles_helpers import gpuinfra
from toolkit import sshkeys
from toolkit.ssh import ssh_argv

pytestmark = [pytest.mark.integration, pytest.mark.fleetjob]

NAMESPACE = "gpuinfra"
LEDGER = "gpuinfra-rollout-{cluster}"
INDEX = "batch.kubernetes.io/job-completion-index"
SESSION_SLACK_US = 2_000_000
# Every role, as an operator rolls the workers (issue 47.10): a `--roles` apply records only
# those roles, and the drift Job's shards could not settle the workers from their records.
APPLY_JOB = ("--job", "--shards", "2", "--limit", "gpu_worker,cpu_worker")


@pytest.fixture(scope="module")
def cluster(kubernetes_lab) -> Cluster:
    return kubernetes_lab


def remove_workers(cluster: Cluster) -> None:
    for worker in WORKERS:
        result = gpuinfra(
            "kubernetes", "node", "remove", str(cluster.inventory), worker, "--force", "--yes"
        )
        assert result.returncode == 0, result.stderr
    names = {n["metadata"]["name"] for n in cluster.get("nodes")["items"]}
    assert not names & set(WORKERS), names


def ready_workers(cluster: Cluster) -> dict[str, str]:
    """Each worker Node's creation time, for those Ready."""
    found = {}
    for node in cluster.get("nodes")["items"]:
        name = node["metadata"]["name"]
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]
        )
        if name in WORKERS and ready:
            found[name] = node["metadata"]["creationTimestamp"]
    return found


def wait_ready(cluster: Cluster, seconds: int = 300) -> dict[str, str]:
    for _ in range(seconds // 5):
        found = ready_workers(cluster)
        if set(found) == set(WORKERS):
            return found
        time.sleep(5)
    pytest.fail(f"workers not Ready after the rollout: {ready_workers(cluster)}")


def apply_job(cluster: Cluster, *extra: str) -> tuple[int, dict, str]:
    report = cluster.inventory.parent / f"apply-job-{time.monotonic_ns()}.json"
    result = gpuinfra(
        "apply", str(cluster.inventory), *APPLY_JOB, "--yes", "--format", "json",
        "--report", str(report), *extra,
    )  # fmt: skip
    return result.returncode, json.loads(report.read_text()), result.stderr


def start_job(cluster: Cluster) -> subprocess.Popen:
    return subprocess.Popen(
        [GPUINFRA, "apply", str(cluster.inventory), *APPLY_JOB, "--yes", "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ledger(cluster: Cluster) -> dict | None:
    name = LEDGER.format(cluster=cluster.lab.loaded.cluster.name)
    found = cluster.kubectl("get", "configmap", "-n", NAMESPACE, name, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    return json.loads(json.loads(found.stdout)["data"]["ledger.json"])


def wait_in_flight(cluster: Cluster, seconds: int = 300) -> dict:
    """The ledger once a host is in flight (a shard's pod is applying it)."""
    for _ in range(seconds // 2):
        found = ledger(cluster)
        if found and found["in_flight"]:
            return found
        time.sleep(2)
    pytest.fail("no host went in flight")


def rollout_sessions(cluster: Cluster, host: str, since: float) -> list[tuple[int, int, str]]:
    """(opened, closed, host) in microseconds of each SSH session on `host` since `since` that
    logged in with a certificate of the rollout authority (sshd's line ends with the
    authority's fingerprint), from sshd's journal."""
    key = cluster.inventory.parent / ".state" / ROLLOUT_STATE_KEY
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(key)], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    # A session's process may be gone when journald reads its last line, which then names no
    # unit: match sshd's identifiers too, after --sync (all that was sent is in).
    units = "_SYSTEMD_UNIT=ssh.service + SYSLOG_IDENTIFIER=sshd-session + SYSLOG_IDENTIFIER=sshd"
    journal = cluster.lab.ssh(
        host, f"journalctl --sync; journalctl {units} --since @{int(since) - 1} -o json"
    ).stdout
    opened: dict[str, int] = {}
    windows = []
    for line in journal.splitlines():
        entry = json.loads(line)
        pid, message = entry.get("_PID"), str(entry.get("MESSAGE", ""))
        at = int(entry["__REALTIME_TIMESTAMP"])
        if message.startswith("Accepted publickey for root") and message.endswith(fingerprint):
            opened[pid] = at
        elif "session closed for user root" in message and pid in opened:
            windows.append((opened.pop(pid), at, host))
    assert not opened, f"{host}: rollout sessions still open: {opened}"
    return windows


def token_ids(cluster: Cluster) -> set[str]:
    listed = cluster.lab.ssh(
        "cp-1", "kubeadm token list --kubeconfig /etc/kubernetes/admin.conf -o jsonpath="
        "'{.token}{\"\\n\"}'",
    ).stdout  # fmt: skip
    return {line.split(".")[0] for line in listed.split() if line.strip()}


def test_two_shards_with_budget_one_never_join_two_workers_at_once(cluster):
    remove_workers(cluster)
    tokens = token_ids(cluster)
    started = time.time()
    code, report, stderr = apply_job(cluster)
    assert code == ExitCode.OK, (stderr, report["notes"])
    assert {report["hosts"][w]["status"] for w in WORKERS} <= {"changed", "ok"}
    # The ledger's own history, read by the controller before it deleted the ledger.
    assert any("at most 1 host(s) in flight at once" in note for note in report["notes"]), report[
        "notes"
    ]
    wait_ready(cluster)
    # Independent of the ledger: the workers' own sshd logs. Each shard works on a host in one
    # SSH session with the rollout key; with budget 1 no two such sessions overlap. (The lab's
    # join rate alone already spaces the joins 20 s apart, so Node creation times prove
    # nothing. With budget 2 the two sessions opened in the same second on 2026-11-27, the
    # positive control of this check.)
    # A shard releases its host before its SSH connection is torn down: sshd logged the close
    # 64 ms after the next host's login on 2026-11-27, hence the 2 s of slack (a worker's apply
    # holds its session for about 20 s).
    sessions = sorted(s for w in WORKERS for s in rollout_sessions(cluster, w, started))
    assert len(sessions) >= len(WORKERS), sessions
    for (_, end, host), (start, _, other) in pairwise(sessions):
        assert end - SESSION_SLACK_US <= start, f"{host}'s rollout session overlaps {other}'s"
    # Nothing of the Job is left: no Job, ConfigMap, Secret (the key, the token) or Role.
    left = cluster.kubectl(
        "get", "job,configmap,secret,role", "-n", NAMESPACE,
        "-l", "app.kubernetes.io/name=gpuinfra-rollout", "-o", "name",
    )  # fmt: skip
    assert left.stdout.strip() == ""
    # The run's token was deleted on cp-1 (its TTL would end it anyway): no token is new.
    assert token_ids(cluster) <= tokens


def test_a_killed_shard_pod_is_retried_and_the_rollout_completes(cluster):
    """Killed mid-step (a forced delete: no grace, as a node lost), the pod leaves its host in
    flight and the index's next pod adopts it. A plain delete lets the step in progress end
    first (SIGTERM, engine/rolloutshard.py): with one host per shard the pod then ends its
    host and nothing is retried, as the run of 2026-11-28 showed."""
    remove_workers(cluster)
    job = start_job(cluster)
    try:
        flying = wait_in_flight(cluster)
        victim_pod = next(iter(flying["in_flight"].values()))
        cluster.kubectl(
            "delete", "pod", "-n", NAMESPACE, victim_pod, "--grace-period=0", "--force",
            "--wait=false",
        )  # fmt: skip
        output, stderr = job.communicate(timeout=1500)
    finally:
        if job.poll() is None:
            job.kill()
    report = json.loads(output)
    assert job.returncode == ExitCode.OK, (stderr, report["notes"])
    assert {report["hosts"][w]["status"] for w in WORKERS} <= {"changed", "ok"}
    assert any("was retried: pods" in note for note in report["notes"]), report["notes"]
    assert any("at most 1 host(s) in flight" in note for note in report["notes"])
    wait_ready(cluster)


def test_a_local_apply_while_the_job_runs_exits_8_naming_it(cluster, tmp_path):
    """From another controller (a copy of the inventory and .state/: its own apply.lock), so
    the refusal is the ledger's heartbeat, not this controller's flock."""
    other = tmp_path / "other"
    shutil.copytree(cluster.inventory.parent, other, symlinks=True)
    remove_workers(cluster)
    job = start_job(cluster)
    try:
        wait_in_flight(cluster)
        local = gpuinfra(
            "apply", str(other / cluster.inventory.name), "--yes", "--limit", "cpu-1",
            "--roles", "base",
        )  # fmt: skip
        assert local.returncode == ExitCode.LOCKED, local.stderr
        name = LEDGER.format(cluster=cluster.lab.loaded.cluster.name)
        assert f"the rollout Job {NAMESPACE}/{name}" in local.stderr
        output, stderr = job.communicate(timeout=1500)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == ExitCode.OK, stderr
    wait_ready(cluster)


def login_from_node(
    cluster: Cluster, private: str, cert: str | None
) -> subprocess.CompletedProcess:
    """`ssh root@<worker> true` from the Job's node with this key (and certificate), as a pod
    there reaches the workers (from the node's address); the key goes over stdin, never argv."""
    loaded = cluster.lab.loaded
    folder = "/root/.rollout-login-test"
    files = {"id_ed25519": private, "id_ed25519-cert.pub": cert or "", "known_hosts": ""}
    known = cluster.lab.ssh(NODE, f"ssh-keyscan -t ed25519 {cluster.lab.address(WORKERS[0])}")
    files["known_hosts"] = known.stdout
    for name, text in files.items():
        write = f"mkdir -p -m 700 {folder} && umask 077 && cat > {folder}/{name}"
        subprocess.run(ssh_argv(loaded, NODE) + [write], input=text, text=True, check=True)
    if cert is None:
        cluster.lab.ssh(NODE, f"rm {folder}/id_ed25519-cert.pub")
    options = (
        f"-o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile={folder}/known_hosts "
        "-o StrictHostKeyChecking=yes -o ConnectTimeout=10"
    )
    command = f"ssh {options} -i {folder}/id_ed25519 root@{cluster.lab.address(WORKERS[0])} true"
    try:
        return cluster.lab.ssh(NODE, command, check=False)
    finally:
        cluster.lab.ssh(NODE, f"rm -rf {folder}")


def test_the_workers_admit_an_authority_certificate_only_while_it_is_valid(cluster):
    """The rollout's key is per run: a new key certified by the authority kept in .state/. A
    certificate valid now is admitted from the Job's node (the control); one whose run ended,
    one for another principal, and the authority's own key are refused."""
    loaded = load(cluster.inventory)
    cfg = fleet_config(loaded)
    now = int(time.time())
    private, cert = KEY.run_identity(loaded, cfg, "test", (now - 60, now + 600))
    admitted = login_from_node(cluster, private, cert)
    assert admitted.returncode == 0, admitted.stderr
    _, ended = KEY.run_identity(loaded, cfg, "ended", (now - 7200, now - 3600))
    assert login_from_node(cluster, private, ended).returncode == 255
    authority = KEY.private_key(loaded.state_dir, "existing")
    sources = KEY.key_sources(loaded, cfg)
    other = sshkeys.certificate(authority, private, "root", "other", (now - 60, now + 600), sources)
    assert login_from_node(cluster, private, other).returncode == 255
    assert login_from_node(cluster, authority, None).returncode == 255
