"""The flow-control comparison (benchmarks/flow_control.py): its figures from the API servers'
metrics and its clients' timings, the order of its phases and the flow schema put back, on a
local HTTP server and a fake lab. No lab."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import stat
import threading
import time

import pytest

from benchmarks import __main__ as bench_main
from benchmarks import control_plane, flow_control, report, suites
from lab import fleet
from lab.errors import LabError
from roles.fleet_policy.files import FLEET_PRIORITY_LEVEL
from tests.helpers import self_signed


def _histogram(name: str, labels: str, counts: dict[str, int]) -> str:
    return "\n".join(
        f'{name}_bucket{{{labels},le="{bound}"}} {count}' for bound, count in counts.items()
    )


def _metrics(lease: dict[str, int], low: dict[str, int], ours: dict[str, int], refused: int):
    text = "\n".join(
        [
            _histogram(
                "apiserver_request_duration_seconds",
                'component="apiserver",resource="leases",scope="resource",verb="PUT"',
                lease,
            ),
            _histogram(
                "apiserver_flowcontrol_request_wait_duration_seconds",
                'execute="true",flow_schema="service-accounts",priority_level="workload-low"',
                low,
            ),
            _histogram(
                "apiserver_flowcontrol_request_wait_duration_seconds",
                f'execute="true",flow_schema="x",priority_level="{FLEET_PRIORITY_LEVEL}"',
                ours,
            ),
            f'apiserver_flowcontrol_rejected_requests_total{{flow_schema="x",'
            f'priority_level="{FLEET_PRIORITY_LEVEL}",reason="queue-full"}} {refused}',
        ]
    )
    return control_plane.parse(text, flow_control.FAMILIES)


def test_the_servers_say_the_worst_lease_renewal_queue_wait_and_refusals():
    zero = {"0.1": 0, "1": 0, "+Inf": 0}
    before = {"cp-1": _metrics(zero, zero, zero, 5), "cp-2": _metrics(zero, zero, zero, 0)}
    after = {
        # cp-1: every renewal under 0.1 s; cp-2: all between 0.1 and 1 s, the worst.
        "cp-1": _metrics({"0.1": 100, "1": 100, "+Inf": 100}, zero, zero, 5),
        "cp-2": _metrics(
            {"0.1": 0, "1": 100, "+Inf": 100},
            {"0.1": 10, "1": 10, "+Inf": 10},
            {"0.1": 0, "1": 50, "+Inf": 50},
            7,
        ),
    }
    figures = flow_control.server_figures(before, after)
    assert figures["lease_put_p99_s"] == pytest.approx(0.991)
    assert figures["queue_wait_p99_s"]["workload-low"] == pytest.approx(0.099)
    assert figures["queue_wait_p99_s"][FLEET_PRIORITY_LEVEL] == pytest.approx(0.991)
    # Refusals grown over the phase only: cp-1's 5 were there before.
    assert figures["rejected"] == {FLEET_PRIORITY_LEVEL: 7}
    # Control: no growth, no figures.
    quiet = flow_control.server_figures(before, before)
    assert quiet == {"lease_put_p99_s": None, "queue_wait_p99_s": {}, "rejected": {}}


def test_the_clients_figures_count_each_status_and_the_quantiles():
    samples = [(200, i / 100) for i in range(1, 101)] + [(429, 0.001), (0, 5.0)]
    figures = flow_control._client_figures(samples)
    assert figures["requests"] == 102
    assert figures["statuses"] == {"0": 1, "200": 100, "429": 1}
    # Nearest rank, as the suite's other percentiles: the 51st and the 101st of 102.
    assert figures["p50_s"] == 0.5 and figures["p99_s"] == 1.0
    assert flow_control._client_figures([])["p99_s"] is None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # one connection kept open, as the flood keeps it
    seen: list[tuple[str, str]] = []

    def do_GET(self):
        user = self.headers.get("Impersonate-User", "")
        self.seen.append((user, self.path))
        status = 200 if user.endswith(":gpu-health-sampler") else 403
        body = b"{}"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _LocalApi:
    def __init__(self, port: int):
        self.port = port

    def connection(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)


@pytest.fixture
def server():
    _Handler.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()


def test_each_request_goes_as_the_impersonated_account_and_is_timed(server):
    out: list[tuple[int, float]] = []
    sampler = "system:serviceaccount:gpu-health:gpu-health-sampler"
    until = time.monotonic() + 0.3
    flow_control.timed_get(_LocalApi(server), sampler, "/api/v1/nodes", until, 0.05, out)
    assert out and {status for status, _ in out} == {200}
    assert set(_Handler.seen) == {(sampler, "/api/v1/nodes")}
    # Control: the probe's account is refused, and that is what is recorded.
    probe: list[tuple[int, float]] = []
    until = time.monotonic() + 0.2
    path = flow_control.PROBE_PATH
    flow_control.timed_get(_LocalApi(server), flow_control.PROBE_ACCOUNT, path, until, 0.05, probe)
    assert probe and {status for status, _ in probe} == {403}


def test_a_request_that_fails_on_the_wire_counts_as_status_zero():
    out: list[tuple[int, float]] = []
    closed = _LocalApi(1)  # nothing listens on port 1
    flow_control.timed_get(closed, "u", "/", time.monotonic() + 0.1, 0.05, out)
    assert out and {status for status, _ in out} == {0}


def test_the_admin_key_is_written_0600_and_the_server_is_the_kubeconfigs(tmp_path):
    import base64

    cert, key = self_signed("kubernetes-admin")
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    kubeconfig = tmp_path / "admin.conf"
    config = {
        "clusters": [{"cluster": {"server": "https://198.18.0.10:6443",
                                  "certificate-authority-data": b64(cert)}}],
        "users": [{"user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
    }  # fmt: skip
    kubeconfig.write_text(json.dumps(config))
    folder = tmp_path / "creds"
    folder.mkdir()
    api = flow_control.Api(kubeconfig, folder)
    assert (api.host, api.port) == ("198.18.0.10", 6443)
    assert stat.S_IMODE((folder / "client.key").stat().st_mode) == 0o600
    assert (folder / "client.key").read_bytes() == key
    # The API server's certificate is checked against the cluster's CA (never unverified).
    assert api.context.verify_mode.name == "CERT_REQUIRED" and api.context.check_hostname


class _FakeLab:
    def __init__(self, monkeypatch, fail_without: bool = False):
        self.calls: list[tuple] = []
        schema = {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": FLEET_PRIORITY_LEVEL, "uid": "u", "resourceVersion": "9"},
            "spec": {"matchingPrecedence": 1500},
            "status": {"conditions": []},
        }

        def kubectl(loaded, *args, stdin=None):
            self.calls.append(("kubectl", *args[:2], *([json.loads(stdin)] if stdin else [])))
            return json.dumps(schema) if args[0] == "get" else ""

        def phase(loaded, api, label, clients, seconds, log):
            self.calls.append(("phase", label))
            if fail_without and label == "none":
                raise LabError("flood failed")
            return {"flow_schema": label}

        monkeypatch.setattr(fleet, "lab_cluster", lambda lab: "loaded")
        monkeypatch.setattr(fleet, "kubectl", kubectl)
        monkeypatch.setattr(fleet, "kubeconfig", lambda loaded: "admin.conf")
        monkeypatch.setattr(flow_control, "Api", lambda path, folder: "api")
        monkeypatch.setattr(flow_control, "phase", phase)
        monkeypatch.setattr(flow_control, "sampler_user", lambda loaded: "sampler")
        monkeypatch.setattr(
            flow_control, "recover", lambda lab, size, log: self.calls.append(("recover",))
        )


def test_the_flood_runs_with_the_schema_then_without_and_the_schema_comes_back(monkeypatch):
    lab = _FakeLab(monkeypatch)
    results = flow_control.comparison("bench", 1000, lambda _: None)
    assert [p["flow_schema"] for p in results["phases"]] == ["gpuinfra", "none"]
    names = [c[:3] if c[0] == "kubectl" else c for c in lab.calls]
    assert names == [
        ("kubectl", "get", "flowschema"), ("recover",), ("phase", "gpuinfra"), ("recover",),
        ("kubectl", "delete", "flowschema"), ("phase", "none"), ("kubectl", "create", "-f"),
        ("recover",),
    ]  # fmt: skip
    # Created again as it was read, less what the API server owns.
    recreated = lab.calls[6][3]
    assert recreated["metadata"] == {"name": FLEET_PRIORITY_LEVEL}
    assert recreated["spec"] == {"matchingPrecedence": 1500} and "status" not in recreated


def test_the_schema_comes_back_when_the_phase_without_it_fails(monkeypatch):
    lab = _FakeLab(monkeypatch, fail_without=True)
    with pytest.raises(LabError, match="flood failed"):
        flow_control.comparison("bench", 1000, lambda _: None)
    assert lab.calls[-1][:3] == ("kubectl", "create", "-f")


def test_the_suite_ends_with_the_comparison_only_when_asked(monkeypatch, tmp_path):
    from tests.unit.test_benchmark_control_plane import FakeLab

    FakeLab(monkeypatch, tmp_path)
    asked: list[tuple[str, int]] = []

    def comparison(lab, size, log):
        asked.append((lab, size))
        return {"size": size}

    results = control_plane.suite((0, 500), 0.0, tmp_path / "w1", lambda _: None)
    assert "flow_control" not in results and asked == []
    results = control_plane.suite(
        (0, 500), 0.0, tmp_path / "w2", lambda _: None, flow_control=comparison
    )
    # On the suite's own lab, at the largest size held.
    assert results["flow_control"] == {"size": 500} and asked == [(suites.LAB, 500)]


def test_make_bench_passes_the_comparison_only_with_cp_apf(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(
        control_plane, "suite", lambda *args, **kw: seen.append(kw["flow_control"]) or {}
    )
    monkeypatch.setattr(bench_main, "_machine", lambda: {})
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setattr(report, "write", lambda results, out: None)
    argv = ["--suites", "controlplane", "--out", str(tmp_path), "--work", str(tmp_path)]
    assert bench_main.main(argv) == 0 and bench_main.main([*argv, "--cp-apf"]) == 0
    assert seen == [None, flow_control.comparison]
