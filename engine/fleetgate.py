"""Which of a step's hosts may start now: the runner asks its gate before each step and tells it
after (docs/design/fleet-jobs.md section 5).

`LocalGate` is a local apply's: every host of the step, at once (the step plan already holds
the topology's rules and --batch). `LedgerGate` is a rollout shard's: the shards of one
`apply --job` share one budget of hosts in flight, kept in the ConfigMap
`gpuinfra-rollout-<cluster>` (`Ledger`), read and written back with compare-and-swap on its
`metadata.resourceVersion` (a 409 Conflict: read again, decide again). It grants
`min(want, budget - in flight)` while the failed share stays within `fail_percent`; past it, it
marks the ledger stopped and every shard reports its untried hosts skipped. Each write renews
the ledger's heartbeat, which is the in-cluster apply lock (engine/clusterstate.py).

A retried shard pod finds its predecessor's progress in `gpuinfra-rollout-<cluster>-<i>`
(`ShardProgress`): it skips the hosts done, and adopts the hosts left in flight by
compare-and-swap (they stay counted against the budget) to apply them first.

Standard library only: the API is a parameter (`LedgerApi`), kubectl in the pod or on cp-1.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol, TypeVar

LEDGER_KEY = "ledger.json"
PROGRESS_KEY = "progress.json"
# Kept in the ledger for the lab's check that joins never overlap; bounded so that a 7,500-host
# rollout's ledger stays far under Kubernetes' 1 MiB object limit (about 60 B an event).
HISTORY_KEEP = 2000
# A heartbeat younger than this is a live rollout: a local apply exits 8 (LockHeld).
HEARTBEAT_LIVE_S = 120
# A waiting shard writes the heartbeat again when it is this old (every write renews it), and
# every shard renews it this often while its hosts are applied (`Keepalive`).
HEARTBEAT_RENEW_S = 30
# How far ahead of the reader's clock a writer's may be before its heartbeat is not believed.
CLOCK_SKEW_S = 5
POLL_S = 2.0
# Conflicts in a row before a shard gives up: dozens of shards rarely collide more than a few
# times on one write; a hundred means something rewrites the ledger in a loop.
MAX_CONFLICTS = 100

IN_FLIGHT = "in_flight"
# A host's end as the runner reports it (engine/reports.py HostStatus): these count as failed.
FAILED_ENDS = ("failed", "unreachable")

T = TypeVar("T")


class Gate(Protocol):
    stopped: str | None

    def acquire(self, pending: Sequence[str], want: int) -> list[str]: ...

    def release(self, results: Mapping[str, str]) -> None: ...


class LocalGate:
    """Today's local apply: the whole step, now."""

    stopped: str | None = None

    def acquire(self, pending: Sequence[str], want: int) -> list[str]:
        return list(pending)[:want]

    def release(self, results: Mapping[str, str]) -> None:
        return None


class LedgerError(RuntimeError):
    """The ledger cannot be read or written (not a conflict): the shard exits 1, and retries."""


class LedgerApi(Protocol):
    def get(self, name: str) -> tuple[dict[str, str], str]:
        """The ConfigMap's data and its resourceVersion."""
        ...

    def put(self, name: str, data: dict[str, str], version: str) -> bool:
        """Replace the data if the object is still at `version`; False on 409 Conflict."""
        ...


@dataclass
class Ledger:
    """The rollout's shared state (the ConfigMap's `ledger.json`)."""

    run: str
    budget: int  # hosts in flight at once, all shards together
    total: int  # the rollout's hosts
    fail_percent: float | None = None  # None: never stop for failures
    in_flight: dict[str, str] = field(default_factory=dict)  # host -> pod
    failed: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    stopped: str = ""
    heartbeat: float = 0.0  # epoch seconds of the last write
    history: list[list] = field(default_factory=list)  # [epoch, pod, "start"|"end", host]

    @classmethod
    def parse(cls, data: Mapping[str, str]) -> Ledger:
        try:
            return cls(**json.loads(data[LEDGER_KEY]))
        except (KeyError, ValueError, TypeError) as exc:
            raise LedgerError(f"the ledger's {LEDGER_KEY} is unreadable: {exc}") from None

    def dump(self) -> dict[str, str]:
        self.history = self.history[-HISTORY_KEEP:]
        return {LEDGER_KEY: json.dumps(asdict(self), separators=(",", ":"))}

    def over_failures(self) -> bool:
        if self.fail_percent is None or not self.total:
            return False
        return len(self.failed) * 100 / self.total > self.fail_percent

    def active(self) -> bool:
        """Neither stopped nor finished: its writers may still be at work."""
        finished = len(self.done) + len(self.failed) >= self.total and not self.in_flight
        return not self.stopped and not finished

    def live(self, now: float) -> bool:
        """A rollout that still runs: active, and written lately by the reader's clock (a
        writer's clock ahead of it beyond CLOCK_SKEW_S is not believed: `fresh`)."""
        return self.active() and self.fresh(now)

    def fresh(self, now: float) -> bool:
        return -CLOCK_SKEW_S <= now - self.heartbeat < HEARTBEAT_LIVE_S


class Keepalive:
    """A shard's own heartbeat: renewed every HEARTBEAT_RENEW_S while the shard runs (a thread,
    a greenlet under gevent), so the lock holds through a step longer than HEARTBEAT_LIVE_S
    (a join, a reboot) even when the controller that also renews it is gone. A failed write is
    left to the next one: the gate's own writes stop the shard when the ledger is unreachable."""

    def __init__(
        self,
        api: LedgerApi,
        name: str,
        clock: Callable[[], float] = time.time,
        every: float = HEARTBEAT_RENEW_S,
    ):
        self.api, self.name, self.clock, self.every = api, name, clock, every
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-keepalive", daemon=True)

    def __enter__(self) -> Keepalive:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                swap(self.api, self.name, lambda ledger: renew(ledger, self.clock()))
            except LedgerError:
                continue
            self.renewals += 1


def renew(ledger: Ledger, now: float) -> tuple[None, bool]:
    """`swap`'s change that renews the heartbeat of a ledger still active (one stopped or
    finished is left as it is)."""
    if not ledger.active():
        return None, False
    ledger.heartbeat = now
    return None, True


def swap(api: LedgerApi, name: str, change: Callable[[Ledger], tuple[T, bool]]) -> T:
    """Read the ledger, let `change` edit it (returning its result and whether to write), write
    it back at the version read; on a conflict read and decide again."""
    for _ in range(MAX_CONFLICTS):
        data, version = api.get(name)
        ledger = Ledger.parse(data)
        result, write = change(ledger)
        if not write or api.put(name, ledger.dump(), version):
            return result
    raise LedgerError(f"{name}: {MAX_CONFLICTS} write conflicts in a row")


class ShardTerminated(BaseException):
    """The pod was told to stop (SIGTERM: the Job deleted, the pod evicted): raised at the
    next step boundary, after the step in progress released its hosts. A BaseException, so no
    `except Exception` on the way turns it into a host's failure."""


class LedgerGate:
    """A rollout shard's gate on the shared ledger (see the module's docstring)."""

    def __init__(
        self,
        api: LedgerApi,
        name: str,
        pod: str,
        *,
        progress: ShardProgress | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        poll: float = POLL_S,
        terminating: threading.Event | None = None,
    ):
        self.api = api
        self.terminating = terminating or threading.Event()
        self.name = name
        self.pod = pod
        self.progress = progress
        self.clock = clock
        self.sleep = sleep
        self.poll = poll
        self.stopped: str | None = None
        self.held: list[str] = []  # adopted from a predecessor: counted already, go first

    def acquire(self, pending: Sequence[str], want: int) -> list[str]:
        """Hosts of `pending` granted now (at least one), or [] once the rollout stopped; waits
        while the budget is spent. ShardTerminated once the pod was told to stop: no step
        starts after that, and the hosts between steps are adopted by the index's next pod."""
        self._check_terminating()
        first = [h for h in self.held if h in pending][:want]
        if first:
            self.held = [h for h in self.held if h not in first]
            return first
        while True:
            granted = swap(self.api, self.name, lambda ledger: self._grant(ledger, pending, want))
            if self.stopped is not None:
                return []
            if granted:
                if self.progress is not None:
                    self.progress.mark(dict.fromkeys(granted, IN_FLIGHT))
                return granted
            self.sleep(self.poll)
            self._check_terminating()

    def _check_terminating(self) -> None:
        if self.terminating.is_set():
            raise ShardTerminated("told to stop: the step in progress ended, no other starts")

    def _grant(self, ledger: Ledger, pending: Sequence[str], want: int):
        now = self.clock()
        if not ledger.stopped and ledger.over_failures():
            ledger.stopped = (
                f"stopped by {self.pod}: {len(ledger.failed)} of {ledger.total} hosts failed, "
                f"over fail_percent {ledger.fail_percent:g}"
            )
            ledger.heartbeat = now
            self.stopped = ledger.stopped
            return [], True
        if ledger.stopped:
            self.stopped = ledger.stopped
            return [], False
        room = min(want, ledger.budget - len(ledger.in_flight))
        hosts = [h for h in pending if h not in ledger.in_flight][: max(room, 0)]
        if not hosts:  # waiting: renew the heartbeat now and then, not on every poll
            renew = now - ledger.heartbeat >= HEARTBEAT_RENEW_S
            if renew:
                ledger.heartbeat = now
            return [], renew
        for host in hosts:
            ledger.in_flight[host] = self.pod
            ledger.history.append([round(now, 3), self.pod, "start", host])
        ledger.heartbeat = now
        return hosts, True

    def release(self, results: Mapping[str, str]) -> None:
        """The step's hosts ended (host -> its status: ok, changed, failed ...): out of flight,
        failures counted."""

        def change(ledger: Ledger):
            now = self.clock()
            for host, status in results.items():
                ledger.in_flight.pop(host, None)
                # A host a retried pod did again (its predecessor released it, then died
                # before its progress said so) is counted once, by its last result.
                ledger.done = [h for h in ledger.done if h != host]
                ledger.failed = [h for h in ledger.failed if h != host]
                (ledger.failed if status in FAILED_ENDS else ledger.done).append(host)
                ledger.history.append([round(now, 3), self.pod, "end", host])
            ledger.heartbeat = now
            return None, True

        swap(self.api, self.name, change)
        if self.progress is not None:
            self.progress.mark(dict(results))

    def adopt(self, hosts: Sequence[str]) -> list[str]:
        """Take over the hosts a predecessor pod of this shard left in flight (the ledger keeps
        them counted, now under this pod's name); they are the first `acquire` hands out. A
        host the ledger no longer holds in flight was released: it is not adopted."""

        def change(ledger: Ledger):
            taken = [h for h in hosts if h in ledger.in_flight]
            for host in taken:
                ledger.history.append([round(self.clock(), 3), self.pod, "adopt", host])
                ledger.in_flight[host] = self.pod
            ledger.heartbeat = self.clock()
            return taken, bool(taken)

        adopted = swap(self.api, self.name, change)
        self.held = [h for h in hosts if h in adopted]
        return adopted


@dataclass
class ShardProgress:
    """One shard's hosts and where each stands (`gpuinfra-rollout-<cluster>-<i>`), written by
    the shard's pod only (a Job with podReplacementPolicy Failed never runs two at once)."""

    api: LedgerApi
    name: str
    pod: str
    hosts: dict[str, str] = field(default_factory=dict)  # host -> IN_FLIGHT or its end
    pods: list[str] = field(default_factory=list)  # every pod that ran this shard, in order

    def load(self) -> None:
        data, _ = self.api.get(self.name)
        text = data.get(PROGRESS_KEY, "")
        try:
            found = json.loads(text) if text else {}
        except ValueError as exc:
            raise LedgerError(f"{self.name}: {PROGRESS_KEY} is unreadable: {exc}") from None
        self.hosts = dict(found.get("hosts", {}))
        self.pods = list(found.get("pods", []))
        if self.pod not in self.pods:
            self.pods.append(self.pod)

    def mark(self, statuses: Mapping[str, str]) -> None:
        self.hosts.update(statuses)
        text = json.dumps({"pods": self.pods, "hosts": self.hosts}, separators=(",", ":"))
        for _ in range(MAX_CONFLICTS):
            _, version = self.api.get(self.name)
            if self.api.put(self.name, {PROGRESS_KEY: text}, version):
                return
        raise LedgerError(f"{self.name}: {MAX_CONFLICTS} write conflicts in a row")


def resume(progress: ShardProgress, gate: LedgerGate, hosts: Sequence[str]) -> list[str]:
    """What a shard's pod still has to do, in order: the hosts a predecessor left in flight and
    this pod adopted first, then those never tried. Hosts that ended are skipped (a failed host
    stays counted, and reported failed).

    Every host of the shard that has not ended is offered for adoption, not only those the
    progress marks in flight: a predecessor killed between its grant (the ledger) and its mark
    (the progress) left a host in flight that only the ledger knows, which no grant would ever
    hand out again (and whose place in the budget nobody would give back)."""
    progress.load()
    left = [h for h in hosts if progress.hosts.get(h, IN_FLIGHT) == IN_FLIGHT]
    adopted = gate.adopt(left) if left else []
    return [*adopted, *(h for h in left if h not in adopted)]


class KubectlApi:
    """ConfigMaps through kubectl: `call(command, stdin)` runs one kubectl command line and
    returns (exit status, stdout, stderr). In a pod that is kubectl with the pod's token; on
    the controller, kubectl on cp-1 with admin.conf (toolkit.remote.run_remote)."""

    def __init__(self, namespace: str, call: Callable[[str, bytes | None], tuple[int, str, str]]):
        self.namespace = namespace
        self.call = call
        self._labels: dict[str, dict] = {}

    def get(self, name: str) -> tuple[dict[str, str], str]:
        code, out, err = self.call(f"get configmap {shlex.quote(name)} -o json", None)
        if code != 0:
            raise LedgerError(f"kubectl get configmap {name}: {(err or out).strip()[-300:]}")
        try:
            found = json.loads(out)
        except ValueError:
            raise LedgerError(f"kubectl get configmap {name} printed no JSON") from None
        meta = found.get("metadata", {})
        self._labels[name] = meta.get("labels", {})
        return dict(found.get("data") or {}), str(meta.get("resourceVersion", ""))

    def put(self, name: str, data: dict[str, str], version: str) -> bool:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": self._labels.get(name, {}),
                "resourceVersion": version,
            },
            "data": data,
        }
        code, out, err = self.call("replace -f -", json.dumps(body).encode())
        if code == 0:
            return True
        said = (err or out).strip()
        if "Conflict" in said or "the object has been modified" in said:
            return False
        raise LedgerError(f"kubectl replace configmap {name}: {said[-300:]}")


def pod_kubectl(namespace: str) -> Callable[[str, bytes | None], tuple[int, str, str]]:
    """kubectl in a rollout pod (in-cluster config: the pod's service account token)."""

    def call(command: str, stdin: bytes | None) -> tuple[int, str, str]:
        argv = ["kubectl", "-n", namespace, *shlex.split(command)]
        done = subprocess.run(argv, input=stdin or b"", capture_output=True, timeout=60)
        return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode()

    return call


class InClusterApi:
    """ConfigMaps through the API server with the pod's service account token (no kubectl in
    the image needed): GET, then PUT with the resourceVersion read; 409 is a conflict."""

    ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"

    def __init__(self, namespace: str, server: str | None = None, account: str | None = None):
        import os

        self.namespace = namespace
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        self.server = server or f"https://{host}:{port}"
        self.account = account or self.ACCOUNT
        self._objects: dict[str, dict] = {}

    def _request(self, method: str, name: str, body: bytes | None = None):
        import ssl
        import urllib.request
        from pathlib import Path

        token = Path(self.account, "token").read_text().strip()  # re-read: it is rotated
        context = ssl.create_default_context(cafile=f"{self.account}/ca.crt")
        request = urllib.request.Request(
            f"{self.server}/api/v1/namespaces/{self.namespace}/configmaps/{name}",
            data=body,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        return urllib.request.urlopen(request, context=context, timeout=30)

    def get(self, name: str) -> tuple[dict[str, str], str]:
        import urllib.error

        try:
            with self._request("GET", name) as answer:
                found = json.loads(answer.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise LedgerError(f"GET configmap {name}: {exc}") from None
        self._objects[name] = found
        return dict(found.get("data") or {}), str(found["metadata"]["resourceVersion"])

    def put(self, name: str, data: dict[str, str], version: str) -> bool:
        import urllib.error

        body = dict(self._objects.get(name) or {"apiVersion": "v1", "kind": "ConfigMap"})
        meta = dict(body.get("metadata") or {"name": name, "namespace": self.namespace})
        meta["resourceVersion"] = version
        body["metadata"], body["data"] = meta, data
        try:
            with self._request("PUT", name, json.dumps(body).encode()):
                return True
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                return False
            raise LedgerError(f"PUT configmap {name}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise LedgerError(f"PUT configmap {name}: {exc}") from None
