"""What the controller does the same way for both in-cluster Jobs (`drift --job` in
day2/fleetjob.py, `apply --job` in day2/rolloutjob.py): the flow run with the Job's objects
deleted on every exit path, kubectl on the first control-plane node, the key's Secret, the Job
published over an earlier run's and waited for until it ends or outlives its deadline."""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from day2.steps import Flow, run_flow
from engine.incluster import kubectl_command, remote_kubectl
from engine.reports import RunOptions, RunReport
from inventory.model import LoadedCluster, StateAccess
from toolkit.jobs import JobKey
from toolkit.remote import RemoteResult, RemoteRunner, run_remote
from toolkit.ssh import ssh_settings

# Past a Job's activeDeadlineSeconds and this, the controller stops waiting, and a Job of an
# earlier run that has not ended is taken as abandoned (its controller died).
DEADLINE_MARGIN_S = 60
# kubectl failing this long in a row while the controller waits ends the wait; shorter, it is
# a hiccup (an API server restarting, cp-1's ssh dropping) and the Job runs on meanwhile.
TRANSIENT_S = 120
ENDED = {"Complete", "Failed"}


class JobError(RuntimeError):
    """A step of a Job's flow failed (exit 1); the message names the step (and the shard)."""


class JobRefused(ValueError):
    """A Job cannot run with this input (exit 2): a bad option or setting, a missing key, a
    shard too big."""


class JobBusy(RuntimeError):
    """Another run's Job of the same kind and cluster is running (exit 8, as a held lock)."""


def ended(status: dict) -> bool:
    """A Job's status says it is Complete or Failed."""
    return bool(
        {c.get("type") for c in status.get("conditions", []) if c.get("status") == "True"} & ENDED
    )


def index_set(text: str) -> set[int]:
    """The indexes an Indexed Job's status lists, as "0,2-4" (completedIndexes, failedIndexes)."""
    found: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            found.update(range(int(first), int(last or first) + 1))
    return found


@dataclass
class InClusterJob:
    """The controller's side of a Job, what the command was asked and what each step found,
    which each flow's own dataclass extends. The Job and its objects are in the flow's
    `namespace`."""

    # "drift", "rollout": the Job is gpuinfra-KIND-CLUSTER, its objects are labelled
    # app.kubernetes.io/name=gpuinfra-KIND, and gpuinfra.io/KIND-run names the run.
    kind: ClassVar[str]
    command: ClassVar[str]  # what the operator ran: "drift --job", "apply --job"

    loaded: LoadedCluster
    options: RunOptions
    _: KW_ONLY
    count: int | None = None  # --shards; None: the inventory's setting
    runner: RemoteRunner = run_remote
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    run: str = field(default_factory=lambda: secrets.token_hex(6))
    started: float = field(default_factory=time.monotonic)
    control_plane: str = ""  # where kubectl runs
    hosts: list[str] = field(default_factory=list)  # the run's hosts, in inventory order
    shard_of: list[list[str]] = field(default_factory=list)  # each shard's hosts
    published: bool = False
    status: dict = field(default_factory=dict)  # the Job's status when it ended
    report: RunReport | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def app(self) -> str:
        return f"gpuinfra-{self.kind}"

    @property
    def run_label(self) -> str:
        return f"gpuinfra.io/{self.kind}-run"

    @property
    def name(self) -> str:
        return f"{self.app}-{self.loaded.cluster.name}"

    @property
    def namespace(self) -> str:
        raise NotImplementedError

    @property
    def job_loaded(self) -> LoadedCluster:
        """The inventory of the cluster the Job runs on (kubectl on its first control plane)."""
        return self.loaded

    def kubectl(self, action: str, command: str, *, stdin: bytes | None = None) -> str:
        """kubectl on the first control-plane node; JobError naming `action` if it fails."""
        call = remote_kubectl(self.job_loaded, self.control_plane, self.namespace, self.runner)
        code, out, err = call(command, stdin)
        if code != 0:
            said = (err.strip() or out.strip() or "failed")[-300:]
            raise JobError(f"{action}: kubectl on {self.control_plane} failed: {said}")
        return out

    def kubectl_result(self, command: str) -> RemoteResult:
        """kubectl on the first control-plane node, its result as it came (the caller names
        the failure)."""
        full = kubectl_command(self.namespace, command)
        return self.runner(self.job_loaded, self.control_plane, full, timeout=120)

    def labels(self) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": self.app,
            "app.kubernetes.io/instance": self.loaded.cluster.name,
            self.run_label: self.run,
        }

    def refuse_a_running_job(self, now: float) -> None:
        """The Job's objects are named after the cluster: a second run (another operator,
        another controller) would replace the first's objects and delete its Job. A Job of this
        cluster that has not ended and is within its deadline (by the API server's creation
        stamp and `now`, epoch seconds) is someone's run: JobBusy. One that ended, or outlived
        its deadline (its controller died), is removed as before."""
        found = self.kubectl(
            "look for a running Job", f"get job {self.name} --ignore-not-found -o json"
        )
        if not found.strip():
            return
        job = json.loads(found)
        if job.get("kind") != "Job":  # an empty List, as some kubectl print for none
            return
        if ended(job.get("status", {})):
            return
        meta = job.get("metadata", {})
        created = meta.get("creationTimestamp", "")
        deadline = job.get("spec", {}).get("activeDeadlineSeconds") or 0
        try:
            age = now - datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
        except ValueError:
            age = 0.0  # no readable creation time: taken as running, the safe side
        if deadline and age > deadline + DEADLINE_MARGIN_S:
            return
        other = meta.get("labels", {}).get(self.run_label, "?")
        raise JobBusy(
            f"Job {self.namespace}/{self.name} ({self.kind} run {other}, created {created}) is "
            f"still running: another {self.command} of this cluster; wait for it, or if its "
            f"controller is gone: kubectl -n {self.namespace} delete job {self.name}"
        )

    def apply_job(self, manifest: str) -> None:
        """The Job's objects applied (on stdin: they hold the key) over an earlier run's Job."""
        self.published = True  # from here on, the end deletes what this run may have made
        earlier = f"delete job {self.name} --ignore-not-found --wait=true"
        self.kubectl("remove an earlier run", earlier)
        self.kubectl("apply the Job", "apply -f -", stdin=manifest.encode())

    def wait_for_job(
        self, deadline_seconds: int, poll_s: float, meanwhile: Callable[[], None] = lambda: None
    ) -> None:
        """Until the Job is Complete or Failed, or past its deadline and a margin; `meanwhile`
        between two looks."""
        until = self.clock() + deadline_seconds + DEADLINE_MARGIN_S
        failing_since: float | None = None
        while True:
            try:
                text = self.kubectl("wait for the Job", f"get job {self.name} -o json")
                try:
                    status = json.loads(text).get("status", {})
                except ValueError:
                    raise JobError(f"wait: kubectl get job {self.name} printed no JSON") from None
                if ended(status) or self.clock() > until:
                    self.status = status
                    return
                meanwhile()
                failing_since = None
            except JobError:
                # An API server restarting, cp-1's ssh dropping: the Job runs on without the
                # controller; only a failure lasting TRANSIENT_S ends the wait (and the run).
                failing_since = self.clock() if failing_since is None else failing_since
                if self.clock() - failing_since > TRANSIENT_S:
                    raise
            self.sleep(poll_s)

    def completed(self, index: int) -> bool:
        """The Job counts `index` as succeeded (its status' completedIndexes, as "0,2-4")."""
        return index in index_set(self.status.get("completedIndexes", ""))

    def index_end(self, index: int) -> str:
        """How an index of the Job ended, when that explains a shard's silence."""
        if index in index_set(self.status.get("failedIndexes", "")):
            return "; index failed after its retries"
        if not {c.get("type") for c in self.status.get("conditions", [])} & ENDED:
            return "; the Job did not end before its deadline"
        return ""

    def delete_objects(self, kinds: str) -> list[str]:
        """The run's objects of `kinds` (by the Job's labels and this run's: another run's
        objects of the same names are never this run's to delete); what went wrong, as notes."""
        instance = self.loaded.cluster.name
        selector = (
            f"app.kubernetes.io/name={self.app},app.kubernetes.io/instance={instance},"
            f"{self.run_label}={self.run}"
        )
        try:
            self.kubectl("delete the Job", f"delete {kinds} -l {selector} --ignore-not-found")
        except JobError as exc:
            return [
                f"{exc}; delete them by hand: kubectl -n {self.namespace} delete ... -l {selector}"
            ]
        return []

    def add_notes(self, notes: list[str]) -> None:
        """Notes of the end: on the report when there is one, else with the run's own."""
        (self.report.notes if self.report is not None else self.notes).extend(notes)


def run_job_flow(flow: Flow, job: InClusterJob, delete: Callable[[Any], None]) -> RunReport:
    """The flow's steps in order, and the Job's objects deleted whatever happened."""
    try:
        run_flow(flow, job, error=JobError)
    finally:
        if job.published:
            delete(job)
    assert job.report is not None
    return job.report


def refuse_unless_enabled(
    loaded: LoadedCluster, enabled: bool, command: str, role: str, since: str
) -> None:
    """JobRefused unless the inventory enables the Job (its `role`'s setting), saying what an
    apply since then put on the hosts for it."""
    if not enabled:
        raise JobRefused(
            f"{loaded.source}: {command} needs group_vars.all.{role}.enabled: true (and {since})"
        )


def first_control_plane(loaded: LoadedCluster, command: str) -> str:
    """Where kubectl runs: the inventory's first control-plane node."""
    control_planes = loaded.cluster.in_group("control_plane")
    if not control_planes:
        raise JobRefused(f"{loaded.source}: {command} needs a control_plane host")
    return control_planes[0]


def known_hosts_text(loaded: LoadedCluster) -> str:
    """The inventory's known_hosts file, for the pods to check the hosts' keys too."""
    path = Path(ssh_settings(loaded).known_hosts)
    try:
        return path.read_text()
    except OSError as exc:
        raise JobRefused(f"ssh.known_hosts: cannot read {path}: {exc.strerror}") from None


def key_base64(key: JobKey, loaded: LoadedCluster) -> str:
    """The Job's key as its Secret holds it (made by an apply: never made here)."""
    private = key.private_key(loaded.state_dir, StateAccess.existing)
    return base64.b64encode((private.strip() + "\n").encode()).decode()
