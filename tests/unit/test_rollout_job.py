"""`gpuinfra apply --job` (docs/design/fleet-jobs.md section 5): the shared ledger against a
stand-in API that answers 409, two gates contending for one budget, the slot pacer's fleet-wide
rate, a retried shard's resume, the refusals, the secrets and the manifest, the in-cluster lock.
No host, no cluster."""

from __future__ import annotations

import base64
import json
import random
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from day2 import jobs, rolloutjob
from day2.rolloutjob import Rollout, check_options
from engine import fleetgate, incluster, rolloutlock, rolloutshard, runner
from engine.context import host_contexts, host_files, load
from engine.fleetgate import Ledger, LedgerGate, ShardProgress, resume, swap
from engine.reports import HostReport, HostStatus, Mode, OperationResult, RunOptions, RunReport
from inventory.model import LoadedCluster, StateAccess
from roles.rollout_job.files import KEY, KEYS_FILE, STATE_KEY
from tests.unit.conftest import SAMPLE
from toolkit import sshkeys
from toolkit.pacing import Pacer, Rate, SlotPacer
from toolkit.remote import RemoteResult
from toolkit.statefiles import StateMissing

LEDGER = "gpuinfra-rollout-small"


# -- a stand-in for the API server's ConfigMaps ---------------------------------------------------


@dataclass
class FakeApi:
    """ConfigMaps with resourceVersions. `conflicts`: that many PUTs answer 409 first (another
    writer got there), each bumping the version as that writer would. `compare`: False makes
    it a store without compare-and-swap (the positive control of the contention test)."""

    objects: dict[str, tuple[dict[str, str], int]] = field(default_factory=dict)
    conflicts: int = 0
    compare: bool = True
    delay: Callable[[], None] = lambda: None
    gets: int = 0
    puts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, name):
        with self.lock:
            self.gets += 1
            data, version = self.objects[name]
            found = dict(data), str(version)
        self.delay()  # another shard may write between this read and our write
        return found

    def put(self, name, data, version):
        with self.lock:
            self.puts += 1
            current = self.objects[name][1]
            if self.conflicts:
                self.conflicts -= 1
                self.objects[name] = (self.objects[name][0], current + 1)
                return False
            if self.compare and str(current) != version:
                return False
            self.objects[name] = (dict(data), current + 1)
            return True

    def ledger(self, name=LEDGER) -> Ledger:
        return Ledger.parse(self.objects[name][0])


def new_api(budget=1, total=4, fail_percent=None, **kwargs) -> FakeApi:
    ledger = Ledger(run="r1", budget=budget, total=total, fail_percent=fail_percent)
    return FakeApi(objects={LEDGER: (ledger.dump(), 1)}, **kwargs)


# -- the ledger: compare-and-swap, 409, the budget ------------------------------------------------


def test_a_conflict_is_read_again_and_the_grant_decided_on_the_new_ledger():
    api = new_api(budget=2, conflicts=1)
    gate = LedgerGate(api, LEDGER, "pod-a", clock=lambda: 100.0)
    assert gate.acquire(["gpu-1", "gpu-2", "gpu-3"], want=3) == ["gpu-1", "gpu-2"]
    assert (api.gets, api.puts) == (2, 2)  # 409, then read again and written
    assert api.ledger().in_flight == {"gpu-1": "pod-a", "gpu-2": "pod-a"}
    assert api.ledger().heartbeat == 100.0


def test_kubectl_api_takes_kubectls_409_as_a_conflict_then_succeeds():
    """The controller's KubectlApi against a kubectl that answers Conflict once."""
    store = {"version": "7", "data": new_api().objects[LEDGER][0]}
    calls: list[tuple[str, bytes | None]] = []

    def kubectl(command, stdin):
        calls.append((command, stdin))
        if command.startswith("get configmap"):
            meta = {"name": LEDGER, "resourceVersion": store["version"], "labels": {"a": "b"}}
            return 0, json.dumps({"metadata": meta, "data": store["data"]}), ""
        body = json.loads(stdin)
        if body["metadata"]["resourceVersion"] != store["version"] or len(calls) == 2:
            store["version"] = str(int(store["version"]) + 1)  # another writer won
            return (
                1,
                "",
                (
                    "Error from server (Conflict): Operation cannot be fulfilled on configmaps "
                    f'"{LEDGER}": the object has been modified; please apply your changes'
                ),
            )
        store.update(version=str(int(store["version"]) + 1), data=body["data"])
        return 0, "configmap replaced", ""

    api = fleetgate.KubectlApi("gpuinfra", kubectl)
    gate = LedgerGate(api, LEDGER, "pod-a", clock=lambda: 5.0)
    assert gate.acquire(["gpu-1"], want=1) == ["gpu-1"]
    assert [c for c, _ in calls] == [
        f"get configmap {LEDGER} -o json",
        "replace -f -",
        f"get configmap {LEDGER} -o json",
        "replace -f -",
    ]
    assert json.loads(calls[-1][1])["metadata"]["labels"] == {"a": "b"}
    assert Ledger.parse(store["data"]).in_flight == {"gpu-1": "pod-a"}


def test_kubectl_api_raises_on_an_error_that_is_not_a_conflict():
    api = fleetgate.KubectlApi("gpuinfra", lambda c, s: (1, "", "Forbidden: no update"))
    with pytest.raises(fleetgate.LedgerError, match="Forbidden"):
        api.get(LEDGER)


def contend(api: FakeApi, budget_hosts: list[list[str]], want: int) -> tuple[int, list[str]]:
    """Two (or more) shards, each a thread with its own gate on one ledger, applying their
    hosts; returns the most hosts any moment had in flight, counted by the shards themselves
    (not by the ledger), and every host that ran."""
    active = 0
    most = 0
    ran: list[str] = []
    count = threading.Lock()

    def shard(index: int, hosts: list[str]) -> None:
        nonlocal active, most
        gate = LedgerGate(api, LEDGER, f"pod-{index}", sleep=lambda s: time.sleep(0.001))
        pending = list(hosts)
        while pending:
            granted = gate.acquire(pending, want=want)
            with count:
                active += len(granted)
                most = max(most, active)
                ran.extend(granted)
            time.sleep(random.uniform(0, 0.004))  # the step's work
            with count:
                active -= len(granted)
            gate.release(dict.fromkeys(granted, "changed"))
            pending = [h for h in pending if h not in granted]

    threads = [threading.Thread(target=shard, args=(i, h)) for i, h in enumerate(budget_hosts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return most, ran


def test_two_gates_on_one_ledger_never_exceed_the_budget():
    random.seed(32)
    hosts = [[f"gpu-{i}" for i in range(12)], [f"cpu-{i}" for i in range(12)]]
    api = new_api(budget=3, total=24, delay=lambda: time.sleep(random.uniform(0, 0.002)))
    most, ran = contend(api, hosts, want=2)
    assert most <= 3
    assert sorted(ran) == sorted(hosts[0] + hosts[1])  # every host ran, none twice
    assert len(api.ledger().done) == 24 and not api.ledger().in_flight
    assert api.puts > api.gets / 4 and api.puts > 24  # conflicts happened: a real contention
    assert most <= rolloutjob.most_in_flight(api.ledger()) <= 3  # what the report says


def test_the_contention_test_catches_a_store_without_compare_and_swap():
    """Positive control: both shards read the ledger before either writes (a barrier), so a
    store that ignores resourceVersion lets both take the budget's one slot."""
    barrier = threading.Barrier(2)
    first_reads = threading.local()

    def both_read_first():
        if not getattr(first_reads, "done", False):
            first_reads.done = True
            barrier.wait(timeout=10)

    hosts = [["gpu-1"], ["cpu-1"]]
    lax = new_api(budget=1, total=2, compare=False, delay=both_read_first)
    assert contend(lax, hosts, want=1)[0] == 2
    strict = new_api(budget=1, total=2, compare=True, delay=both_read_first)
    assert contend(strict, hosts, want=1)[0] == 1


def test_past_fail_percent_the_ledger_stops_and_every_shard_skips_its_untried_hosts():
    api = new_api(budget=2, total=4, fail_percent=25)
    a = LedgerGate(api, LEDGER, "pod-a")
    b = LedgerGate(api, LEDGER, "pod-b")
    assert a.acquire(["gpu-1", "gpu-2"], want=2) == ["gpu-1", "gpu-2"]
    a.release({"gpu-1": "failed", "gpu-2": "unreachable"})  # 50 % > 25 %
    assert b.acquire(["cpu-1"], want=1) == []
    assert b.stopped and "2 of 4 hosts failed, over fail_percent 25" in b.stopped
    assert api.ledger().stopped == b.stopped
    assert a.acquire(["gpu-3"], want=1) == [] and a.stopped == b.stopped


def test_within_fail_percent_the_rollout_goes_on():
    """Positive control of the test above: one failure of four is 25 %, not over it."""
    api = new_api(budget=2, total=4, fail_percent=25)
    gate = LedgerGate(api, LEDGER, "pod-a")
    gate.release({"gpu-1": "failed"})
    assert gate.acquire(["cpu-1"], want=1) == ["cpu-1"] and gate.stopped is None


def test_the_runner_asks_the_gate_and_reports_a_stopped_rollouts_hosts_skipped(loaded, monkeypatch):
    api = new_api(budget=1, total=2, fail_percent=0)
    gate = LedgerGate(api, LEDGER, "pod-a")
    ran: list[list[str]] = []

    def fake_batch(loaded, options, contexts, phases, report, progress, asked=None):
        ran.append([c.name for c in contexts])
        for ctx in contexts:
            report.hosts[ctx.name] = HostReport(ctx.name, HostStatus.failed, error="boom")

    monkeypatch.setattr(runner, "_run_batch", fake_batch)
    options = RunOptions(mode=Mode.apply, limit=("gpu-1", "cpu-1"))
    report = runner.run(loaded, options, gate=gate)
    assert ran == [["gpu-1"]]  # the budget let one in; its failure stopped the rest
    assert report.hosts["cpu-1"].status is HostStatus.skipped
    assert report.stopped and "over fail_percent 0" in report.stopped


def test_the_runner_without_a_gate_runs_each_step_whole(loaded, monkeypatch):
    ran: list[list[str]] = []

    def fake_batch(loaded, options, contexts, phases, report, progress, asked=None):
        ran.append([c.name for c in contexts])
        for ctx in contexts:
            report.hosts[ctx.name] = HostReport(ctx.name, HostStatus.ok)

    monkeypatch.setattr(runner, "_run_batch", fake_batch)
    runner.run(loaded, RunOptions(mode=Mode.apply, limit=("gpu-1", "cpu-1")))
    assert ran == [["gpu-1", "cpu-1"]]


# -- the join rate across shards ------------------------------------------------------------------


def simulate(make_pacer, shards: int, rate: Rate, seed: int, joins: int = 40) -> list[float]:
    """Every shard joining `joins` hosts on its own simulated clock (the shards share only the
    wall clock): random first moments, join times, oversleeps (some past the pacer's lateness)
    and 429s; the start times of all joins."""
    rng = random.Random(seed)
    starts: list[float] = []
    for index in range(shards):
        now = [rng.uniform(0, 50)]

        def sleep(seconds: float, now=now) -> None:
            now[0] += seconds + rng.choice([0.0, rng.uniform(0, 2 * SlotPacer.LATE_S)])

        pacer = make_pacer(index, lambda now=now: now[0], sleep)
        for _ in range(joins):
            pacer.acquire()
            starts.append(now[0])
            now[0] += rng.choice([0.0, rng.uniform(0, rate.seconds)])  # the join's own time
            if rng.random() < 0.15:
                pacer.slow_down()  # the API answered 429
            else:
                pacer.recover()
    return sorted(starts)


def most_in_a_window(starts: list[float], seconds: float) -> int:
    """The most starts any half-open window [t, t + seconds) holds (it suffices to put t on
    each start)."""
    most = 0
    right = 0
    for left, start in enumerate(starts):
        while right < len(starts) and starts[right] < start + seconds:
            right += 1
        most = max(most, right - left)
    return most


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("rate", "shards"), [(Rate(5, 10), 2), (Rate(5, 10), 7), (Rate(3, 1), 16)])
def test_no_window_of_the_rate_holds_more_joins_than_it_allows(rate, shards, seed):
    starts = simulate(
        lambda i, clock, sleep: SlotPacer(rate, i, shards, clock=clock, sleep=sleep),
        shards,
        rate,
        seed,
    )
    assert len(starts) == shards * 40
    assert most_in_a_window(starts, rate.seconds) <= rate.hosts


def test_the_window_check_catches_a_static_share_of_the_rate():
    """Positive control: each shard keeping its own sliding window of Rate(h, s * N) lets N
    shards start together, as the design says a static share cannot promise the rate."""
    rate, shards = Rate(5, 10), 4
    starts = simulate(
        lambda i, clock, sleep: Pacer(Rate(rate.hosts, rate.seconds * shards), clock, sleep),
        shards,
        rate,
        seed=1,
    )
    assert most_in_a_window(starts, rate.seconds) > rate.hosts


def test_a_shard_starts_only_in_its_own_slots_and_a_429_skips_two_to_the_k():
    clock = [0.0]
    pacer = SlotPacer(
        Rate(5, 10),
        1,
        3,
        clock=lambda: clock[0],
        sleep=lambda s: clock.__setitem__(0, clock[0] + s),
        late=0.0,
    )
    assert pacer.slot == 2.0
    pacer.acquire()
    assert clock[0] == 2.0  # slot 1: shard 1 of 3
    pacer.acquire()
    assert clock[0] == 8.0  # slot 4
    pacer.slow_down()  # k = 1: its next 2 slots (7, 10) skipped
    pacer.acquire()
    assert clock[0] == 26.0  # slot 13
    pacer.slow_down()
    pacer.slow_down()  # k = 3: 8 of its slots
    pacer.acquire()
    assert clock[0] == 26.0 + 2.0 * 3 * 9
    clock[0] += 2.0 * 3 + 0.5  # half a slot into its next own slot: too late, the one after
    pacer.acquire()
    assert clock[0] == 26.0 + 2.0 * 3 * 11


# -- a retried pod resumes ------------------------------------------------------------------------


def progress_api(ledger: Ledger, progress: dict) -> FakeApi:
    return FakeApi(
        objects={
            LEDGER: (ledger.dump(), 1),
            f"{LEDGER}-0": ({fleetgate.PROGRESS_KEY: json.dumps(progress)}, 1),
        }
    )


def test_a_retried_pod_skips_done_hosts_adopts_those_in_flight_and_applies_them_first():
    ledger = Ledger(run="r1", budget=2, total=5, in_flight={"gpu-1": "pod-a", "cpu-9": "pod-z"})
    api = progress_api(
        ledger,
        {"pods": ["pod-a"], "hosts": {"cpu-1": "changed", "gpu-1": "in_flight", "gpu-2": "failed"}},
    )
    progress = ShardProgress(api, f"{LEDGER}-0", "pod-b")
    gate = LedgerGate(api, LEDGER, "pod-b", progress=progress)
    todo = resume(progress, gate, ["cpu-1", "gpu-1", "gpu-2", "gpu-3"])
    assert todo == ["gpu-1", "gpu-3"]  # cpu-1 done, gpu-2 failed (counted), gpu-1 adopted first
    assert api.ledger().in_flight == {"gpu-1": "pod-b", "cpu-9": "pod-z"}  # still counted
    assert progress.pods == ["pod-a", "pod-b"]
    puts = api.puts
    assert gate.acquire(todo, want=2) == ["gpu-1"]  # adopted: no new grant
    assert api.puts == puts  # counted already: no new grant written
    gate.release({"gpu-1": "changed"})
    assert gate.acquire(["gpu-3"], want=1) == ["gpu-3"]
    assert api.ledger().in_flight == {"cpu-9": "pod-z", "gpu-3": "pod-b"}
    assert ["r" for e in api.ledger().history if e[2] == "adopt"] == ["r"]


def test_a_host_released_before_its_pod_died_is_done_again_not_adopted():
    ledger = Ledger(run="r1", budget=1, total=1, done=["gpu-1"])
    api = progress_api(ledger, {"pods": ["pod-a"], "hosts": {"gpu-1": "in_flight"}})
    progress = ShardProgress(api, f"{LEDGER}-0", "pod-b")
    gate = LedgerGate(api, LEDGER, "pod-b", progress=progress)
    assert resume(progress, gate, ["gpu-1"]) == ["gpu-1"] and gate.held == []
    assert gate.acquire(["gpu-1"], want=1) == ["gpu-1"]
    gate.release({"gpu-1": "ok"})
    assert api.ledger().done == ["gpu-1"]  # counted once


def test_a_host_granted_but_never_marked_is_adopted_from_the_ledger():
    """The pod died between its grant (the ledger: gpu-2 in flight) and its mark (the progress
    never heard of gpu-2): the next pod adopts it, the budget it holds is given back when it
    ends, and the rollout finishes instead of waiting for ever."""
    ledger = Ledger(run="r1", budget=1, total=3, done=["gpu-1"], in_flight={"gpu-2": "pod-a"})
    api = progress_api(ledger, {"pods": ["pod-a"], "hosts": {"gpu-1": "changed"}})
    progress = ShardProgress(api, f"{LEDGER}-0", "pod-b")
    waits: list[float] = []
    gate = LedgerGate(api, LEDGER, "pod-b", progress=progress, sleep=waits.append)
    todo = resume(progress, gate, ["gpu-1", "gpu-2", "gpu-3"])
    assert todo == ["gpu-2", "gpu-3"] and gate.held == ["gpu-2"]
    assert api.ledger().in_flight == {"gpu-2": "pod-b"}
    assert gate.acquire(todo, want=1) == ["gpu-2"]
    gate.release({"gpu-2": "changed"})
    assert gate.acquire(["gpu-3"], want=1) == ["gpu-3"] and waits == []
    gate.release({"gpu-3": "changed"})
    assert sorted(api.ledger().done) == ["gpu-1", "gpu-2", "gpu-3"]


def test_the_controller_names_a_retried_shard_and_its_hosts_ends():
    rollout = Rollout.__new__(Rollout)
    rollout.loaded = type("L", (), {"cluster": type("C", (), {"name": "small"})()})()
    rollout.options = RunOptions(mode=Mode.apply)
    rollout.shard_of = [["cpu-1", "gpu-1"], ["gpu-2"]]
    rollout.status = {"conditions": [{"type": "Complete", "status": "True"}]}
    rollout.started = time.monotonic()
    rollout.ledger = Ledger(run="r", budget=1, total=3, done=["cpu-1", "gpu-1"], failed=["gpu-2"])
    rollout.progress = [
        {"pods": ["p-0-a", "p-0-b"], "hosts": {"cpu-1": "changed", "gpu-1": "ok"}},
        {"pods": ["p-1-a"], "hosts": {"gpu-2": "failed"}},
    ]
    rollout.last_lines = {"p-1-a": "gpu-2: Apply the kubelet unit failed: exit 1"}
    report = rolloutjob.rollout_report(rollout)
    assert {n: h.status for n, h in report.hosts.items()} == {
        "cpu-1": HostStatus.changed,
        "gpu-1": HostStatus.ok,
        "gpu-2": HostStatus.failed,
    }
    assert "shard 0/2 was retried: pods p-0-a, p-0-b" in report.notes[0]
    assert "p-1-a" in (report.hosts["gpu-2"].error or "")
    # What the pod said is in the report: the run deletes the pod, so kubectl logs cannot.
    assert "gpu-2: Apply the kubelet unit failed: exit 1" in (report.hosts["gpu-2"].error or "")


# -- refusals (exit 2) ----------------------------------------------------------------------------


def rollout_cluster(small_cluster, write_cluster, tmp_path: Path, **job):
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.61 ssh-ed25519 AAAA\n")
    small_cluster["ssh"] = {"known_hosts": str(known)}
    small_cluster["group_vars"] = {
        "all": {"rollout_job": {"enabled": True, "nodes": ["cpu-1"], **job}}
    }
    return write_cluster(small_cluster)


@pytest.mark.parametrize(
    ("limit", "group"),
    [
        ("etcd", "etcd"),
        ("control_plane", "control_plane"),
        ("lb-1", "loadbalancer"),
        ("dns", "dns"),
        ("", "etcd"),
    ],
)
def test_apply_job_refuses_a_limit_reaching_a_group_that_does_not_roll_in_batches(
    small_cluster, write_cluster, tmp_path, limit, group
):
    path = rollout_cluster(small_cluster, write_cluster, tmp_path)
    extra = ["--limit", f"gpu_worker,{limit}"] if limit else []
    result = CliRunner().invoke(app, ["apply", str(path), "--job", "--yes", *extra])
    assert result.exit_code == 2
    assert f"of the group {group}, which rolls" in result.stderr
    assert "Traceback" not in result.output
    assert not (path.parent / ".state").exists()  # refused before the lock


def test_apply_job_accepts_the_worker_groups(small_cluster, write_cluster, tmp_path):
    """Positive control: the same check passes gpu_worker and cpu_worker."""
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    rollout = Rollout(loaded, RunOptions(mode=Mode.apply, limit=("gpu_worker", "cpu_worker")))
    check_options(rollout)
    assert rollout.control_plane == "cp-1"
    assert "rollout_job" not in rollout.roles and "drift_job" not in rollout.roles
    assert "kubernetes" in rollout.roles


@pytest.mark.parametrize(
    ("job", "args", "said"),
    [
        ({"enabled": False}, ["--limit", "gpu_worker"], "rollout_job.enabled: true"),
        ({}, ["--limit", "gpu_worker", "--roles", "drift_job"], "carry a key from .state/"),
        ({}, ["--limit", "gpu_worker", "--batch", "2"], "no --reboot, --batch or --rate"),
    ],
)
def test_apply_job_refuses_what_a_job_cannot_do(
    small_cluster, write_cluster, tmp_path, job, args, said
):
    path = rollout_cluster(small_cluster, write_cluster, tmp_path, **job)
    result = CliRunner().invoke(app, ["apply", str(path), "--job", "--yes", *args])
    assert result.exit_code == 2 and said in result.stderr


def test_shards_without_job_is_refused(small_cluster, write_cluster, tmp_path):
    path = rollout_cluster(small_cluster, write_cluster, tmp_path)
    result = CliRunner().invoke(app, ["apply", str(path), "--shards", "2", "--yes"])
    assert result.exit_code == 2 and "--shards: only with --job" in result.stderr


# -- secrets and the manifest ---------------------------------------------------------------------


def test_the_rollout_key_is_0600_in_a_0700_folder_from_creation(
    small_cluster, write_cluster, tmp_path
):
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    with pytest.raises(StateMissing):
        KEY.private_key(loaded.state_dir, StateAccess.existing)  # never made by a read
    KEY.private_key(loaded.state_dir, StateAccess.create)
    path = loaded.state_dir / STATE_KEY
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_only_the_worker_groups_admit_the_key_with_restrict_and_from(
    small_cluster, write_cluster, tmp_path
):
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    KEY.private_key(loaded.state_dir, StateAccess.create)
    files = {ctx.name: {f.path: f for f in host_files(ctx)} for ctx in host_contexts(loaded)}
    holders = sorted(name for name, found in files.items() if KEYS_FILE in found)
    assert holders == ["cpu-1", "gpu-1"]
    line = files["gpu-1"][KEYS_FILE].content
    assert line.startswith('cert-authority,principals="gpuinfra-rollout",restrict,from="')
    assert "10.0.0.71" in line and "PRIVATE" not in line


def test_an_inventory_without_the_job_has_no_rollout_file(loaded):
    for ctx in host_contexts(loaded):
        assert not any("gpuinfra-rollout" in f.path for f in host_files(ctx))


SAMPLE_LEDGER = "gpuinfra-rollout-sample"
WORKERS = ("gpu_worker", "cpu_worker")
# What the sample's workers' files read of .state/: their CephFS client's key and the fsid.
CLIENT_STATE = ["shared_fs/client.training.key", "shared_fs/fsid"]


def sample_cluster(tmp_path: Path, *, applied: bool = True) -> LoadedCluster:
    """inventory/sample (storage hosts included) with the rollout Job on; `applied`: its whole
    .state/ made as an apply makes it (every host's files rendered with StateAccess.create)."""
    data = yaml.safe_load((SAMPLE / "cluster.yml").read_text())
    known = tmp_path / "known_hosts"
    known.write_text("10.40.2.1 ssh-ed25519 AAAA\n")
    data["ssh"]["known_hosts"] = str(known)
    data["group_vars"]["all"]["rollout_job"] = {"enabled": True, "nodes": ["cp-2"]}
    path = tmp_path / "inv" / "cluster.yml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load(path)
    if applied:
        for ctx in host_contexts(loaded):
            host_files(ctx)
    else:
        KEY.private_key(loaded.state_dir, StateAccess.create)
    return loaded


def sample_rollout(loaded) -> tuple[Rollout, Kubectl]:
    """`apply --job --limit gpu_worker,cpu_worker` with every role, against a stand-in cp-1."""
    kubectl = Kubectl({}, ledger=SAMPLE_LEDGER)
    rollout = Rollout(
        loaded, RunOptions(mode=Mode.apply, limit=WORKERS), runner=kubectl, sleep=lambda s: None
    )
    rolloutjob.fleet_rollout(rollout)
    return rollout, kubectl


@pytest.fixture(scope="module")
def published_sample(tmp_path_factory) -> tuple[LoadedCluster, Rollout, Kubectl]:
    """The sample applied once and its workers' rollout published (the slow part, shared)."""
    loaded = sample_cluster(tmp_path_factory.mktemp("sample"))
    return (loaded, *sample_rollout(loaded))


def state_sent(kubectl: Kubectl) -> dict[str, str]:
    data = kubectl.documents()[("Secret", rolloutjob.STATE_SECRET)]["data"]
    return json.loads(base64.b64decode(data["state.json"]))


def test_the_pods_get_exactly_the_state_entries_the_workers_files_read(published_sample):
    """Every role on the sample's workers: the CephFS client's key and the fsid, which those
    workers hold, travel (in a Secret the Job owns, never on a command line); nothing else of
    .state/ (the etcd CA, the other cephx keys, the rollout authority, TSIG, VRRP) is in
    anything sent to cp-1."""
    loaded, rollout, kubectl = published_sample
    assert "shared_fs" in rollout.roles and "kubernetes" in rollout.roles
    state = state_sent(kubectl)
    assert sorted(state) == CLIENT_STATE
    for relative, value in state.items():
        assert value == (loaded.state_dir / relative).read_text()
        assert not any(value.strip() in c for c in kubectl.commands)
    secrets = [d for d in kubectl.manifest if d["kind"] == "Secret"]
    sent = "\n".join(
        [*kubectl.commands, *(s.decode() for s in kubectl.stdin)]
        + [base64.b64decode(v).decode() for d in secrets for v in d["data"].values()]
    )
    kept = [
        path
        for path in loaded.state_dir.rglob("*")
        if path.is_file() and path.relative_to(loaded.state_dir).as_posix() not in state
    ]
    assert any(p.name == "ca.key" for p in kept) and any("rollout" in p.parts for p in kept)
    # Lines every OpenSSH key starts with (the run's own key has them too) say nothing.
    header = set(sshkeys.new_ed25519().splitlines())
    for path in kept:
        lines = [line for line in path.read_text().splitlines() if len(line) >= 16]
        assert not any(line in sent for line in lines if line not in header), path
    assert all(value.strip() in sent for value in state.values())  # the check's control
    job = kubectl.documents()[("Job", SAMPLE_LEDGER)]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in job["containers"][0]["volumeMounts"]}
    assert Path(mounts["state"]) == rolloutshard.MOUNTED_STATE.parent
    assert Path(rolloutjob.MOUNTED_STATE) == rolloutshard.MOUNTED_STATE
    assert rolloutjob.SETTINGS_FORMAT == rolloutshard.SETTINGS_FORMAT


def test_a_pods_roles_render_the_workers_from_what_it_received(tmp_path, published_sample):
    """The pod stages the inventory and the state Secret as the Job mounts them and renders
    every selected role's files on every selected worker, as the controller renders them.
    Positive controls: with nothing of .state/ the CephFS client's files do not render, nor do
    the roles left to a local apply's (their keys never travel)."""
    loaded, rollout, kubectl = published_sample
    docs = kubectl.documents()
    inventory = yaml.safe_load(
        docs[("ConfigMap", f"{SAMPLE_LEDGER}-inventory")]["data"]["cluster.yml"]
    )
    key = tmp_path / "pod-key"  # the pod's copy of the run's key (POD_KEY), here
    key.write_text("KEY\n")
    key.chmod(0o600)
    inventory["ssh"]["key"] = str(key)
    mounted = tmp_path / "mounted" / "cluster.yml"
    mounted.parent.mkdir()
    mounted.write_text(yaml.safe_dump(inventory, sort_keys=False))
    received = tmp_path / "mounted" / "state.json"
    received.write_text(json.dumps(state_sent(kubectl)))
    staged = rolloutshard.stage_inventory(mounted, received, tmp_path / "run")
    pod = load(staged).with_state_access(StateAccess.existing)
    assert pod.state_dir == tmp_path / "run" / ".state"
    staged_state = [p for p in pod.state_dir.rglob("*") if p.is_file()]
    assert sorted(p.relative_to(pod.state_dir).as_posix() for p in staged_state) == CLIENT_STATE
    assert stat.S_IMODE((pod.state_dir / CLIENT_STATE[0]).stat().st_mode) == 0o600
    assert stat.S_IMODE((pod.state_dir / "shared_fs").stat().st_mode) == 0o700
    controller = {c.name: c for c in host_contexts(loaded.with_state_access(StateAccess.existing))}
    workers = [c for c in host_contexts(pod) if c.name in rollout.hosts]
    assert len(workers) == 10
    for ctx in workers:
        files = host_files(ctx, rollout.roles)
        assert files == host_files(controller[ctx.name], rollout.roles)
        assert any(f.path.endswith("ceph.client.training.keyring") for f in files)
        with pytest.raises(StateMissing):
            host_files(ctx, ("rollout_job",))
    received.write_text("{}")
    bare = load(rolloutshard.stage_inventory(mounted, received, tmp_path / "bare"))
    bare = bare.with_state_access(StateAccess.existing)
    gpu = next(c for c in host_contexts(bare) if c.name == "gpu-1")
    with pytest.raises(StateMissing, match="client.training.key"):
        host_files(gpu, ("shared_fs",))


def test_a_state_entry_the_workers_do_not_hold_is_refused_by_the_rule_itself(
    small_cluster, write_cluster, tmp_path
):
    """The drift Job's key is read by its keys file, which holds only its public half: the
    rule (not a list) refuses it, naming the role, the host and the entry."""
    path = rollout_cluster(small_cluster, write_cluster, tmp_path)
    data = yaml.safe_load(path.read_text())
    data["group_vars"]["all"]["drift_job"] = {"enabled": True, "nodes": ["cpu-1"]}
    data["group_vars"]["all"]["kubernetes"] = {"routes_nat_outgoing": True}
    path.write_text(yaml.safe_dump(data))
    loaded = load(path)
    for ctx in host_contexts(loaded):
        host_files(ctx)
    rollout = Rollout(loaded, RunOptions(mode=Mode.apply, limit=WORKERS))
    check_options(rollout)
    rolloutjob.make_shards(rollout)
    rolloutjob.gather_state(rollout)
    assert rollout.state == {}  # the small cluster has no storage: its workers read nothing
    rollout.roles = ("drift_job",)  # past check_options, which refuses it by name
    with pytest.raises(jobs.JobRefused, match=r"on cpu-1 read \.state/drift/id_ed25519, which no"):
        rolloutjob.gather_state(rollout)


def test_a_worker_state_entry_not_made_yet_is_refused_before_anything_is_published(tmp_path):
    loaded = sample_cluster(tmp_path, applied=False)
    kubectl = Kubectl({}, ledger=SAMPLE_LEDGER)
    rollout = Rollout(
        loaded, RunOptions(mode=Mode.apply, limit=WORKERS), runner=kubectl, sleep=lambda s: None
    )
    with pytest.raises(jobs.JobRefused, match="shared_fs's files on gpu-1 read .*is missing"):
        rolloutjob.fleet_rollout(rollout)
    assert not kubectl.commands
    assert not (loaded.state_dir / "shared_fs").exists()  # read, never made


def test_a_pod_without_its_state_secret_exits_2_before_asking_the_ledger(tmp_path, capsys):
    """A controller older than the state Secret (or a mount gone): the Job fails at once."""
    settings = {"format": rolloutjob.SETTINGS_FORMAT, "count": 1, "shards": [["gpu-1"]]}
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    (tmp_path / "cluster.yml").write_text("name: x\n")
    api = new_api()
    code = rolloutshard.main(
        tmp_path / "cluster.yml",
        api=api,
        environ={"JOB_COMPLETION_INDEX": "0"},
        mounted_state=tmp_path / "absent" / "state.json",
        staged=tmp_path / "run",
    )
    assert code == 2 and "absent/state.json: unreadable" in capsys.readouterr().err
    assert api.gets == 0


@pytest.mark.parametrize("relative", ["../cluster.yml", "/etc/passwd", "shared_fs/../../x"])
def test_a_pod_refuses_a_state_entry_outside_its_state_folder(tmp_path, relative):
    mounted = tmp_path / "cluster.yml"
    mounted.write_text("name: x\n")
    received = tmp_path / "state.json"
    received.write_text(json.dumps({relative: "x"}))
    with pytest.raises(rolloutshard.ShardInputError, match="not a path under .state/"):
        rolloutshard.stage_inventory(mounted, received, tmp_path / "run")
    assert not (tmp_path / "run" / "cluster.yml").exists()


class Kubectl:
    """cp-1's kubectl and kubeadm for the controller's flow: a token, the manifest, a Job that
    completes with each shard's progress written as its pods would."""

    def __init__(self, ends: dict[str, str], ledger: str = LEDGER):
        self.ends = ends
        self.ledger = ledger
        self.commands: list[str] = []
        self.stdin: list[bytes] = []
        self.manifest: list[dict] = []
        self.maps: dict[str, dict] = {}

    def __call__(self, loaded, host, command, *, timeout, stdin=None):
        assert host == "cp-1"
        self.commands.append(command)
        if stdin is not None:
            self.stdin.append(stdin)
        if "kubeadm token create" in command:
            return RemoteResult(
                host,
                0,
                "kubeadm join 10.0.0.21:6443 --token abcdef.0123456789abcdef "
                "--discovery-token-ca-cert-hash sha256:" + "a" * 64 + "\n",
            )
        if "apply -f -" in command:
            self.manifest = [d for d in yaml.safe_load_all(stdin.decode()) if d]
            for doc in self.manifest:
                if doc["kind"] == "ConfigMap":
                    self.maps[doc["metadata"]["name"]] = doc["data"]
            self._run_shards()
            return RemoteResult(host, 0, "applied")
        if " get job " in command and "jsonpath={.metadata.uid}" in command:
            return RemoteResult(host, 0, "0b1c2d3e-uid")
        if " get job " in command:
            return RemoteResult(
                host,
                0,
                json.dumps({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}),
            )
        if " logs " in command:
            return RemoteResult(host, 0, "gpu-1: Install kubelet failed: exit 100\n")
        if " get configmap " in command:
            name = command.split(" get configmap ")[1].split()[0]
            meta = {"name": name, "resourceVersion": "1"}
            return RemoteResult(host, 0, json.dumps({"metadata": meta, "data": self.maps[name]}))
        return RemoteResult(host, 0, "")

    def _run_shards(self) -> None:
        settings = json.loads(self.maps[f"{self.ledger}-inventory"]["settings.json"])
        ledger = Ledger.parse(self.maps[self.ledger])
        for index, hosts in enumerate(settings["shards"]):
            ends = {h: self.ends.get(h, "changed") for h in hosts}
            pods = [f"{self.ledger}-{index}-a"]
            self.maps[f"{self.ledger}-{index}"] = {
                fleetgate.PROGRESS_KEY: json.dumps({"pods": pods, "hosts": ends})
            }
            for host, end in ends.items():
                (ledger.failed if end in fleetgate.FAILED_ENDS else ledger.done).append(host)
        self.maps[self.ledger] = ledger.dump()

    def documents(self) -> dict[tuple[str, str], dict]:
        return {(d["kind"], d["metadata"]["name"]): d for d in self.manifest}


def worker_rollout(loaded, kubectl, **changes) -> Rollout:
    """A rollout of the worker groups through `kubectl`, with no real waits."""
    options = RunOptions(mode=Mode.apply, limit=("gpu_worker", "cpu_worker"))
    return Rollout(loaded, options, runner=kubectl, **{"sleep": lambda s: None, **changes})


def test_the_flow_publishes_a_manifest_without_state_and_keeps_secrets_off_command_lines(
    small_cluster, write_cluster, tmp_path
):
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    key = KEY.private_key(loaded.state_dir, StateAccess.create)
    kubectl = Kubectl({"gpu-1": "failed"})
    rollout = worker_rollout(loaded, kubectl)
    report = rolloutjob.fleet_rollout(rollout)
    assert report.hosts["cpu-1"].status is HostStatus.changed
    assert report.hosts["gpu-1"].status is HostStatus.failed
    # The failed shard's pod's last lines are in the report, read before the Job is deleted.
    assert "gpu-1: Install kubelet failed: exit 100" in (report.hosts["gpu-1"].error or "")
    logs = next(i for i, c in enumerate(kubectl.commands) if " logs " in c)
    deleted = next(i for i, c in enumerate(kubectl.commands) if "delete job,configmap" in c)
    assert logs < deleted and f"logs {LEDGER}-" in kubectl.commands[logs]
    # The token and the key: on stdin only, never on a command line.
    token = "abcdef.0123456789abcdef"
    assert not any(token in c or "PRIVATE KEY" in c for c in kubectl.commands)
    assert any(
        c.endswith("kubeadm token delete --kubeconfig /etc/kubernetes/admin.conf abcdef")
        for c in kubectl.commands
    )
    assert any("delete job,configmap,secret,role,rolebinding" in c for c in kubectl.commands)
    docs = {(d["kind"], d["metadata"]["name"]): d for d in kubectl.manifest}
    job = docs[("Job", LEDGER)]
    assert not state_mounts(job)
    inventory = yaml.safe_load(docs[("ConfigMap", f"{LEDGER}-inventory")]["data"]["cluster.yml"])
    assert inventory["ssh"]["key"] == rolloutjob.POD_KEY
    assert key.strip() not in json.dumps(job)
    assert state_sent(kubectl) == {}  # no storage: the workers' files read nothing of .state/
    role = docs[("Role", "gpuinfra-rollout")]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "update"],
            "resourceNames": [LEDGER, f"{LEDGER}-0", f"{LEDGER}-1"],
        }
    ]
    joined = json.loads(
        __import__("base64").b64decode(
            docs[("Secret", "gpuinfra-rollout-join")]["data"]["join.json"]
        )
    )
    assert joined == {"token": token, "ca_cert_hash": "sha256:" + "a" * 64}
    # The Job starts suspended, owns both Secrets (the collector deletes them with it), then runs.
    assert job["spec"]["suspend"] is True
    patched = [c for c in kubectl.commands if " patch " in c]
    assert [c.split(" patch ")[1].split(" --type")[0] for c in patched] == [
        "secret gpuinfra-rollout-ssh",
        "secret gpuinfra-rollout-join",
        "secret gpuinfra-rollout-state",
        f"job {LEDGER}",
    ]
    assert all('"uid": "0b1c2d3e-uid"' in c and '"kind": "Job"' in c for c in patched[:3])
    assert '"suspend": false' in patched[3]
    applied = next(i for i, c in enumerate(kubectl.commands) if "apply -f -" in c)
    started = kubectl.commands.index(patched[3])
    assert applied < kubectl.commands.index(patched[0]) < started


def test_the_secret_holds_a_key_of_this_run_certified_until_the_tokens_end(
    small_cluster, write_cluster, tmp_path
):
    """Not the authority: a new key each run, its certificate signed by the authority for the
    rollout principal, from the keys file's sources, valid from a little before the run until
    the deadline and the token's margin."""
    from cryptography.hazmat.primitives import serialization

    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    authority = KEY.private_key(loaded.state_dir, StateAccess.create)
    secrets_of = []
    for _ in range(2):
        kubectl = Kubectl({})
        rollout = worker_rollout(loaded, kubectl, clock=lambda: 1_800_000_000.0)
        rolloutjob.fleet_rollout(rollout)
        docs = {(d["kind"], d["metadata"]["name"]): d for d in kubectl.manifest}
        data = docs[("Secret", "gpuinfra-rollout-ssh")]["data"]
        secrets_of.append({k: base64.b64decode(v).decode() for k, v in data.items()})
    first, second = secrets_of
    assert first["id_ed25519"] != second["id_ed25519"]
    assert authority.strip() not in (first["id_ed25519"] + first["id_ed25519-cert.pub"])
    cert = serialization.load_ssh_public_identity(first["id_ed25519-cert.pub"].encode())
    assert isinstance(cert, serialization.SSHCertificate)
    cert.verify_cert_signature()
    signer = serialization.load_ssh_private_key(authority.encode(), password=None).public_key()
    assert cert.signature_key().public_bytes_raw() == signer.public_bytes_raw()
    own = serialization.load_ssh_private_key(first["id_ed25519"].encode(), password=None)
    assert cert.public_key().public_bytes_raw() == own.public_key().public_bytes_raw()
    assert cert.valid_principals == [b"gpuinfra-rollout"]
    deadline = rollout.cfg.deadline_seconds
    assert (cert.valid_after, cert.valid_before) == (
        1_800_000_000 - rolloutjob.CERT_BACKDATE_S,
        1_800_000_000 + deadline + rolloutjob.TOKEN_MARGIN_S,
    )
    sources = cert.critical_options[b"source-address"].decode().split(",")
    assert sources == list(KEY.key_sources(loaded, rollout.cfg)) and "10.0.0.71" in sources
    assert cert.extensions == {}


def test_a_rollout_without_the_authority_is_refused_before_anything_is_published(
    small_cluster, write_cluster, tmp_path
):
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    kubectl = Kubectl({})
    rollout = worker_rollout(loaded.with_state_access(StateAccess.existing), kubectl)
    with pytest.raises(jobs.JobRefused, match="apply with rollout_job.enabled first"):
        rolloutjob.fleet_rollout(rollout)
    assert not any("apply -f -" in c for c in kubectl.commands)


def test_the_rollout_pods_get_a_network_policy_under_calico_only(
    small_cluster, write_cluster, tmp_path
):
    """ssh and the API port to the node network; no policy under "routes", which enforces none."""
    path = rollout_cluster(small_cluster, write_cluster, tmp_path)
    for cni, expected in (("calico", True), ("routes", False)):
        data = yaml.safe_load(path.read_text())
        data["group_vars"]["all"].setdefault("kubernetes", {})["cni"] = cni
        path.write_text(yaml.safe_dump(data))
        loaded = load(path)
        KEY.private_key(loaded.state_dir, StateAccess.create)
        kubectl = Kubectl({})
        rollout = worker_rollout(loaded, kubectl)
        rolloutjob.fleet_rollout(rollout)
        policies = [d for d in kubectl.manifest if d["kind"] == "NetworkPolicy"]
        assert bool(policies) is expected, cni
        if expected:
            (egress,) = policies[0]["spec"]["egress"]
            assert egress["to"] == [{"ipBlock": {"cidr": str(loaded.cluster.networks.node)}}]
            assert [p["port"] for p in egress["ports"]] == [22, loaded.cluster.api.port]
            assert policies[0]["spec"]["podSelector"]["matchLabels"] == {
                "app.kubernetes.io/name": "gpuinfra-rollout"
            }


def test_the_manifest_template_renders_under_strict_undefined(
    small_cluster, write_cluster, tmp_path
):
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        rolloutjob.render_template("rollout_job/rollout-job.yaml.j2", cfg=None, cluster_name="x")


def test_the_pod_copies_the_key_0400_and_names_the_copy(tmp_path):
    from engine import rolloutshard

    mounted = tmp_path / "mounted"
    mounted.write_text("KEY\n")
    mounted.chmod(0o440)
    copy = tmp_path / "run" / "id_ed25519"
    copy.parent.mkdir()
    rolloutshard.copy_key(mounted, copy)
    assert stat.S_IMODE(copy.stat().st_mode) == 0o400 and copy.read_text() == "KEY\n"
    assert (
        Path(rolloutjob.MOUNTED_KEY),
        Path(rolloutjob.POD_KEY),
    ) == (rolloutshard.MOUNTED_KEY, rolloutshard.POD_KEY)


def test_a_pod_of_another_gpuinfra_exits_2(tmp_path, capsys):
    from engine import rolloutshard

    (tmp_path / "settings.json").write_text(json.dumps({"format": 99}))
    code = rolloutshard.main(tmp_path / "cluster.yml", api=new_api(), environ={})
    assert code == 2 and "format 99" in capsys.readouterr().err


def state_mounts(job: dict) -> list[str]:
    """Every volume or mount of the Job's pods that names .state or a host path."""
    spec = job["spec"]["template"]["spec"]
    found = [v["name"] for v in spec.get("volumes", []) if "hostPath" in v]
    found += [
        m["mountPath"]
        for c in spec["containers"]
        for m in c.get("volumeMounts", [])
        if ".state" in m["mountPath"]
    ]
    return found


def test_the_state_mount_check_finds_one():
    """Positive control of `state_mounts`."""
    job = {
        "spec": {
            "template": {
                "spec": {
                    "volumes": [{"name": "state", "hostPath": {"path": "/root/.state"}}],
                    "containers": [{"volumeMounts": [{"mountPath": "/inv/.state"}]}],
                }
            }
        }
    }
    assert state_mounts(job) == ["state", "/inv/.state"]


# -- the in-cluster lock --------------------------------------------------------------------------


def ledger_on_cp1(ledger: Ledger, writes: list[bytes]):
    def run(loaded, host, command, *, timeout, stdin=None):
        if " logs " in command:
            return RemoteResult(host, 0, "gpu-1: Install kubelet failed: exit 100\n")
        if " get configmap " in command:
            meta = {"name": LEDGER, "resourceVersion": "3"}
            return RemoteResult(host, 0, json.dumps({"metadata": meta, "data": ledger.dump()}))
        if "replace -f -" in command:
            writes.append(stdin)
            return RemoteResult(host, 0, "replaced")
        return RemoteResult(host, 1, "", "unexpected")

    return run


def test_a_local_apply_during_a_live_rollout_exits_8_naming_the_job(
    small_cluster, write_cluster, tmp_path, monkeypatch
):
    path = rollout_cluster(small_cluster, write_cluster, tmp_path)
    live = Ledger(run="r9", budget=1, total=2, in_flight={"gpu-1": "p"}, heartbeat=time.time() - 5)
    monkeypatch.setattr(rolloutlock, "run_remote", ledger_on_cp1(live, []))
    result = CliRunner().invoke(app, ["apply", str(path), "--yes"])
    assert result.exit_code == 8
    assert "the rollout Job gpuinfra/gpuinfra-rollout-small (run r9" in result.stderr


def test_a_stale_heartbeat_or_an_ended_rollout_holds_nothing(
    small_cluster, write_cluster, tmp_path
):
    """Positive control of the test above: the same ledger, its heartbeat 121 s old and not
    renewed while watched."""
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    now = time.time()
    slept: list[float] = []
    stale = Ledger(run="r9", budget=1, total=2, in_flight={"gpu-1": "p"}, heartbeat=now - 121)
    found = rolloutlock.live_rollout(loaded, ledger_on_cp1(stale, []), now=now, sleep=slept.append)
    assert found is None and slept == [rolloutlock.WATCH_S]
    fresh = Ledger(run="r9", budget=1, total=2, in_flight={"gpu-1": "p"}, heartbeat=now - 119)
    held = rolloutlock.live_rollout(loaded, ledger_on_cp1(fresh, []), now=now, sleep=slept.append)
    assert held is not None and slept == [rolloutlock.WATCH_S]  # fresh: not watched
    ended = Ledger(run="r9", budget=1, total=1, done=["gpu-1"], heartbeat=now - 1)
    assert rolloutlock.live_rollout(loaded, ledger_on_cp1(ended, []), now=now) is None


def ledger_renewed_on_cp1(ledger: Ledger, renewed: bool):
    """cp-1 whose ledger a writer renews between the two reads when `renewed` (a new
    resourceVersion from the API server, whatever the writer's clock put in the heartbeat)."""
    reads = []

    def run(loaded, host, command, *, timeout, stdin=None):
        assert " get configmap " in command, command
        reads.append(command)
        version = str(len(reads)) if renewed else "7"
        meta = {"name": LEDGER, "resourceVersion": version}
        return RemoteResult(host, 0, json.dumps({"metadata": meta, "data": ledger.dump()}))

    return run


@pytest.mark.parametrize("writer_clock", [-3600, +3600], ids=["behind", "ahead"])
def test_the_lock_does_not_trust_the_writers_clock(
    small_cluster, write_cluster, tmp_path, writer_clock
):
    """A writer's clock an hour behind this machine's (its heartbeat looks stale) or ahead (it
    looks fresh for an hour): the ledger is watched, and it holds the cluster exactly when it is
    written meanwhile."""
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    now = time.time()
    beat = now + writer_clock
    ledger = Ledger(run="r9", budget=1, total=2, in_flight={"gpu-1": "p"}, heartbeat=beat)
    for renewed in (True, False):
        slept: list[float] = []
        found = rolloutlock.live_rollout(
            loaded, ledger_renewed_on_cp1(ledger, renewed), now=now, sleep=slept.append
        )
        assert (found is not None) is renewed, renewed
        assert slept == [rolloutlock.WATCH_S]


def test_a_shards_keepalive_renews_the_heartbeat_while_its_step_runs():
    """No gate write for a long step (a join, a reboot): the shard's own keepalive renews the
    heartbeat; a stopped ledger it leaves alone."""
    api = new_api(total=2)
    clock = iter(range(1000, 2000))
    with fleetgate.Keepalive(api, LEDGER, clock=lambda: float(next(clock)), every=0.01) as alive:
        for _ in range(200):
            if alive.renewals >= 2:
                break
            time.sleep(0.01)
    assert alive.renewals >= 2 and api.ledger().heartbeat >= 1001.0
    stopped = new_api(total=2)
    data = stopped.ledger()
    data.stopped = "stopped by --break-lock (me)"
    stopped.objects[LEDGER] = (data.dump(), 5)
    with fleetgate.Keepalive(stopped, LEDGER, every=0.01):
        time.sleep(0.1)
    assert stopped.objects[LEDGER][1] == 5 and stopped.puts == 0


def test_break_lock_marks_the_ledger_stopped(small_cluster, write_cluster, tmp_path):
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    live = Ledger(run="r9", budget=1, total=2, heartbeat=time.time())
    writes: list[bytes] = []
    note = rolloutlock.check_rollout(
        loaded,
        tmp_path / "apply.lock",
        break_lock=True,
        who="me",
        runner=ledger_on_cp1(live, writes),
    )
    assert note and note.startswith("stopped the rollout Job")
    written = Ledger.parse(json.loads(writes[0])["data"])
    assert written.stopped == "stopped by --break-lock (me)"
    assert json.loads(writes[0])["metadata"]["resourceVersion"] == "3"


def test_without_the_job_enabled_a_local_apply_asks_cp1_nothing(loaded):

    def never(*args, **kwargs):
        raise AssertionError("asked cp-1")

    assert rolloutlock.live_rollout(loaded, never) is None


def test_the_engine_names_the_kubernetes_roles_admin_kubeconfig():
    from day2.kubernetes import KUBECTL
    from roles.kubernetes.kubeadm import ADMIN_CONF

    assert incluster.ADMIN_CONF == ADMIN_CONF and incluster.KUBECTL == KUBECTL


def test_swap_gives_up_after_too_many_conflicts():
    api = new_api(conflicts=fleetgate.MAX_CONFLICTS)
    with pytest.raises(fleetgate.LedgerError, match="write conflicts in a row"):
        swap(api, LEDGER, lambda ledger: (None, True))


# -- the join token in a pod ----------------------------------------------------------------------


def test_a_pod_joins_with_the_token_the_controller_minted_and_asks_cp1_nothing(
    tmp_path, monkeypatch
):
    from roles.kubernetes import operations

    secret = tmp_path / "join.json"
    secret.write_text(json.dumps({"token": "abcdef.0123456789abcdef", "ca_cert_hash": "sha256:f"}))
    monkeypatch.setenv(operations.JOIN_SECRETS_ENV, str(secret))

    class NoState:  # a pyinfra state whose cp-1 would be asked: it must not be
        def __getattr__(self, name):
            raise AssertionError(f"asked the run's state for {name}")

    found = operations.join_secrets(NoState(), "cp-1", control_plane=False, token_ttl="1h")
    assert (found.token, found.ca_cert_hash, found.certificate_key) == (
        "abcdef.0123456789abcdef",
        "sha256:f",
        None,
    )
    with pytest.raises(operations.JoinFailed, match="workers only"):
        operations.join_secrets(NoState(), "cp-1", control_plane=True, token_ttl="1h")


def test_an_unreadable_join_secret_is_named_never_shown(tmp_path, monkeypatch):
    from roles.kubernetes import operations

    secret = tmp_path / "join.json"
    secret.write_text('{"token": "abcdef.0123456789abcdef"')  # cut short
    monkeypatch.setenv(operations.JOIN_SECRETS_ENV, str(secret))
    with pytest.raises(operations.JoinFailed) as caught:
        operations.preset_join_secrets()
    assert str(secret) in str(caught.value) and "0123456789abcdef" not in str(caught.value)


def test_outside_a_pod_no_join_secret_is_preset(monkeypatch):
    """Positive control: without the variable a local apply mints its own token as before."""
    from roles.kubernetes import operations

    monkeypatch.delenv(operations.JOIN_SECRETS_ENV, raising=False)
    assert operations.preset_join_secrets() is None


def test_a_shard_told_to_stop_starts_no_step_after_the_one_in_progress():
    """SIGTERM sets the event: the step in progress released its hosts (recorded), and the next
    acquire, or a wait for room, ends the shard with ShardTerminated, never a host failure."""
    terminating = threading.Event()
    api = new_api(budget=1, total=3)
    gate = LedgerGate(api, LEDGER, "pod-a", clock=lambda: 100.0, terminating=terminating)
    assert gate.acquire(["gpu-1", "gpu-2"], want=1) == ["gpu-1"]
    terminating.set()  # while gpu-1's step runs
    gate.release({"gpu-1": "changed"})
    assert api.ledger().done == ["gpu-1"] and not api.ledger().in_flight
    with pytest.raises(fleetgate.ShardTerminated):
        gate.acquire(["gpu-2"], want=1)
    assert "gpu-2" not in api.ledger().in_flight
    # Waiting for room (the budget held by another pod): the wait ends too.
    busy = new_api(budget=1, total=3)
    other = LedgerGate(busy, LEDGER, "pod-b", clock=lambda: 100.0)
    assert other.acquire(["gpu-3"], want=1) == ["gpu-3"]
    stop = threading.Event()
    waiting = LedgerGate(
        busy, LEDGER, "pod-a", clock=lambda: 100.0, sleep=lambda s: stop.set(), terminating=stop
    )
    with pytest.raises(fleetgate.ShardTerminated):
        waiting.acquire(["gpu-1"], want=1)


class RunningRollout(Kubectl):
    """cp-1 where another run's rollout Job is running (created a minute before `NOW`)."""

    def __call__(self, loaded, host, command, *, timeout, stdin=None):
        if " get job " in command and "--ignore-not-found" in command:
            self.commands.append(command)
            job = {
                "kind": "Job",
                "metadata": {
                    "creationTimestamp": "2027-01-15T07:59:00Z",
                    "labels": {"gpuinfra.io/rollout-run": "r-other"},
                },
                "spec": {"activeDeadlineSeconds": 14400},
                "status": {"active": 2},
            }
            return RemoteResult(host, 0, json.dumps(job))
        return super().__call__(loaded, host, command, timeout=timeout, stdin=stdin)


def test_a_second_rollout_neither_takes_over_nor_deletes_the_first_ones_objects(
    small_cluster, write_cluster, tmp_path
):
    """Another run's Job is running: this run makes nothing (no token, no objects), deletes
    nothing, and says which run holds the cluster (exit 8 from the command line)."""
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    KEY.private_key(loaded.state_dir, StateAccess.create)
    kubectl = RunningRollout({})
    # 2027-01-15T08:00:00Z
    rollout = worker_rollout(loaded, kubectl, clock=lambda: 1_800_000_000.0)
    with pytest.raises(jobs.JobBusy, match="rollout run r-other.*still running.*apply --job"):
        rolloutjob.fleet_rollout(rollout)
    made = ("kubeadm token", "apply -f -", " delete ", " patch ")
    assert not any(word in c for c in kubectl.commands for word in made), kubectl.commands


def test_a_run_deletes_only_its_own_objects(small_cluster, write_cluster, tmp_path):
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    KEY.private_key(loaded.state_dir, StateAccess.create)
    kubectl = Kubectl({})
    rollout = worker_rollout(loaded, kubectl)
    rolloutjob.fleet_rollout(rollout)
    (deleted,) = [c for c in kubectl.commands if "delete job,configmap,secret" in c]
    assert f"gpuinfra.io/rollout-run={rollout.run}" in deleted


def test_the_pods_inventory_still_declares_the_operators_key(
    small_cluster, write_cluster, load_small
):
    """The pods log in with the run's key, but the hosts' root still holds the operator's
    (ssh.key): the pod's inventory declares its public half wherever base.authorized_keys is
    set, so the base role in a pod finds no undeclared key (the lab's rollout of every role
    failed on that). The control: without ssh.key nothing is added."""
    from inventory.model import Cluster
    from roles.base.effective import key_blob
    from toolkit.spec import merged_settings
    from toolkit.sshkeys import public_key

    folder = write_cluster(small_cluster).parent
    private = folder / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(private)], check=True)
    site = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGs0ZXl0aGF0aXNub3RyZWFsYnV0aXNzaGFwZWQ site"
    small_cluster["ssh"] = {**small_cluster.get("ssh", {}), "key": str(private)}
    small_cluster["group_vars"] = {"gpu_worker": {"base": {"authorized_keys": [site]}}}
    loaded = load_small()
    pod = Cluster.model_validate(yaml.safe_load(rolloutjob.pod_inventory(loaded)))
    operator = key_blob(public_key(private.read_text()))[1]

    def declared(host: str) -> set[str]:
        keys = merged_settings(pod, host, "base")["authorized_keys"]
        return {key_blob(k)[1] for k in keys}

    for host in ("gpu-1", "cpu-1", "etcd-1"):
        assert operator in declared(host), host
    assert key_blob(site)[1] in declared("gpu-1")
    del small_cluster["ssh"]["key"]
    plain = load(write_cluster(small_cluster, "plain.yml"))
    data = yaml.safe_load(rolloutjob.pod_inventory(plain))
    assert data["group_vars"]["gpu_worker"]["base"]["authorized_keys"] == [site]


def test_a_shard_runs_under_its_keepalive_and_says_why_each_host_failed(monkeypatch, capsys):
    """run_shard as a pod runs it, the engine's run stood in for: the run happens inside the
    shard's own heartbeat (issue 47.7: the lock must hold through a long step even with the
    controller gone), and each failed host's reason goes to the pod's log, which the
    controller's report quotes (issue 47.13: the summary line alone hid why both workers
    failed). The host that changed says nothing (the control)."""
    import engine.context
    from toolkit import pacing

    api = progress_api(Ledger(run="r1", budget=2, total=3), {"pods": [], "hosts": {}})
    alive: list[str] = []

    class Recorded:
        def __init__(self, api_, name):
            assert (api_, name) == (api, LEDGER)

        def __enter__(self):
            alive.append("on")

        def __exit__(self, *exc):
            alive.append("off")

    def run(loaded, options, gate):
        assert alive == ["on"], "the run started outside the shard's keepalive"
        assert options.limit == ("cpu-1", "gpu-1", "gpu-2") and options.mode is Mode.apply
        failed_step = OperationResult("apply", "Kubernetes | Join", False, error="EOF")
        return RunReport(
            cluster="c",
            mode=Mode.apply,
            hosts={
                "cpu-1": HostReport("cpu-1", HostStatus.changed),
                "gpu-1": HostReport("gpu-1", HostStatus.failed, operations=[failed_step]),
                "gpu-2": HostReport("gpu-2", HostStatus.failed, error="ssh: no route to host"),
            },
        )

    class Loaded:
        def with_state_access(self, access):
            return self

    monkeypatch.setattr(fleetgate, "Keepalive", Recorded)
    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(engine.context, "load", lambda path: Loaded())
    settings = {
        "ledger": LEDGER, "shards": [["cpu-1", "gpu-1", "gpu-2"]], "join_rate": "1/20s",
        "count": 1, "roles": ["base", "kubernetes"],
    }  # fmt: skip
    try:
        ends = rolloutshard.run_shard(Path("/nonexistent"), settings, 0, "pod-a", api)
    finally:
        pacing.install_pacer(pacing.JOIN_PACER, None)
    assert alive == ["on", "off"]
    assert ends == {"cpu-1": "changed", "gpu-1": "failed", "gpu-2": "failed"}
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "gpuinfra rollout shard 0: gpu-1: Kubernetes | Join: EOF",
        "gpuinfra rollout shard 0: gpu-2: ssh: no route to host",
    ]


# -- the controller under faults: a hiccup rides out, a failure deletes what the run made ------


class Clock:
    """Epoch seconds that only sleeping moves (the rollout's clock is the ledger's)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Failing(Kubectl):
    """cp-1 whose kubectl fails `times` times (None: always) on commands `word` (a regular
    expression) is found in."""

    def __init__(self, word: str, times: int | None = None):
        super().__init__({})
        self.word, self.times = word, times

    def __call__(self, loaded, host, command, *, timeout, stdin=None):
        if re.search(self.word, command) and (self.times is None or self.times > 0):
            self.commands.append(command)
            if self.times is not None:
                self.times -= 1
            return RemoteResult(host, 1, "", "Unable to connect to the server: EOF")
        return super().__call__(loaded, host, command, timeout=timeout, stdin=stdin)


WAIT = f"get job {LEDGER} -o json$"


def test_the_rollouts_wait_rides_out_a_kubectl_hiccup_and_deletes_nothing_meanwhile(
    small_cluster, write_cluster, tmp_path
):
    """Three failed looks at the Job (an API server restarting, cp-1's ssh dropping): the Job
    is neither deleted nor given up while they last, and the run ends as the Job did (issue
    47.8: one failed `get job` deleted the Job and every shard with it)."""
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    KEY.private_key(loaded.state_dir, StateAccess.create)
    time_ = Clock()
    kubectl = Failing(WAIT, times=3)
    rollout = worker_rollout(loaded, kubectl, clock=time_.clock, sleep=time_.sleep)
    report = rolloutjob.fleet_rollout(rollout)
    assert {h.status for h in report.hosts.values()} == {HostStatus.changed}
    looks = [i for i, c in enumerate(kubectl.commands) if re.search(WAIT, c)]
    assert len(looks) == 4  # three failed, the fourth saw it Complete
    (deleted,) = [i for i, c in enumerate(kubectl.commands) if "delete job,configmap" in c]
    assert deleted > looks[-1]


@pytest.mark.parametrize(
    ("word", "step"),
    [
        (WAIT, "wait"),  # failing past TRANSIENT_S: the controller gives up
        ("patch job ", "publish"),  # the Job made, never started
        (" get configmap ", "collect"),  # the ledger cannot be read back
        ("apply -f -", "publish"),  # the objects half applied
    ],
)
def test_a_rollout_that_fails_midway_deletes_its_objects_and_its_token(
    small_cluster, write_cluster, tmp_path, word, step
):
    """However the controller's flow ends after it published, the run's Job, its Secrets (the
    key, the join token, the state entries) and RBAC are deleted by this run's label, and the
    join token on cp-1 (issue 47.6: a dead controller left the key and a token valid for
    hours). The error names the step."""
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    KEY.private_key(loaded.state_dir, StateAccess.create)
    time_ = Clock()
    kubectl = Failing(word)
    rollout = worker_rollout(loaded, kubectl, clock=time_.clock, sleep=time_.sleep)
    with pytest.raises(jobs.JobError, match=f"^step {step}") as raised:
        rolloutjob.fleet_rollout(rollout)
    assert "Unable to connect to the server: EOF" in str(raised.value)
    deleted = [c for c in kubectl.commands if "delete job,configmap,secret,role,rolebinding" in c]
    assert len(deleted) == 1 and f"gpuinfra.io/rollout-run={rollout.run}" in deleted[0]
    assert kubectl.commands[-1].endswith(
        "kubeadm token delete --kubeconfig /etc/kubernetes/admin.conf abcdef"
    )
    if word == WAIT:
        assert jobs.TRANSIENT_S < time_.now - 1_800_000_000.0 <= jobs.TRANSIENT_S + 2 * 5


def test_a_rollout_refused_before_it_publishes_deletes_nothing(
    small_cluster, write_cluster, tmp_path
):
    """The control of the test above: a failure before anything was made (the token) deletes
    nothing of anyone's, since nothing of this run exists."""
    loaded = load(rollout_cluster(small_cluster, write_cluster, tmp_path))
    KEY.private_key(loaded.state_dir, StateAccess.create)
    kubectl = Failing("kubeadm token create")
    with pytest.raises(jobs.JobError, match="^step token"):
        rolloutjob.fleet_rollout(worker_rollout(loaded, kubectl))
    assert not any(" delete " in c for c in kubectl.commands), kubectl.commands


# -- a real SIGTERM to a shard's process ----------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
TERMINATED_SHARD = """
import json, os, signal, sys, time
from pathlib import Path
from cli import connecting
connecting()  # gevent, as the pod's `gpuinfra apply --job-shard` has it
import engine.context, engine.runner
from engine import fleetgate, rolloutshard

class Api:  # the ledger's ConfigMaps, in memory
    def __init__(self, objects):
        self.objects = {name: (data, 1) for name, data in objects.items()}
    def get(self, name):
        data, version = self.objects[name]
        return dict(data), str(version)
    def put(self, name, data, version):
        if str(self.objects[name][1]) != version:
            return False
        self.objects[name] = (dict(data), self.objects[name][1] + 1)
        return True

class Loaded:
    def with_state_access(self, access):
        return self

def run(loaded, options, gate):  # the engine's steps, each host's work stood in for
    assert gate.acquire(["gpu-1"], want=1) == ["gpu-1"]
    os.kill(os.getpid(), signal.SIGTERM)  # the pod deleted mid-step (a dpkg, a join)
    time.sleep(1.0)
    print("the step on gpu-1 ended", file=sys.stderr)
    gate.release({"gpu-1": "changed"})
    gate.acquire(["gpu-2"], want=1)
    raise AssertionError("a step started after SIGTERM")

folder = Path(sys.argv[1])
ledger = fleetgate.Ledger(run="r1", budget=1, total=2)
api = Api({"L": ledger.dump(), "L-0": {fleetgate.PROGRESS_KEY: ""}})
engine.context.load = lambda path: Loaded()
engine.runner.run = run
if sys.argv[2] == "handled":
    rolloutshard.exit_on_sigterm()
code = rolloutshard.main(
    folder / "cluster.yml", api=api, environ={"JOB_COMPLETION_INDEX": "0", "POD_NAME": "pod-a"},
    mounted_state=folder / "state.json", staged=folder / "run",
)
found = fleetgate.Ledger.parse(api.objects["L"][0])
print(json.dumps({"done": found.done, "in_flight": found.in_flight,
                  "progress": api.objects["L-0"][0][fleetgate.PROGRESS_KEY]}))
sys.exit(code)
"""


@pytest.mark.parametrize("handler", ["handled", "default"])
def test_a_shard_sent_sigterm_ends_its_step_then_exits_143(tmp_path, handler):
    """A real SIGTERM to a shard's process, as a plain pod delete sends it, under gevent as in
    the pod (issue 47.8: shards exited at once, leaving hosts mid-dpkg or mid-join). With the
    pod's handler (`exit_on_sigterm`), the step in progress ends, its host is released as
    done, no other step starts, and the shard exits 143 (the Job retries the index, whose next
    pod resumes from the progress). The control: without it the signal kills the process
    mid-step, the step never ends and its host stays in flight."""
    settings = {
        "format": rolloutjob.SETTINGS_FORMAT, "run": "r1", "ledger": "L", "count": 1,
        "shards": [["gpu-1", "gpu-2"]], "join_rate": "1/20s", "roles": ["base"],
    }  # fmt: skip
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    (tmp_path / "cluster.yml").write_text("name: x\n")
    (tmp_path / "state.json").write_text("{}")
    ended = subprocess.run(
        [sys.executable, "-c", TERMINATED_SHARD, str(tmp_path), handler],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    if handler == "default":
        assert ended.returncode == -15 and "ended" not in ended.stderr, ended.stderr
        return
    assert ended.returncode == incluster.TERMINATED == 143, ended.stderr
    assert "the step on gpu-1 ended" in ended.stderr
    assert "told to stop" in ended.stderr
    found = json.loads(ended.stdout.splitlines()[-1])
    assert found["done"] == ["gpu-1"] and found["in_flight"] == {}
    assert json.loads(found["progress"])["hosts"] == {"gpu-1": "changed"}
