"""`gpuinfra drift --job` (docs/design/fleet-jobs.md step 4): the controller's steps against a
stand-in for kubectl on the first control-plane node (a fake `run_remote`), and the shard's side
against stand-in answers. No host, no cluster."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from cli.output import exit_code
from day2 import fleetjob, jobs
from day2.fleetjob import (
    FleetJobBusy,
    JobRun,
    fleet_drift,
    known_hosts_for,
)
from day2.jobs import JobError, JobRefused
from engine import fingerprint
from engine import fleetshard as shard_io
from engine.context import load
from engine.drift import drift as local_drift
from engine.reports import HostReport, HostStatus, Mode, RunOptions, RunReport
from inventory.errors import InventoryInvalid
from roles.drift_job.files import KEY
from roles.drift_job.role import fleet_config
from toolkit import driftprobe
from toolkit.jobs import job_tolerations
from toolkit.remote import RemoteResult

REPO = Path(__file__).resolve().parents[2]
STAT = "user=root group=root mode=-rw-r--r-- atime=1 mtime=2 ctime=3 size=4 '/etc/hosts'"
ANSWER = f"{driftprobe.BEGIN}\n{STAT}\n"
DIGEST = driftprobe.answer_digest(ANSWER.encode())
KEY_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOCP7nC816W8JgGttjbIA5p9q6MRUHOCnbms/SzXzIk+"


def job_cluster(small_cluster, write_cluster, tmp_path: Path, **job) -> Any:
    known = tmp_path / "known_hosts"
    addresses = [h["address"] for h in small_cluster["hosts"].values()]
    known.write_text("".join(f"{a} {KEY_LINE}\n" for a in addresses) + "192.0.2.99 other-key\n")
    small_cluster["ssh"] = {"known_hosts": str(known)}
    small_cluster["group_vars"] = {
        "all": {"drift_job": {"enabled": True, "nodes": ["cpu-1"], **job}}
    }
    loaded = load(write_cluster(small_cluster))
    KEY.private_key(loaded.state_dir, "create")  # the apply made it: part of the state's digest
    return loaded


def keep_records(loaded, names=None, digest: str = DIGEST) -> None:
    common = fingerprint.common_digest(loaded)
    for name in names or loaded.cluster.hosts:
        fingerprint.save_record(
            loaded.state_dir,
            name,
            fingerprint.Record(
                key="k",
                roles=fingerprint.host_roles(
                    loaded.cluster.hosts[name].groups, cluster=loaded.cluster
                ),
                commands=(),
                operations=(("base", "Write /etc/hosts"),),
                notes=("recorded",),
                inputs=fingerprint.inputs_key(common, name),
                marker="m",
                probe_digest=digest,
            ),
        )


@dataclass
class Kubectl:
    """kubectl on cp-1: takes the manifest, 'runs' each shard as a pod would (its hosts'
    answers from `answers`, default: the recorded one), and serves get/logs."""

    answers: dict[str, tuple[int, bytes, bytes, float]] = field(default_factory=dict)
    silent: dict[int, list[dict]] = field(default_factory=dict)  # index -> its failed pods
    bad_sha: set[int] = field(default_factory=set)
    gone: set[int] = field(default_factory=set)  # indexes that succeeded, their pods deleted
    fail: str = ""  # a command word that fails ("get job", "logs")
    fail_times: int | None = None  # that many times only; None: always
    commands: list[str] = field(default_factory=list)
    manifest: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)

    def __call__(self, loaded, host, command, *, timeout, stdin=None):
        assert host == "cp-1" and command.startswith("kubectl --kubeconfig")
        self.commands.append(command)
        if self.fail and self.fail in command and self.fail_times != 0:
            if self.fail_times is not None:
                self.fail_times -= 1
            return RemoteResult(host, 1, "", "error: the server doesn't have a resource type")
        if "apply -f -" in command:
            self.manifest = [d for d in yaml.safe_load_all(stdin.decode()) if d]
            self._run_pods()
            return RemoteResult(host, 0, "applied")
        if " get job " in command:
            return RemoteResult(host, 0, json.dumps({"status": self._status()}))
        if " get pods " in command:
            return RemoteResult(host, 0, json.dumps({"items": self.pods}))
        if " logs " in command:
            pod = command.split(" logs ")[1].split()[0]
            return RemoteResult(host, 0, "warming up\n" + self.logs[pod] + "\n")
        return RemoteResult(host, 0, "")

    def _status(self) -> dict:
        failed = ",".join(str(i) for i in sorted(self.silent))
        count = sum(1 for d in self.manifest if d["kind"] == "ConfigMap")
        done = [i for i in range(count) if i not in self.silent]
        return {
            "conditions": [{"type": "Complete", "status": "True"}],
            "failedIndexes": failed,
            "completedIndexes": ranges(done),
        }

    def _run_pods(self) -> None:
        maps = [d for d in self.manifest if d["kind"] == "ConfigMap"]
        for index, cm in enumerate(maps):
            if index in self.silent:
                self.pods += self.silent[index]
                continue
            folder = Path("/nonexistent")
            sheet = json.loads(gzip.decompress(base64.b64decode(cm["binaryData"]["sheet.json.gz"])))
            assert folder and sheet["shard"] == index
            hosts = [
                shard_io.judged(e, self.answers.get(e["name"], (0, ANSWER.encode(), b"", 0.1)))
                for e in sheet["hosts"]
            ]
            line = shard_io.report_line(sheet["run"], index, sheet["count"], hosts, {})
            message = shard_io.termination_message(
                sheet["run"],
                index,
                sheet["count"],
                len(hosts),
                b"x" if index in self.bad_sha else line,
            )
            name = f"gpuinfra-drift-small-{index}-abcde"
            self.logs[name] = line.decode()
            if index not in self.gone:
                self.pods.append(pod(name, index, "Succeeded", 0, message=message))


def ranges(indexes: list[int]) -> str:
    """As the Job controller writes its status' indexes: runs as ranges ("0-2,4")."""
    runs: list[list[int]] = []
    for i in indexes:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def pod(name, index, phase, code, reason="Completed", message="", disrupted=False) -> dict:
    conditions = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]
    return {
        "metadata": {"name": name, "annotations": {fleetjob.INDEX_ANNOTATION: str(index)}},
        "status": {
            "phase": phase,
            "conditions": conditions if disrupted else [],
            "containerStatuses": [
                {
                    "name": "drift",
                    "state": {
                        "terminated": {"exitCode": code, "reason": reason, "message": message}
                    },
                }
            ],
        },
    }


class Exact:
    """run_exact: each host asked gets the status given (ok by default)."""

    def __init__(self, statuses: dict[str, HostStatus] | None = None):
        self.statuses = statuses or {}
        self.asked: list[tuple[str, ...]] = []

    def __call__(self, loaded, options):
        self.asked.append(options.limit)
        report = RunReport(cluster=loaded.cluster.name, mode=Mode.drift)
        for name in options.limit:
            report.hosts[name] = HostReport(name, self.statuses.get(name, HostStatus.ok))
        return report


@dataclass
class FakeTime:
    """A monotonic clock that only sleeping moves."""

    now: float = 1000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def job_run(loaded, kubectl, exact, **changes) -> JobRun:
    options = RunOptions(mode=Mode.drift)
    fake = FakeTime()
    changes = {"sleep": fake.sleep, "clock": fake.clock, **changes}
    return JobRun(loaded, options, exact, runner=kubectl, **changes)


@pytest.fixture(autouse=True)
def state_stands(monkeypatch):
    """The exact check's state (the etcd PKI...) is the apply's; here there is none to check."""
    import engine.clusterstate

    monkeypatch.setattr(engine.clusterstate, "require_state", lambda loaded, roles: loaded)


@pytest.fixture
def loaded(small_cluster, write_cluster, tmp_path):
    cluster = job_cluster(small_cluster, write_cluster, tmp_path, shards=2)
    keep_records(cluster)
    return cluster


def test_a_settled_fleet_is_answered_by_the_shards_alone(loaded):
    kubectl, exact = Kubectl(), Exact()
    report = fleet_drift(job_run(loaded, kubectl, exact))
    assert exact.asked == []
    assert {h.status for h in report.hosts.values()} == {HostStatus.ok}
    assert report.hosts["cp-1"].notes == ["recorded"]  # the recorded report, as _matched builds
    assert exit_code(report) == 0
    assert any("2 shard(s) settled 10 of 10 hosts" in note for note in report.notes)
    # Whatever happened, the run's objects are deleted at the end.
    assert "delete job,configmap,secret,networkpolicy -l" in kubectl.commands[-1]


def test_unsettled_and_unreachable_hosts_go_to_the_exact_check(loaded):
    kubectl = Kubectl(
        answers={
            "dns-1": (0, f"{driftprobe.BEGIN}\nsomething else\n".encode(), b"", 0.1),
            "gpu-1": (255, b"", b"ssh: connect to host 10.0.0.61 port 22: No route to host", 5.0),
        }
    )
    exact = Exact({"dns-1": HostStatus.drift})
    report = fleet_drift(job_run(loaded, kubectl, exact))
    assert exact.asked == [("dns-1", "gpu-1")]
    assert report.hosts["dns-1"].status is HostStatus.drift
    assert report.hosts["gpu-1"].status is HostStatus.ok  # the controller reached it
    assert exit_code(report) == 3
    # The note names them and why, so an operator (and a failed test) sees which.
    (note,) = [n for n in report.notes if "shard(s) settled" in n]
    assert "settled 8 of 10 hosts; 2 checked by the controller (dns-1: unsettled" in note
    assert "; gpu-1: ssh in its shard (ssh: connect to host" in note


def test_the_note_names_a_few_of_the_hosts_left_to_the_controller():
    exact = {f"gpu-{n:02}": "unsettled in its shard (why)" for n in range(1, 8)}
    said = fleetjob.named(exact)
    assert said.startswith(" (gpu-01: unsettled in its shard (why); gpu-02: ")
    assert "gpu-05" in said and "gpu-06" not in said and said.endswith("; 2 more)")
    assert fleetjob.named({}) == ""


def test_hosts_without_a_probe_are_never_on_a_sheet(loaded):
    keep_records(loaded, ["mon-1"], digest="")
    fingerprint.forget(loaded.state_dir, ["lb-1"])
    kubectl, exact = Kubectl(), Exact()
    fleet_drift(job_run(loaded, kubectl, exact))
    on_sheets = {
        e["name"]
        for d in kubectl.manifest
        if d["kind"] == "ConfigMap"
        for e in json.loads(gzip.decompress(base64.b64decode(d["binaryData"]["sheet.json.gz"])))[
            "hosts"
        ]
    }
    assert {"mon-1", "lb-1"}.isdisjoint(on_sheets) and len(on_sheets) == 8
    assert exact.asked == [("lb-1", "mon-1")]


def test_a_shard_that_never_reported_is_named_and_the_run_exits_1(loaded):
    silent = {
        1: [
            pod("gpuinfra-drift-small-1-x", 1, "Failed", 137, "OOMKilled"),
            pod("gpuinfra-drift-small-1-y", 1, "Failed", 143, "Error", disrupted=True),
        ]
    }
    report = fleet_drift(job_run(loaded, Kubectl(silent=silent), Exact()))
    shard_one = sorted(loaded.cluster.hosts)[1::2]
    for name in shard_one:
        host = report.hosts[name]
        assert host.status is HostStatus.failed
        assert host.error == (
            "shard 1/2 did not report: pod gpuinfra-drift-small-1-x exit 137 OOMKilled; "
            "pod gpuinfra-drift-small-1-y EvictionByEvictionAPI (DisruptionTarget, not "
            "counted); index failed after its retries"
        )
    assert exit_code(report) == 1


def test_a_shard_that_succeeded_and_whose_pod_is_gone_is_checked_by_the_controller(loaded):
    """The pod ended 0 and was deleted before the controller read its log (kubectl delete as
    it ended, its node lost): the Job counts the index done, so no retry comes, and the
    controller checks the shard's hosts itself."""
    exact = Exact({"cp-2": HostStatus.drift})
    report = fleet_drift(job_run(loaded, Kubectl(gone={1}), exact))
    shard_one = sorted(loaded.cluster.hosts)[1::2]
    assert sorted(exact.asked[0]) == shard_one
    assert report.hosts["cp-2"].status is HostStatus.drift
    assert all(report.hosts[n].status is HostStatus.ok for n in shard_one if n != "cp-2")
    assert exit_code(report) == 3
    (note,) = [n for n in report.notes if "shard(s) settled" in n]
    assert "settled 5 of 10 hosts; 5 checked by the controller" in note
    assert "shard 1/2 succeeded, its pod and report gone" in note
    # Control: with its pod there, the shard's own report stands.
    exact = Exact()
    fleet_drift(job_run(loaded, Kubectl(), exact))
    assert exact.asked == []


def test_the_indexes_a_jobs_status_lists():
    assert jobs.index_set("0,2-4,7") == {0, 2, 3, 4, 7}
    assert jobs.index_set("") == set()
    assert jobs.index_set("1-1") == {1}
    assert jobs.index_set(ranges([0, 1, 2, 4])) == {0, 1, 2, 4}


def test_a_report_whose_sha256_is_not_its_pods_is_refused(loaded):
    report = fleet_drift(job_run(loaded, Kubectl(bad_sha={0}), Exact()))
    shard_zero = sorted(loaded.cluster.hosts)[0::2]
    assert all(report.hosts[n].status is HostStatus.failed for n in shard_zero)
    assert "report refused: its log's sha256" in report.hosts[shard_zero[0]].error
    assert exit_code(report) == 1


@pytest.mark.parametrize("word", ["get job gpuinfra-drift-small -o", "get pods", "apply -f -"])
def test_a_failed_kubectl_names_its_step(loaded, word):
    kubectl = Kubectl(fail=word)
    with pytest.raises(JobError) as raised:
        fleet_drift(job_run(loaded, kubectl, Exact()))
    assert str(raised.value).startswith("step ")
    assert "kubectl on cp-1 failed" in str(raised.value)
    assert "delete job,configmap,secret" in kubectl.commands[-1]  # deleted all the same


def test_the_wait_rides_out_a_kubectl_hiccup_and_gives_up_after_transient_s(loaded):
    """Three failed looks at the Job (an API server restarting): the run goes on to its end;
    failing for longer than TRANSIENT_S (the test above, `get job`): the wait ends the run."""
    kubectl = Kubectl(fail="get job gpuinfra-drift-small -o", fail_times=3)
    report = fleet_drift(job_run(loaded, kubectl, Exact()))
    assert exit_code(report) == 0
    looks = [c for c in kubectl.commands if "get job gpuinfra-drift-small -o" in c]
    assert len(looks) == 4
    fake = FakeTime()
    always = Kubectl(fail="get job gpuinfra-drift-small -o")
    with pytest.raises(JobError):
        fleet_drift(job_run(loaded, always, Exact(), clock=fake.clock, sleep=fake.sleep))
    assert jobs.TRANSIENT_S < fake.now - 1000.0 <= jobs.TRANSIENT_S + 10


def test_a_failed_kubectl_logs_names_the_shard(loaded):
    with pytest.raises(JobError) as raised:
        fleet_drift(job_run(loaded, Kubectl(fail=" logs "), Exact()))
    assert "step collect: collect: kubectl logs of shard 0/2 (pod gpuinfra-drift-small-0" in str(
        raised.value
    )


@pytest.mark.parametrize(
    "exact_status", [HostStatus.ok, HostStatus.drift, HostStatus.unreachable, HostStatus.failed]
)
def test_exit_codes_are_local_drifts(loaded, monkeypatch, exact_status):
    """The same hosts settled, the same others checked exactly: the same report and exit."""
    unsettled = {"etcd-2": (0, f"{driftprobe.BEGIN}\nother\n".encode(), b"", 0.1)}
    job = fleet_drift(job_run(loaded, Kubectl(answers=unsettled), Exact({"etcd-2": exact_status})))

    class Probes:
        def __init__(self, *args, **kwargs):
            pass

        def finish(self, loaded):
            fast = fingerprint.FastCheck()
            for name, host in job.hosts.items():
                if name != "etcd-2":
                    fast.reports[name] = host
            fast.exact = {"etcd-2": "differs from its record"}
            return fast

    monkeypatch.setattr(fingerprint, "Probes", Probes)
    monkeypatch.setattr(fingerprint, "claim_early", lambda: None)
    local = local_drift(loaded, RunOptions(mode=Mode.drift), Exact({"etcd-2": exact_status}))
    assert exit_code(job) == exit_code(local)
    assert {n: h.status for n, h in job.hosts.items()} == {
        n: h.status for n, h in local.hosts.items()
    }


# -- the manifest ---------------------------------------------------------------------------------


def test_the_manifest_renders_strictly_and_passes_the_official_schemas(loaded):
    import kubernetes_validate

    kubectl = Kubectl()
    fleet_drift(job_run(loaded, kubectl, Exact()))
    kinds = [d["kind"] for d in kubectl.manifest]
    assert kinds == ["Namespace", "ServiceAccount", "Secret", "ConfigMap", "ConfigMap",
                     "NetworkPolicy", "Job"]  # fmt: skip
    for document in kubectl.manifest:
        kubernetes_validate.validate(document, "1.35.0", strict=True)
    job = kubectl.manifest[-1]["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == ("Indexed", 2, 2)
    assert job["backoffLimitPerIndex"] == 2 and job["podReplacementPolicy"] == "Failed"
    rules = job["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert rules[1]["action"] == "FailJob" and rules[1]["onExitCodes"]["values"] == [2]
    spec = job["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["containers"][0]["command"] == [
        "gpuinfra", "drift", "--job-shard", "/etc/gpuinfra/drift"
    ]  # fmt: skip


def test_the_manifest_is_rendered_under_strict_undefined(loaded):
    """A variable the template names and the flow does not give is an error, not ""."""
    import jinja2

    run = job_run(loaded, Kubectl(), Exact())
    fleetjob.check_options(run)
    fleetjob.make_sheets(run)
    assert "gpuinfra-drift-small-1" in fleetjob.job_manifest(run)
    with pytest.raises(jinja2.UndefinedError):
        fleetjob.render_template("drift_job/fleet-job.yaml.j2", cfg=run.cfg, cluster_name="x")


def test_each_shard_gets_only_its_own_hosts_keys(loaded):
    """H3: no ConfigMap holds the whole known_hosts; each holds its shard's hosts' lines."""
    kubectl = Kubectl()
    fleet_drift(job_run(loaded, kubectl, Exact()))
    maps = [d for d in kubectl.manifest if d["kind"] == "ConfigMap"]
    for index, cm in enumerate(maps):
        mine = sorted(loaded.cluster.hosts)[index::2]
        addresses = {str(loaded.cluster.hosts[n].address) for n in mine}
        lines = cm["data"]["known_hosts"].splitlines()
        assert {line.split()[0] for line in lines} == addresses
        assert "other-key" not in cm["data"]["known_hosts"]


def test_a_shard_over_the_object_limit_is_refused_naming_it(loaded, monkeypatch):
    monkeypatch.setattr(fleetjob, "OBJECT_LIMIT", 3000)
    with pytest.raises(JobRefused) as raised:
        fleet_drift(job_run(loaded, Kubectl(), Exact(), count=1))
    text = str(raised.value)
    assert text.startswith("shard 0/1: its ConfigMap would hold ")
    assert "over Kubernetes' 1 MiB limit for one object: run with more shards (--shards" in text


def test_hashed_known_hosts_lines_are_matched():
    import hmac

    salt = b"0123456789abcdef0123"
    digest = hmac.new(salt, b"[10.0.0.5]:2222", hashlib.sha1).digest()
    hashed = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    text = f"{hashed} {KEY_LINE}\n10.0.0.6 {KEY_LINE}\n@revoked 10.0.0.5 {KEY_LINE}\n"
    kept = known_hosts_for(text, ["[10.0.0.5]:2222"])
    assert kept == f"{hashed} {KEY_LINE}\n"


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        (["cp-1"], [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                     "effect": "NoSchedule"}]),
        (["cpu-1"], []),
    ],
)  # fmt: skip
def test_the_job_tolerates_exactly_its_nodes_taints(
    small_cluster, write_cluster, tmp_path, nodes, expected
):
    """H2: pinned to tainted nodes, the pods must tolerate those taints, and nothing broader."""
    loaded = job_cluster(small_cluster, write_cluster, tmp_path, nodes=nodes)
    assert job_tolerations(loaded, fleet_config(loaded)) == expected


def test_a_gpu_worker_is_refused_as_a_job_node(small_cluster, write_cluster, tmp_path):
    """Only the GPU checks may tolerate the preflight taint (the admission policy would refuse
    the Job's pods): refused at validate, naming the node."""
    with pytest.raises(InventoryInvalid, match="gpu-1 is a GPU worker"):
        job_cluster(small_cluster, write_cluster, tmp_path, nodes=["gpu-1"])


def test_a_teams_node_is_tolerated_by_its_team_taint(small_cluster, write_cluster, tmp_path):
    # Admitted only where the team's admission policy lets its toleration in: its namespace.
    small_cluster["teams"] = {"research": {"hosts": ["cpu-1"], "namespaces": ["gpuinfra"]}}
    loaded = job_cluster(small_cluster, write_cluster, tmp_path)
    assert job_tolerations(loaded, fleet_config(loaded)) == [
        {
            "key": "gpuinfra.io/team",
            "operator": "Equal",
            "value": "research",
            "effect": "NoSchedule",
        }
    ]


# -- the command line -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--exact"], "--job and --exact"),
        (["--roles", "base"], "no --roles"),
        (["--shard", "0/2"], "no --roles, --shard"),
    ],
)
def test_job_refuses_what_it_cannot_honour(loaded, extra, said):
    result = CliRunner().invoke(app, ["drift", str(loaded.source), "--job", *extra])
    assert result.exit_code == 2
    assert said in result.stderr


def test_job_needs_the_role_enabled(small_cluster, write_cluster):
    result = CliRunner().invoke(app, ["drift", str(write_cluster(small_cluster)), "--job"])
    assert result.exit_code == 2
    assert "drift --job needs group_vars.all.drift_job.enabled: true" in result.stderr


def test_shards_only_with_job(small_cluster, write_cluster):
    result = CliRunner().invoke(app, ["drift", str(write_cluster(small_cluster)), "--shards", "2"])
    assert result.exit_code == 2 and "--shards: only with --job" in result.stderr


# -- the shard's side -----------------------------------------------------------------------------


class FakeAsking:
    answers: dict[str, tuple[int, bytes, bytes, float]] = {}
    argvs: dict[str, list[str]] = {}

    def __init__(self, marker, parallel):
        self.parallel = parallel

    def send(self, name, argv, commands):
        assert commands == []  # the host forces its own command
        FakeAsking.argvs[name] = argv

    def go(self):
        pass

    def answer(self, name):
        return FakeAsking.answers[name]


def write_shard(folder: Path, index: int = 0, **changes) -> None:
    settings = {"user": "gpuinfra-drift", "port": 22, "parallel": 8, "timeout": 10}
    hosts = [("a", "10.0.0.1", DIGEST), ("b", "10.0.0.2", DIGEST)]
    data = shard_io.shard_sheet("r1", index, 2, settings, hosts)
    if changes:
        sheet = {**json.loads(gzip.decompress(data)), **changes}
        data = gzip.compress(json.dumps(sheet).encode())
    (folder / f"shard-{index}").mkdir(parents=True)
    (folder / f"shard-{index}" / "sheet.json.gz").write_bytes(data)
    (folder / f"shard-{index}" / "known_hosts").write_text(f"10.0.0.1 {KEY_LINE}\n")


def test_a_shard_reports_once_with_its_sha256_whatever_the_login_printed(tmp_path, monkeypatch):
    import io

    monkeypatch.setattr(shard_io, "Asking", FakeAsking)
    FakeAsking.answers = {
        "a": (0, b"Welcome to Ubuntu 24.04\n" + ANSWER.encode(), b"", 0.2),
        "b": (255, b"", b"Host key verification failed.", 0.1),
    }
    write_shard(tmp_path / "data")
    key = tmp_path / "key"
    key.write_text("PRIVATE")
    out, termination = io.BytesIO(), tmp_path / "termination-log"
    code = shard_io.run_shard(0, tmp_path / "data", key, tmp_path / "run", out, termination)
    assert code == 0
    line = out.getvalue().strip()
    said = json.loads(termination.read_text())
    assert said == {
        "run": "r1", "shard": 0, "count": 2, "hosts": 2, "sha256": hashlib.sha256(line).hexdigest()
    }  # fmt: skip
    report = shard_io.read_report(line)
    assert [h[:2] for h in report["hosts"]] == [["a", "matched"], ["b", "ssh"]]
    assert (tmp_path / "run" / "id_ed25519").stat().st_mode & 0o777 == 0o400
    argv = FakeAsking.argvs["a"]
    assert argv[-1] == "gpuinfra-drift@10.0.0.1" and "-T" in argv
    assert f"UserKnownHostsFile={tmp_path / 'data' / 'shard-0' / 'known_hosts'}" in argv


def test_a_sheet_of_another_gpuinfra_exits_2(tmp_path, monkeypatch):
    monkeypatch.setattr(shard_io, "Asking", FakeAsking)
    write_shard(tmp_path / "data", format=99)
    (tmp_path / "key").write_text("PRIVATE")
    code = shard_io.run_shard(0, tmp_path / "data", tmp_path / "key", tmp_path / "run")
    assert code == 2


def test_the_pod_command_needs_its_index(monkeypatch):
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    assert shard_io.main(["/etc/gpuinfra/drift"]) == 2
    assert shard_io.main([]) == 2


def test_launch_hands_job_shard_to_the_shard_before_typer(monkeypatch):
    import sys

    from cli import launch

    seen = []
    monkeypatch.setattr(sys, "argv", ["gpuinfra", "drift", "--job-shard", "/x"])
    monkeypatch.setattr(shard_io, "main", lambda args: seen.append(args) or 0)
    with pytest.raises(SystemExit) as done:
        launch.main()
    assert done.value.code == 0 and seen == [["/x"]]


def test_a_teams_node_outside_the_teams_namespaces_is_refused(small_cluster, write_cluster):
    small_cluster["teams"] = {"research": {"hosts": ["cpu-1"]}}
    small_cluster["group_vars"] = {"all": {"drift_job": {"enabled": True, "nodes": ["cpu-1"]}}}
    result = CliRunner().invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert "cpu-1 belongs to the team research" in result.stderr


def test_a_refused_sheet_touches_nothing_in_the_cluster(loaded, monkeypatch):
    monkeypatch.setattr(fleetjob, "OBJECT_LIMIT", 3000)
    kubectl = Kubectl()
    with pytest.raises(JobRefused):
        fleet_drift(job_run(loaded, kubectl, Exact(), count=1))
    assert kubectl.commands == []


def test_the_pods_may_reach_ssh_on_the_node_network_only(loaded):
    kubectl = Kubectl()
    fleet_drift(job_run(loaded, kubectl, Exact()))
    policy = next(d for d in kubectl.manifest if d["kind"] == "NetworkPolicy")["spec"]
    assert policy["egress"] == [
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}], "ports": [{"protocol": "TCP", "port": 22}]}
    ]
    assert "ingress" not in policy and policy["policyTypes"] == ["Ingress", "Egress"]


STOPPED_SHARD = """
import os, signal, sys, time
from pathlib import Path
from engine import fleetshard

class Stopped:
    def __init__(self, marker, parallel):
        pass
    def send(self, name, argv, commands):
        pass
    def go(self):  # the pod deleted while the shard waits on a host
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    def answer(self, name):
        raise AssertionError("answered after SIGTERM")
    def cancel(self):
        print("cancelled", file=sys.stderr)

fleetshard.Asking = Stopped
folder = Path(sys.argv[1])
sys.exit(fleetshard.run_shard(0, folder / "data", folder / "key", folder / "run",
                              termination=folder / "termination-log"))
"""


def test_a_shard_stopped_before_it_reports_exits_as_terminated(tmp_path):
    """A deleted pod's shard must fail, not finish and succeed: the Job then starts it again
    (tests/integration/test_drift_job.py saw it succeed, so no index was retried). In a process
    of its own: the unit suite's gevent patching would take the signal from it."""
    write_shard(tmp_path / "data")
    (tmp_path / "key").write_text("PRIVATE")
    stopped = subprocess.run(
        [sys.executable, "-c", STOPPED_SHARD, str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert stopped.returncode == shard_io.TERMINATED == 143, stopped.stderr
    assert stopped.stdout == "" and not (tmp_path / "termination-log").exists()
    assert "cancelled" in stopped.stderr and "SIGTERM" in stopped.stderr


# -- --job-cluster: the Job on another inventory's cluster ------------------------------------


@pytest.fixture
def fleet_and_ops(small_cluster, write_cluster, tmp_path):
    """A checked inventory whose Job runs elsewhere (no nodes, its sources) and the inventory
    of the cluster that runs it."""
    import copy

    ops_data = copy.deepcopy(small_cluster)
    fleet = job_cluster(
        small_cluster, write_cluster, tmp_path, nodes=[], sources=["192.0.2.1/32"], shards=2
    )
    keep_records(fleet)
    ops_data["name"] = "ops"
    ops_data["group_vars"] = {
        "all": {
            "drift_job": {
                "enabled": True,
                "nodes": ["cpu-1"],
                "image": "registry.example/gpuinfra:ops",
                "memory": "384Mi",
            }
        }
    }
    (tmp_path / "ops").mkdir()
    ops_path = tmp_path / "ops" / "cluster.yml"
    ops_path.write_text(yaml.safe_dump(ops_data, sort_keys=False))
    return fleet, load(ops_path)


def test_a_job_cluster_runs_the_pods_for_another_inventorys_hosts(fleet_and_ops):
    fleet, ops = fleet_and_ops
    kubectl, where = Kubectl(), []

    def runner(loaded, host, command, *, timeout, stdin=None):
        where.append(loaded.cluster.name)
        return kubectl(loaded, host, command, timeout=timeout, stdin=stdin)

    report = fleet_drift(job_run(fleet, runner, Exact(), job_cluster=ops))
    assert set(where) == {"ops"}  # every kubectl on the Job's cluster
    assert any("2 shard(s) settled 10 of 10 hosts" in note for note in report.notes)
    job = kubectl.manifest[-1]
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example/gpuinfra:ops"
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "384Mi"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["cpu-1"]
    # The checked inventory's hosts, key and name.
    assert job["metadata"]["name"] == "gpuinfra-drift-small"
    secret = next(d for d in kubectl.manifest if d["kind"] == "Secret")
    key = KEY.private_key(fleet.state_dir, "existing")
    assert base64.b64decode(secret["data"]["id_ed25519"]).decode().strip() == key.strip()


def test_each_shards_usage_is_a_note_the_benchmark_reads_back(loaded):
    report = fleet_drift(job_run(loaded, Kubectl(), Exact()))
    usage = fleetjob.read_usage_notes(report.notes)
    assert usage == {0: {"hosts": 5}, 1: {"hosts": 5}}  # the fake shards report no rusage
    note = fleetjob.usage_note(3, 8, {"cpu_s": 1.5, "hosts": 20})
    assert fleetjob.read_usage_notes(["other", note]) == {3: {"cpu_s": 1.5, "hosts": 20}}


def test_without_nodes_the_job_needs_a_job_cluster(fleet_and_ops):
    fleet, _ = fleet_and_ops
    with pytest.raises(JobRefused) as raised:
        fleet_drift(job_run(fleet, Kubectl(), Exact()))
    assert "--job-cluster" in str(raised.value)


def test_a_job_cluster_without_the_job_enabled_is_refused(fleet_and_ops, small_cluster, tmp_path):
    fleet, _ = fleet_and_ops
    (tmp_path / "plain").mkdir()
    plain = tmp_path / "plain" / "cluster.yml"
    plain.write_text(yaml.safe_dump(small_cluster, sort_keys=False))
    result = CliRunner().invoke(
        app, ["drift", str(fleet.source), "--job", "--job-cluster", str(plain)]
    )
    assert result.exit_code == 2
    assert f"--job-cluster {plain}: the Job's cluster needs" in result.stderr


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--job", "--job-cluster", "/nonexistent/ops.yml"], "/nonexistent/ops.yml"),
        (["--job-cluster", "/nonexistent/ops.yml"], "--job-cluster: only with --job"),
    ],
)
def test_job_cluster_option_refusals(loaded, extra, said):
    result = CliRunner().invoke(app, ["drift", str(loaded.source), *extra])
    assert result.exit_code == 2
    assert said in result.stderr


def test_empty_nodes_validate_only_with_sources(small_cluster, load_small, tmp_path):
    from inventory.errors import InventoryInvalid

    small_cluster["group_vars"] = {"all": {"drift_job": {"enabled": True}}}
    with pytest.raises(InventoryInvalid) as raised:
        load_small()
    assert "name the Kubernetes nodes the Job runs on" in str(raised.value)
    small_cluster["group_vars"]["all"]["drift_job"]["sources"] = ["192.0.2.1/32"]
    loaded = load_small()
    assert KEY.key_sources(loaded, fleet_config(loaded)) == ("192.0.2.1",)


def test_a_shard_reports_its_seconds_and_its_cgroups_memory_peak(tmp_path):
    peak = tmp_path / "memory.max_usage_in_bytes"
    peak.write_text("52428800\n")
    usage = shard_io._usage(started=0.0, peak_files=(str(tmp_path / "absent"), str(peak)))
    assert usage["memory_peak_bytes"] == 52428800
    assert usage["seconds"] > 0 and usage["cpu_s"] > 0
    assert "memory_peak_bytes" not in shard_io._usage(peak_files=(str(tmp_path / "absent"),))


class Running(Kubectl):
    """A Job of this cluster from another run is in the cluster before this run publishes."""

    def __init__(self, job: dict):
        super().__init__()
        self.other = job

    def __call__(self, loaded, host, command, *, timeout, stdin=None):
        if " get job " in command and "--ignore-not-found" in command and not self.manifest:
            self.commands.append(command)
            return RemoteResult(host, 0, json.dumps(self.other))
        return super().__call__(loaded, host, command, timeout=timeout, stdin=stdin)


def other_job(created: str, conditions: list[dict] | None = None) -> dict:
    return {
        "kind": "Job",
        "metadata": {"creationTimestamp": created, "labels": {"gpuinfra.io/drift-run": "r-other"}},
        "spec": {"activeDeadlineSeconds": 600},
        "status": {"conditions": conditions or [], "active": 2},
    }


NOW = 1_800_000_000.0  # the controller's clock in these tests (2027-01-15T08:00:00Z)


def test_a_running_job_of_another_run_is_left_alone_and_exits_8(loaded):
    kubectl = Running(other_job("2027-01-15T07:58:00Z"))  # 2 minutes old, deadline 10
    with pytest.raises(FleetJobBusy, match="drift run r-other.*still running"):
        fleet_drift(job_run(loaded, kubectl, Exact(), wall=lambda: NOW))
    # Nothing applied, nothing deleted: the other run's objects are its own.
    assert not any("apply -f -" in c or " delete " in c for c in kubectl.commands), kubectl.commands


@pytest.mark.parametrize(
    "job",
    [
        other_job("2027-01-15T07:58:00Z", [{"type": "Complete", "status": "True"}]),
        other_job("2027-01-15T07:40:00Z"),  # 20 minutes old: past its deadline and the margin
        {"apiVersion": "v1", "items": [], "kind": "List", "metadata": {}},
    ],
    ids=["ended", "abandoned", "none"],
)
def test_an_ended_or_abandoned_job_is_replaced(loaded, job):
    kubectl = Running(job)
    report = fleet_drift(job_run(loaded, kubectl, Exact(), wall=lambda: NOW))
    assert exit_code(report) == 0
    assert any(" delete job " in c for c in kubectl.commands)  # the earlier run's Job, removed
    assert any("apply -f -" in c for c in kubectl.commands)


def test_a_failed_look_for_a_running_job_deletes_nothing(loaded):
    kubectl = Kubectl(fail="--ignore-not-found -o json")
    with pytest.raises(JobError, match="look for a running Job"):
        fleet_drift(job_run(loaded, kubectl, Exact()))
    assert not any(" delete " in c for c in kubectl.commands), kubectl.commands


def test_a_busy_job_exits_8_from_the_command_line(loaded, monkeypatch):
    import day2.fleetjob

    def busy(run):
        raise FleetJobBusy("Job gpuinfra/gpuinfra-drift-small (drift run r-other) is still running")

    monkeypatch.setattr(day2.fleetjob, "fleet_drift", busy)
    result = CliRunner().invoke(app, ["drift", str(loaded.source), "--job"])
    assert result.exit_code == ExitCode.LOCKED, result.output
    assert "still running" in result.output
