"""API Priority and Fairness, before and after (issue 44): a fleet operation against the
control plane with and without the flow schema that fleet_policy gives gpuinfra's accounts.

The operation is the GPU-health sampler's call, the list of every node, made by many clients at
once as the sampler's account (a burst of periodic checks on a fleet). With the schema
(templates/fleet_policy/flow-control.yaml.j2) those requests queue in their own Limited level,
a small share of each API server's seats; without it they fall to Kubernetes' `service-accounts`
schema and share workload-low, the largest level, with every other account's pods. Meanwhile a
probe, another account's small request (a workload's own pod calling the API), is timed, and
the API servers say how long kubelets' Lease renewals and each level's queue took.

The flood talks HTTPS to the API through the balancer with the lab's admin.conf credentials and
impersonates the accounts (Impersonate-User; a service account's groups follow), as the pods
would call it, without running thousands of pods. The flow schema is deleted for the "without"
phase and created again from the object read before, also on failure. Nothing here is a timed
assertion: it returns figures for benchmarks/control_plane_report.py.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from benchmarks.control_plane import apiserver_metrics, histogram_p99, parse, percentile
from lab import fleet
from lab.errors import LabError
from roles.fleet_policy.files import FLEET_PRIORITY_LEVEL
from roles.gpu_health.config import cluster_config
from roles.gpu_health.role import SAMPLER_ACCOUNT

CLIENTS = 48  # the flood's connections at once: past workload-low's seats on three servers
SECONDS = 90.0  # each phase's flood
PROBE_EVERY_S = 0.5
RECOVERY_S = 30.0  # after the fleet is Ready again, before the next phase
FLOOD_PATH = "/api/v1/nodes"  # the sampler's list (roles/gpu_health: list nodes)
# A workload's pod calling the API: the default account, one object asked. Kubernetes refuses
# it (403, no role), after flow control has queued it like any other request of its level.
PROBE_ACCOUNT = "system:serviceaccount:default:default"
PROBE_PATH = "/api/v1/namespaces/default/pods?limit=1"
FAMILIES = (
    "apiserver_request_duration_seconds_bucket",
    "apiserver_flowcontrol_request_wait_duration_seconds_bucket",
    "apiserver_flowcontrol_rejected_requests_total",
)
LEVELS = ("workload-low", FLEET_PRIORITY_LEVEL, "exempt", "system", "node-high")


def sampler_user(loaded) -> str:
    namespace = cluster_config(loaded).namespace
    return f"system:serviceaccount:{namespace}:{SAMPLER_ACCOUNT}"


class Api:
    """HTTPS connections to the API server the kubeconfig names, as its user (the lab's
    admin.conf: a client certificate), impersonating whom a request says."""

    def __init__(self, kubeconfig: Path, folder: Path):
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        url = urlsplit(cluster["server"])
        self.host, self.port = url.hostname, url.port or 443
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        self.context = ssl.create_default_context(cadata=ca)
        cert, key = folder / "client.crt", folder / "client.key"
        for path, field in ((cert, "client-certificate-data"), (key, "client-key-data")):
            # 0600 from creation: the key is the cluster's admin credential.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(base64.b64decode(user[field]))
        self.context.load_cert_chain(cert, key)

    def connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=60)


def timed_get(
    api: Api, as_user: str, path: str, until: float, pause: float, out: list[tuple[int, float]]
) -> None:
    """GET `path` as `as_user` until `until`, a connection kept open, appending (status,
    seconds) per request; a request that fails on the wire counts as status 0."""
    conn = api.connection()
    headers = {"Impersonate-User": as_user, "Accept": "application/json"}
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            response.read()
            out.append((response.status, time.monotonic() - started))
        except (OSError, http.client.HTTPException):
            out.append((0, time.monotonic() - started))
            conn.close()
            conn = api.connection()
        if pause:
            time.sleep(pause)
    conn.close()


def _client_figures(samples: list[tuple[int, float]]) -> dict[str, Any]:
    seconds = sorted(s for _, s in samples)
    statuses: dict[str, int] = {}
    for status, _ in samples:
        statuses[str(status)] = statuses.get(str(status), 0) + 1

    def q(p: float) -> float | None:
        found = percentile(seconds, p)
        return None if found is None else round(found, 3)

    return {
        "requests": len(samples),
        "statuses": dict(sorted(statuses.items())),
        "p50_s": q(0.5),
        "p99_s": q(0.99),
        "mean_s": round(statistics.mean(seconds), 3) if seconds else None,
    }


def server_reading(loaded) -> dict[str, Any]:
    cluster = loaded.cluster
    return {
        host: parse(apiserver_metrics(loaded, str(cluster.hosts[host].address)), FAMILIES)
        for host in cluster.in_group("control_plane")
    }


def server_figures(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The worst API server's p99 of Lease renewals (PUT leases) and of each level's queue wait
    over the phase, and the requests each level refused (429)."""
    leases: list[float] = []
    waits: dict[str, float] = {}
    rejected: dict[str, float] = {}
    for host, samples in after.items():
        grouped = histogram_p99(
            before[host], samples, "apiserver_request_duration_seconds", ("verb", "resource")
        )
        p99 = grouped.get(("PUT", "leases"), (None, 0))[0]
        if p99 is not None:
            leases.append(p99)
        queued = histogram_p99(
            before[host],
            samples,
            "apiserver_flowcontrol_request_wait_duration_seconds",
            ("priority_level",),
        )
        for (level,), (wait, _) in queued.items():
            if wait is not None:
                waits[level] = max(waits.get(level, 0.0), wait)
        for (metric, labels), value in samples.items():
            if metric == "apiserver_flowcontrol_rejected_requests_total":
                level = dict(labels).get("priority_level", "")
                grown = value - before[host].get((metric, labels), 0.0)
                rejected[level] = rejected.get(level, 0.0) + grown
    return {
        "lease_put_p99_s": max(leases) if leases else None,
        "queue_wait_p99_s": {level: waits[level] for level in LEVELS if level in waits},
        "rejected": {level: int(n) for level, n in sorted(rejected.items()) if n},
    }


def not_ready(loaded) -> int:
    return sum(not fleet.node_ready(node) for node in fleet.simulated_nodes(loaded).values())


def phase(
    loaded, api: Api, label: str, clients: int, seconds: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """One flood of `seconds` by `clients` connections as the sampler, with the probe beside."""
    before = server_reading(loaded)
    until = time.monotonic() + seconds
    flood: list[tuple[int, float]] = []
    probe: list[tuple[int, float]] = []
    threads = [
        threading.Thread(
            target=timed_get, args=(api, sampler_user(loaded), FLOOD_PATH, until, 0.0, flood)
        )
        for _ in range(clients)
    ]
    threads.append(
        threading.Thread(
            target=timed_get, args=(api, PROBE_ACCOUNT, PROBE_PATH, until, PROBE_EVERY_S, probe)
        )
    )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    figures = {
        "flow_schema": label,
        "clients": clients,
        "seconds": seconds,
        "flood": _client_figures(flood),
        "probe": _client_figures(probe),
        "nodes_not_ready_after": not_ready(loaded),
        **server_figures(before, server_reading(loaded)),
    }
    log(
        f"  flow control {label}: flood {figures['flood']['requests']} lists "
        f"{figures['flood']['statuses']}, probe p99 {figures['probe']['p99_s']} s, lease PUT "
        f"p99 {figures['lease_put_p99_s']}, {figures['nodes_not_ready_after']} nodes not Ready"
    )
    return figures


def _recreatable(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    kept = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": kept,
            "spec": obj["spec"]}  # fmt: skip


def recover(lab: str, size: int, log: Callable[[str], None]) -> str | None:
    """Wait for the fleet to be Ready again after a flood; the error when it is not."""
    try:
        fleet.scale(lab, size)
    except LabError as error:
        log(f"  flow control: the fleet did not recover: {error}")
        return str(error)
    time.sleep(RECOVERY_S)
    return None


def comparison(
    lab: str,
    size: int,
    log: Callable[[str], None],
    clients: int = CLIENTS,
    seconds: float = SECONDS,
) -> dict[str, Any]:
    """The same flood with the flow schema (as applied) and without it, the fleet Ready before
    each; the schema is put back at the end, also on failure."""
    loaded = fleet.lab_cluster(lab)
    schema = json.loads(
        fleet.kubectl(loaded, "get", "flowschema", FLEET_PRIORITY_LEVEL, "-o", "json")
    )
    results: dict[str, Any] = {"size": size, "sampler": sampler_user(loaded), "phases": []}
    with tempfile.TemporaryDirectory(prefix="gpuinfra-apf-") as folder:
        api = Api(fleet.kubeconfig(loaded), Path(folder))
        results["recovery"] = [recover(lab, size, log)]
        results["phases"].append(phase(loaded, api, "gpuinfra", clients, seconds, log))
        results["recovery"].append(recover(lab, size, log))
        fleet.kubectl(loaded, "delete", "flowschema", FLEET_PRIORITY_LEVEL)
        try:
            results["phases"].append(phase(loaded, api, "none", clients, seconds, log))
        finally:
            fleet.kubectl(loaded, "create", "-f", "-", stdin=json.dumps(_recreatable(schema)))
        results["recovery"].append(recover(lab, size, log))
    return results
