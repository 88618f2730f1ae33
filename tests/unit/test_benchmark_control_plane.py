"""The control-plane suite (benchmarks/control_plane.py) and its figures
(benchmarks/control_plane_report.py), on the steps of a measured run (0, 500 and 1,000 simulated
nodes on a loaded machine: data/control-plane-steps.json) and on a fake fleet. No lab."""

from __future__ import annotations

import copy
import json
import os
import signal
import statistics
from pathlib import Path

import pytest
import yaml

from benchmarks import __main__ as bench_main
from benchmarks import control_plane, report, suites
from benchmarks import control_plane_report as cp_report
from lab import fleet
from lab.errors import LabError
from roles.fleet_policy.config import BalloonPool, FleetPolicyConfig

REPO = Path(__file__).resolve().parents[2]
SAMPLE = Path(__file__).parent / "data" / "control-plane-steps.json"
APISERVERS = ("cp-1/kube-apiserver", "cp-2/kube-apiserver", "cp-3/kube-apiserver")
CONTROL_PLANE = (
    *APISERVERS,
    *(f"cp-{i}/kube-scheduler" for i in (1, 2, 3)),
    *(f"cp-{i}/kube-controller-manager" for i in (1, 2, 3)),
    *(f"etcd-{i}/etcd" for i in range(1, 6)),
)


@pytest.fixture
def measured() -> dict:
    return {
        "machine": {"date": "2026-11-28 03:00 UTC", "cpus": 2, "memory_gib": 23.5},
        "lab": "itest-k8s",
        "sizes": [0, 500, 1000],
        "settle_s": 120.0,
        **json.loads(SAMPLE.read_text()),
    }


def _step(size: int, requests: dict[str, dict[str, float | None]]) -> dict:
    return {
        "size": size,
        "requests": {name: {"count": 1, "p99": p99} for name, p99 in requests.items()},
        "etcd": {},
        "processes": {},
    }


def _by_size(analysis: dict) -> dict[int, dict]:
    return {row["size"]: row["verdicts"] for row in analysis["rows"]}


# ---------------------------------------------------------------- the SLO verdicts


def test_each_step_is_judged_by_its_worst_call_and_api_server(measured):
    verdicts = _by_size(cp_report.analyse(measured))
    assert verdicts[0]["single_object"]["worst"] == {
        "call": "DELETE pods", "apiserver": "cp-1", "p99_s": pytest.approx(0.1911, abs=1e-4),
        "count": 358,
    }  # fmt: skip
    assert verdicts[0]["single_object"]["held"] is True
    assert verdicts[0]["cluster_list"]["worst"]["call"] == "LIST nodes"
    assert verdicts[500]["single_object"]["worst"]["call"] == "POST pods"
    assert verdicts[500]["single_object"]["worst"]["p99_s"] == pytest.approx(11.5517, abs=1e-4)
    assert verdicts[500]["single_object"]["held"] is False
    # LIST pods cluster at 1,000 nodes: 3.7 s on cp-1, within its 30 s.
    assert verdicts[1000]["cluster_list"]["worst"]["call"] == "LIST pods"
    assert verdicts[1000]["cluster_list"]["worst"]["apiserver"] == "cp-1"
    assert verdicts[1000]["cluster_list"]["held"] is True
    assert verdicts[1000]["single_object"]["held"] is False


def test_only_single_object_calls_and_cluster_lists_are_judged():
    step = _step(100, {
        "WATCH nodes resource": {"cp-1": 50.0},  # long-running: outside the SLO
        "GET  ": {"cp-1": 9.0},  # a non-resource URL (/healthz) has no scope
        "LIST pods namespace": {"cp-1": 40.0},  # neither single-object nor cluster-scope
        "GET nodes resource": {"cp-1": 0.3, "cp-2": 1.0, "cp-3": None},
        "WATCH pods cluster": {"cp-2": 60.0},
        "LIST nodes cluster": {"cp-2": 30.5},
    })  # fmt: skip
    single = cp_report.verdict(step, "single_object")
    assert single["worst"]["p99_s"] == 1.0 and single["worst"]["apiserver"] == "cp-2"
    assert single["held"] is True  # at most 1 s
    listing = cp_report.verdict(step, "cluster_list")
    assert listing["worst"]["call"] == "LIST nodes" and listing["held"] is False


def test_a_step_without_a_kind_of_call_neither_holds_nor_breaks_its_slo():
    step = _step(0, {"GET nodes resource": {"cp-1": 0.1}})
    assert cp_report.verdict(step, "cluster_list") == {"worst": None, "slo_s": 30.0, "held": None}
    analysis = cp_report.analyse({"steps": [step]})
    assert analysis["held_up_to"] == 0 and analysis["first_break"] is None


# ---------------------------------------------------------------- the limit


def test_the_sample_held_only_without_simulated_nodes(measured):
    analysis = cp_report.analyse(measured)
    assert analysis["held_up_to"] == 0
    assert analysis["first_break"] == {"size": 500, "slos": ["single_object"]}
    assert analysis["stopped"] is None
    assert analysis["limit"] == (
        "both SLOs held only with no simulated node; the limit: at 500 simulated nodes the "
        "single-object p99 was 11.55 s (POST pods on cp-1), over its 1 s SLO"
    )


def test_a_size_that_holds_again_after_a_break_does_not_count(measured):
    again = copy.deepcopy(measured)
    for entry in again["steps"][2]["requests"].values():
        entry["p99"] = {host: 0.5 for host in entry["p99"]}
    assert _by_size(cp_report.analyse(again))[1000]["single_object"]["held"] is True
    assert cp_report.analyse(again)["held_up_to"] == 0


def test_when_every_size_holds_no_limit_is_named(measured):
    fast = copy.deepcopy(measured)
    for step in fast["steps"]:
        for entry in step["requests"].values():
            entry["p99"] = {host: 0.2 for host in entry["p99"]}
    analysis = cp_report.analyse(fast)
    assert analysis["held_up_to"] == 1000
    assert analysis["limit"] == (
        "both SLOs held up to 1,000 simulated nodes, the largest size measured: no limit was "
        "reached"
    )


def test_a_fleet_that_did_not_get_ready_is_named_as_the_limit(measured):
    stopped = {**copy.deepcopy(measured), "stopped": {"size": 2500, "error": "1800 of 2500"}}
    for step in stopped["steps"]:
        for entry in step["requests"].values():
            entry["p99"] = {host: 0.2 for host in entry["p99"]}
    assert cp_report.analyse(stopped)["limit"] == (
        "both SLOs held up to 1,000 simulated nodes; the limit: the fleet did not get Ready at "
        "2,500 simulated nodes (1800 of 2500)"
    )
    measured["stopped"] = stopped["stopped"]
    assert cp_report.analyse(measured)["limit"].endswith(
        "over its 1 s SLO; then the fleet did not get Ready at 2,500 simulated nodes (1800 of 2500)"
    )


# ---------------------------------------------------------------- cost per node, projection


def _raw(measured: dict, size: int) -> dict:
    return next(s for s in measured["steps"] if s["size"] == size)


def test_the_cost_per_node_from_the_first_step(measured):
    costs = {c["to"]: c for c in cp_report.analyse(measured)["per_node"]}
    assert sorted(costs) == [500, 1000]
    base, top = _raw(measured, 0), _raw(measured, 1000)
    # etcd-4 leads in every step: its database, not the members' mean.
    leader = top["etcd"]["etcd-4"]["db_bytes"] - base["etcd"]["etcd-4"]["db_bytes"]
    assert costs[1000]["etcd_db_bytes"] == pytest.approx(leader / 1000)
    assert costs[1000]["etcd_db_bytes"] == pytest.approx(34586.624)
    rss = sum(top["processes"][k]["rss_bytes"] - base["processes"][k]["rss_bytes"]
              for k in APISERVERS)  # fmt: skip
    assert costs[1000]["apiserver_rss_bytes"] == pytest.approx(rss / 1000)
    # kwok plays the kubelets: its CPU is not the control plane's.
    cores = sum(top["processes"][k]["cpu_cores"] - base["processes"][k]["cpu_cores"]
                for k in CONTROL_PLANE)  # fmt: skip
    assert costs[1000]["cpu_seconds_per_minute"] == pytest.approx(cores * 60 / 1000)
    assert costs[500]["cpu_seconds_per_minute"] == pytest.approx(0.09702, abs=1e-5)
    assert costs[500]["etcd_db_bytes"] == pytest.approx(31227.904)


def test_without_a_leader_the_members_mean_database_counts(measured):
    step = _raw(measured, 500)
    for member in step["etcd"].values():
        member["leader"] = False
    expected = statistics.mean(m["db_bytes"] for m in step["etcd"].values())
    assert cp_report.etcd_db_bytes(step) == pytest.approx(expected)
    assert expected != step["etcd"]["etcd-4"]["db_bytes"]


def test_the_projection_extends_the_largest_steps_cost_to_7500_nodes(measured):
    p = cp_report.analyse(measured)["projection"]
    base, top = _raw(measured, 0), _raw(measured, 1000)
    assert (p["fleet"], p["api_servers"], p["measured_api_servers"]) == (7500, 5, 3)
    assert (p["from"], p["per_node_to"]) == (0, 1000)
    assert p["etcd_db_bytes"] == pytest.approx(43573248 + 34586.624 * 7500)
    idle = statistics.mean(base["processes"][k]["rss_bytes"] for k in APISERVERS)
    grown = sum(top["processes"][k]["rss_bytes"] - base["processes"][k]["rss_bytes"]
                for k in APISERVERS)  # fmt: skip
    each = idle + grown / 1000 / 3 * 7500
    assert p["apiserver_rss_bytes_each"] == pytest.approx(each)
    assert p["apiserver_rss_bytes_total"] == pytest.approx(5 * each)
    api_cpu = [base["processes"][k]["cpu_cores"] for k in APISERVERS]
    api_grown = sum(top["processes"][k]["cpu_cores"] for k in APISERVERS) - sum(api_cpu)
    assert p["apiserver_cpu_cores_each"] == pytest.approx(
        statistics.mean(api_cpu) + api_grown / 1000 * 7500 / 5
    )
    others = sum(base["processes"][k]["cpu_cores"] for k in CONTROL_PLANE) - sum(api_cpu)
    all_grown = sum(top["processes"][k]["cpu_cores"] - base["processes"][k]["cpu_cores"]
                    for k in CONTROL_PLANE)  # fmt: skip
    assert p["cpu_cores"] == pytest.approx(
        others + 5 * statistics.mean(api_cpu) + all_grown / 1000 * 7500
    )


def test_the_projected_database_is_set_against_the_members_quota(measured):
    for member in _raw(measured, 0)["etcd"].values():
        member["quota_bytes"] = 8 * 2**30
    assert cp_report.analyse(measured)["projection"]["etcd_quota_bytes"] == 8 * 2**30
    text = "\n".join(cp_report.markdown(measured))
    assert "| etcd database (leader) | 289 MiB, 4% of the members' 8 GiB quota |" in text


def test_a_step_reads_each_members_database_and_quota():
    metrics = (
        "etcd_mvcc_db_total_size_in_bytes 4.5e+07\n"
        "etcd_server_quota_backend_bytes 8.589934592e+09\n"
        "etcd_server_is_leader 1\n"
    )
    families = ("etcd_mvcc_db", "etcd_server")
    before = {"time": 0.0, "api": {}, "etcd": {"etcd-1": {}}, "processes": {}}
    after = {**before, "time": 60.0, "etcd": {"etcd-1": control_plane.parse(metrics, families)}}
    member = control_plane.step_figures(before, after)["etcd"]["etcd-1"]
    assert (member["db_bytes"], member["quota_bytes"], member["leader"]) == (45e6, 8 * 2**30, True)


def test_a_step_reads_the_responses_by_code_and_the_events_members_apart():
    api_families = ("apiserver_request_total",)
    api = lambda ok, refused: control_plane.parse(  # noqa: E731
        f'apiserver_request_total{{code="200",verb="GET"}} {ok}\n'
        f'apiserver_request_total{{code="200",verb="PUT"}} {ok}\n'
        f'apiserver_request_total{{code="429",verb="LIST"}} {refused}\n',
        api_families,
    )
    etcd = lambda db: control_plane.parse(  # noqa: E731
        f"etcd_mvcc_db_total_size_in_bytes {db}\netcd_server_is_leader 1\n",
        control_plane.ETCD_FAMILIES,
    )
    before = {
        "time": 0.0, "api": {"cp-1": api(10, 0), "cp-2": api(5, 2)},
        "etcd": {"etcd-1": etcd(4e7)}, "etcd_events": {"etcd-1": etcd(1e6)}, "processes": {},
    }  # fmt: skip
    after = {
        "time": 60.0, "api": {"cp-1": api(25, 3), "cp-2": api(5, 2)},
        "etcd": {"etcd-1": etcd(5e7)}, "etcd_events": {"etcd-1": etcd(2e6)}, "processes": {},
    }  # fmt: skip
    step = control_plane.step_figures(before, after)
    # Grown over the step only: cp-2's two 429s were there before; no zero counts kept.
    assert step["responses"] == {"200": 30, "429": 3}
    assert step["etcd"]["etcd-1"]["db_bytes"] == 5e7
    assert step["etcd_events"]["etcd-1"]["db_bytes"] == 2e6
    assert cp_report.events_cluster(step) == {"etcd": step["etcd_events"]}
    # Control: a lab without an Events cluster records none.
    step = control_plane.step_figures({**before, "etcd_events": {}}, {**after, "etcd_events": {}})
    assert "etcd_events" not in step and cp_report.events_cluster(step) is None


def test_one_step_gives_no_cost_per_node_and_no_projection(measured):
    measured["steps"] = measured["steps"][:1]
    analysis = cp_report.analyse(measured)
    assert analysis["per_node"] == [] and analysis["projection"] is None
    text = "\n".join(cp_report.markdown(measured))
    assert "| 0 | 0.19 (DELETE pods, cp-1) | yes |" in text
    assert "Projection" not in text


# ---------------------------------------------------------------- the report


def test_the_section_holds_the_verdicts_costs_and_the_projections_assumptions(measured):
    text = "\n".join(cp_report.markdown(measured))
    assert "**Limit**: both SLOs held only with no simulated node; the limit: at 500" in text
    assert "| 500 | 11.55 (POST pods, cp-1) | **no** | 2.00 (LIST services, cp-1) | yes | 56 |" in (
        text
    )
    assert "| 1,000 | 34,587 | 504.2 | 39.3 | 0.0477 |" in text
    assert "A linear extrapolation from the measured sizes, not a measurement" in text
    assert "| etcd database (leader) | 289 MiB |" in text  # the sample predates the quota
    assert "| the 5 API servers' RSS | 8.4 GiB |" in text


def test_the_section_gives_the_schedulers_batches_when_they_ran(measured):
    """No scheduling in the results (a run before it, or an empty fleet): no table. With the
    two batches: a row each, a batch that never ran whole shown with n/a, not a time."""
    assert "The scheduler at that size" not in "\n".join(cp_report.markdown(measured))
    batch = {"pods": 500, "running": 500, "pods_per_s": 41.7, "scheduled_p50_s": 6.0,
             "scheduled_p99_s": 11.0, "ready_p50_s": 7.0, "ready_p99_s": 12.0,
             "all_running_s": 14.2}  # fmt: skip
    measured["scheduling"] = {
        "team": "research",
        "nodes": 501,
        "balloon_nodes": 1,
        "batches": [
            {**batch, "gang": False},
            {**batch, "gang": True, "running": 0, "pods_per_s": None, "all_running_s": None},
        ],
    }
    text = "\n".join(cp_report.markdown(measured))
    assert "for each of the research team's 501 simulated nodes less the 1 its GPU" in text
    assert "| no gang | 500 | 500 | 41.7 | 6 / 11 | 7 / 12 | 14.2 |" in text
    assert "| one gang | 500 | 0 | n/a | 6 / 11 | 7 / 12 | n/a |" in text


def test_a_step_reads_each_daemonsets_desired_and_ready_pods(monkeypatch):
    listed = {"items": [
        {"metadata": {"namespace": "kube-system", "name": "kube-proxy"},
         "status": {"desiredNumberScheduled": 502, "numberReady": 500}},
        {"metadata": {"namespace": "gpuinfra-system", "name": "gpu-health"}, "status": {}},
    ]}  # fmt: skip
    monkeypatch.setattr(fleet, "kubectl", lambda loaded, *args: json.dumps(listed))
    assert control_plane.daemonsets("loaded") == {
        "kube-system/kube-proxy": {"desired": 502, "ready": 500},
        "gpuinfra-system/gpu-health": {"desired": 0, "ready": 0},
    }


def test_the_section_gives_each_daemonsets_pods_per_size(measured):
    """Steps recorded before the DaemonSets were read have none: no table. Once read, a
    column per DaemonSet, n/a where a step lacks it."""
    assert "DaemonSet pods Ready" not in "\n".join(cp_report.markdown(measured))
    measured["steps"][1]["daemonsets"] = {"kube-system/kube-proxy": {"desired": 502, "ready": 502}}
    measured["steps"][2]["daemonsets"] = {
        "kube-system/kube-proxy": {"desired": 1002, "ready": 1001},
        "gpuinfra-system/gpu-health": {"desired": 1001, "ready": 1001},
    }
    text = "\n".join(cp_report.markdown(measured))
    assert "| simulated nodes | `gpuinfra-system/gpu-health` | `kube-system/kube-proxy` |" in text
    assert "| 0 | n/a | n/a |" in text
    assert "| 500 | n/a | 502 / 502 |" in text
    assert "| 1,000 | 1,001 / 1,001 | 1,001 / 1,002 |" in text


def test_the_plots_points(measured):
    points = cp_report.series(measured)
    assert [size for size, _ in points["latency"]["single_object"]] == [0, 500, 1000]
    assert points["latency"]["cluster_list"][2] == (1000, pytest.approx(3.745))
    assert points["etcd_db_mib"][0] == (0, pytest.approx(43573248 / 2**20))
    assert sorted(points["apiserver_rss_mib"]) == ["cp-1", "cp-2", "cp-3"]
    assert points["apiserver_rss_mib"]["cp-2"][1] == (500, pytest.approx(574631936 / 2**20))


def test_the_plots_are_drawn(measured, tmp_path):
    pytest.importorskip("matplotlib", reason="plots need `.[bench]` (make bench installs it)")
    written = cp_report.plots(measured, tmp_path)
    assert [p.name for p in written] == [cp_report.LATENCY_PLOT, cp_report.MEMORY_PLOT]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_control_plane_document_carries_one_pair_of_markers():
    text = (REPO / "docs" / "benchmarks" / cp_report.DOC).read_text()
    assert text.count(cp_report.BEGIN) == 1 and text.count(cp_report.END) == 1
    assert text.index(cp_report.BEGIN) < text.index(cp_report.END)
    assert "## Results" in text.split(cp_report.BEGIN)[0]


def test_report_only_rewrites_the_section_between_the_markers(measured, tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(cp_report, "plots", lambda cp, out: drawn.append(out) or [])
    document = (REPO / "docs" / "benchmarks" / cp_report.DOC).read_text()
    (tmp_path / cp_report.DOC).write_text(document)
    (tmp_path / "results.json").write_text(json.dumps({"controlplane": measured}))
    assert bench_main.main(["--report-only", "--out", str(tmp_path)]) == 0
    written = (tmp_path / cp_report.DOC).read_text()
    head, rest = document.split(cp_report.BEGIN)
    tail = rest.split(cp_report.END)[1]
    assert written.startswith(head + cp_report.BEGIN + "\nWritten by `make bench")
    assert written.endswith(cp_report.END + tail)
    assert "| 1,000 | 5.60 (POST pods, cp-1) | **no** | 3.75 (LIST pods, cp-1) | yes |" in written
    assert drawn == [tmp_path]
    results_md = (tmp_path / "results.md").read_text()
    assert "[control-plane.md](control-plane.md)" in results_md
    assert (
        "| API call latency SLOs (1 s single-object, 30 s cluster LIST) to 7,500 simulated "
        "nodes | held up to 0 of 1,000 measured | not met |"
    ) in results_md
    # A second run finds its own markers and writes the same document.
    assert bench_main.main(["--report-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / cp_report.DOC).read_text() == written


def test_a_document_without_markers_gets_a_results_section(measured, tmp_path):
    path = tmp_path / cp_report.DOC
    path.write_text("# Elsewhere\n")
    cp_report.write_doc(measured, path)
    text = path.read_text()
    assert text.startswith("# Elsewhere\n\n## Results\n\n" + cp_report.BEGIN + "\n")
    assert text.endswith(cp_report.END + "\n")


# ---------------------------------------------------------------- the suite


class FakeLab:
    """The lab's parts the suite calls, recorded; the fleet cannot get Ready at `fails_at`."""

    def __init__(self, monkeypatch, tmp_path: Path, fails_at: int | None = None):
        self.calls: list[tuple] = []
        self.fails_at = fails_at
        self.clock = 0.0
        inventory = tmp_path / "cluster.yml"

        def boot(lab, path=None, events_apart=True, sized_for=None):
            call: tuple = ("boot", lab)
            if not events_apart:
                call += ("events in main",)
            if sized_for is not None:
                call += (f"sized for {sized_for}",)
            self.calls.append(call)
            return inventory

        monkeypatch.setattr(control_plane, "boot", boot)
        monkeypatch.setattr(suites, "apply", lambda inv, rep, log: self.calls.append(("apply",)))
        monkeypatch.setattr(suites, "lab_down", lambda log: self.calls.append(("down",)))
        monkeypatch.setattr(fleet, "lab_cluster", lambda lab: "loaded")
        monkeypatch.setattr(fleet, "scale", self.scale)
        monkeypatch.setattr(control_plane, "reading", self.reading)
        monkeypatch.setattr(control_plane, "scheduling", self.scheduling)
        monkeypatch.setattr(control_plane, "daemonsets", lambda loaded: {})
        monkeypatch.setattr(control_plane, "metric_budget", self.metric_budget)

    def metric_budget(self, lab: str, loaded) -> dict:
        self.calls.append(("metric budget", loaded))
        return {"host": "mon-1", "jobs": {}}

    def scheduling(self, loaded, log) -> dict:
        self.calls.append(("scheduling", loaded))
        return {"team": "research", "nodes": 250, "batches": []}

    def scale(self, lab: str, count: int) -> fleet.FleetResult:
        self.calls.append(("scale", count))
        if count == self.fails_at:
            raise LabError(f"12 of {count} simulated nodes Ready with a Lease after 600 s")
        return fleet.FleetResult(lab, count, count, 0, 1.0, 2.0, 42)

    def reading(self, lab: str, loaded) -> dict:
        self.clock += 10.0
        rss = {"cp-1/kube-apiserver": (500 * 2**20, int(self.clock * 100))}
        return {"time": self.clock, "api": {}, "etcd": {}, "processes": rss}


def test_a_fleet_that_cannot_get_ready_ends_the_growth(monkeypatch, tmp_path):
    lab = FakeLab(monkeypatch, tmp_path, fails_at=2500)
    results = control_plane.suite((0, 500, 2500, 7500), 0.0, tmp_path / "work", lambda _: None)
    assert [s["size"] for s in results["steps"]] == [0, 500]
    assert results["stopped"] == {
        "size": 2500, "error": "12 of 2500 simulated nodes Ready with a Lease after 600 s"
    }  # fmt: skip
    # The scheduler is measured at the largest size held, its fleet made that size again.
    assert [c for c in lab.calls if c[0] in ("scale", "scheduling")] == [
        ("scale", 0), ("scale", 500), ("scale", 2500), ("scale", 500), ("scheduling", "loaded")
    ]  # fmt: skip
    assert lab.calls[0] == ("down",) and lab.calls[-1] == ("down",)
    saved = json.loads((tmp_path / "work" / "steps.json").read_text())
    assert saved["stopped"]["size"] == 2500 and len(saved["steps"]) == 2
    assert cp_report.analyse(results)["limit"].endswith(
        "the fleet did not get Ready at 2,500 simulated nodes (12 of 2500 simulated nodes "
        "Ready with a Lease after 600 s)"
    )


def test_a_fleet_that_cannot_get_back_to_the_held_size_keeps_the_steps(monkeypatch, tmp_path):
    """Growing to 5,000 stopped, and going back to 2,500 did not get Ready either: the steps
    and that error reach the report, the lab still goes down (seen in a run: the error escaped
    and nothing was written)."""

    class Back(FakeLab):
        def scale(self, lab: str, count: int) -> fleet.FleetResult:
            if ("scale", 2500) in self.calls and count == 500:
                self.calls.append(("scale", count))
                raise LabError("456 of 500 simulated nodes Ready with a Lease")
            return super().scale(lab, count)

    lab = Back(monkeypatch, tmp_path, fails_at=2500)
    results = control_plane.suite((0, 500, 2500), 0.0, tmp_path / "work", lambda _: None)
    assert [s["size"] for s in results["steps"]] == [0, 500]
    assert results["scheduling"] == {
        "size": 500, "error": "456 of 500 simulated nodes Ready with a Lease", "batches": []
    }  # fmt: skip
    assert ("scheduling", "loaded") not in lab.calls and lab.calls[-1] == ("down",)
    saved = json.loads((tmp_path / "work" / "steps.json").read_text())
    assert saved["scheduling"]["error"] and len(saved["steps"]) == 2
    text = "\n".join(cp_report._scheduling_section(results["scheduling"]))
    assert "did not get back to 500 simulated nodes" in text and "456 of 500" in text


def test_every_size_runs_when_the_fleet_keeps_up(monkeypatch, tmp_path):
    FakeLab(monkeypatch, tmp_path)
    results = control_plane.suite((0, 500), 0.0, tmp_path / "work", lambda _: None)
    assert [s["size"] for s in results["steps"]] == [0, 500]
    assert "stopped" not in results
    assert results["steps"][1]["fleet"]["nodes"] == 500
    assert results["scheduling"]["nodes"] == 250 and results["scheduling"]["size"] == 500
    saved = json.loads((tmp_path / "work" / "steps.json").read_text())
    assert saved["scheduling"] == results["scheduling"]


def test_no_scheduler_batch_on_an_empty_fleet(monkeypatch, tmp_path):
    lab = FakeLab(monkeypatch, tmp_path)
    results = control_plane.suite((0,), 0.0, tmp_path / "work", lambda _: None)
    assert "scheduling" not in results and ("scheduling", "loaded") not in lab.calls


def test_the_lab_goes_down_when_its_apply_fails(monkeypatch, tmp_path):
    lab = FakeLab(monkeypatch, tmp_path)

    def failing_apply(inventory, report_path, log):
        raise RuntimeError("apply left hosts {'failed'}")

    monkeypatch.setattr(suites, "apply", failing_apply)
    with pytest.raises(RuntimeError, match="apply left hosts"):
        control_plane.suite((0, 500), 0.0, tmp_path / "work", lambda _: None)
    assert lab.calls == [("down",), ("boot", suites.LAB), ("down",)]


def _as_make_bench(monkeypatch) -> None:
    """`python -m benchmarks` as root, its signal handler and plots left out."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setattr(report, "plots", lambda results, out: [])


def test_make_bench_controlplane_stores_the_steps_and_the_machine(monkeypatch, tmp_path):
    FakeLab(monkeypatch, tmp_path, fails_at=2500)
    _as_make_bench(monkeypatch)
    out = tmp_path / "out"
    argv = ["--suites", "controlplane", "--cp-sizes", "0 500 2500", "--cp-settle", "0",
            "--out", str(out), "--work", str(tmp_path / "work")]  # fmt: skip
    assert bench_main.main(argv) == 0
    stored = json.loads((out / "results.json").read_text())["controlplane"]
    assert {"date", "cpus", "memory_gib", "load_average_at_start"} <= stored["machine"].keys()
    assert stored["sizes"] == [0, 500, 2500] and stored["settle_s"] == 0.0
    assert [s["size"] for s in stored["steps"]] == [0, 500]
    assert stored["stopped"]["size"] == 2500
    assert "the fleet did not get Ready at 2,500" in (out / cp_report.DOC).read_text()


def _pod(name: str, created: str, scheduled: str | None, ready: str | None) -> dict:
    conditions = []
    if scheduled:
        conditions.append(
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}
        )
    if ready:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": ready})
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "status": {"conditions": conditions},
    }


def test_pod_startup_reads_the_pods_own_timestamps():
    """Four pods created at :00, bound 1 to 3 s later, Ready a second after; one never bound
    (counted, not timed). Nearest-rank percentiles; pods bound per second over creation to the
    last binding."""
    pods = [
        _pod("a", "2026-11-29T01:00:00Z", "2026-11-29T01:00:01Z", "2026-11-29T01:00:02Z"),
        _pod("b", "2026-11-29T01:00:00Z", "2026-11-29T01:00:01Z", "2026-11-29T01:00:02Z"),
        _pod("c", "2026-11-29T01:00:00Z", "2026-11-29T01:00:03Z", "2026-11-29T01:00:04Z"),
        _pod("d", "2026-11-29T01:00:00Z", None, None),
    ]
    figures = control_plane.pod_startup(pods)
    assert figures == {
        "pods": 4,
        "scheduled": 3,
        "ready": 3,
        "scheduled_p50_s": 1.0,
        "scheduled_p99_s": 3.0,
        "ready_p50_s": 2.0,
        "ready_p99_s": 4.0,
        "pods_per_s": 1.0,  # 3 pods over 3 s
    }
    # All bound in the creation's own second: the span reads as 1 s, not 0.
    same = [_pod(n, "2026-11-29T01:00:00Z", "2026-11-29T01:00:00Z", None) for n in "xyz"]
    assert control_plane.pod_startup(same)["pods_per_s"] == 3.0
    assert control_plane.pod_startup([])["scheduled_p99_s"] is None


# ---------------------------------------------------------------- the scheduler at fleet size


class FakeCluster:
    """What `scheduling` asks of a lab's API (lab/fleet.py's kubectl and create), in memory:
    simulated nodes of two teams, pods run at once unless `runs` says how many may, taints
    lifted and put back, the calls kept in order."""

    def __init__(self, research: int, inference: int, runs: int | None = None) -> None:
        self.nodes = {
            f"kwok-{team}-{i}": {"metadata": {"labels": {"gpuinfra.io/team": team}}}
            for team, count in (("research", research), ("inference", inference))
            for i in range(count)
        }
        self.pods: dict[str, dict] = {}
        self.runs = runs
        self.calls: list[tuple[str, ...]] = []
        self.created: list[list[dict]] = []

    def kubectl(self, loaded, *args: str, stdin: str | None = None) -> str:
        self.calls.append(args)
        if args[:2] == ("get", "pods"):
            batch = args[args.index("-l") + 1].split("=", 1)[1]
            items = [p for p in self.pods.values() if p["metadata"]["labels"]["batch"] == batch]
            if "--field-selector=status.phase!=Running" in args:
                items = [p for p in items if p["status"]["phase"] != "Running"]
            if args[-2:] == ("-o", "name"):
                return "".join(f"pod/{p['metadata']['name']}\n" for p in items)
            return json.dumps({"items": items})
        if args[:2] == ("delete", "pods"):
            self.pods.clear()
        if args[:3] == ("create", "-f", "-"):
            self.created.append([json.loads(stdin)])
        return ""

    def create(self, loaded, objects: list[dict]) -> None:
        self.created.append(objects)
        for index, pod in enumerate(objects):
            phase = "Running" if self.runs is None or index < self.runs else "Pending"
            stamp = "2026-12-02T10:00:00Z"
            bound = phase == "Running"
            pod = copy.deepcopy(pod)
            pod["metadata"]["creationTimestamp"] = stamp
            pod["status"] = {
                "phase": phase,
                "conditions": [
                    {
                        "type": kind,
                        "status": "True",
                        "lastTransitionTime": f"2026-12-02T10:00:0{s}Z",
                    }
                    for kind, s in (("PodScheduled", 2), ("Ready", 3))
                    if bound
                ],
            }
            self.pods[pod["metadata"]["name"]] = pod

    def simulated_nodes(self, loaded) -> dict:
        return self.nodes


class _Versions:
    kubernetes = "1.35.4"


class _Loaded:
    class cluster:  # noqa: N801 - stands for LoadedCluster.cluster
        versions = _Versions()


@pytest.fixture
def fake_cluster(monkeypatch) -> FakeCluster:
    fake = FakeCluster(research=3, inference=2)
    for name in ("kubectl", "create", "simulated_nodes"):
        monkeypatch.setattr(fleet, name, getattr(fake, name))
    monkeypatch.setattr(control_plane.time, "sleep", lambda _s: None)
    monkeypatch.setattr(control_plane, "fleet_config", lambda loaded: FleetPolicyConfig())
    return fake


def test_a_gang_batch_is_one_workload_created_before_its_pods_and_a_plain_batch_none():
    gang = control_plane.gpu_pods("research", "sched-gang", 3, "scheduling.k8s.io/v1alpha1")
    workload, *pods = gang
    assert workload["kind"] == "Workload" and workload["metadata"]["namespace"] == "research"
    assert workload["spec"]["podGroups"][0]["policy"]["gang"]["minCount"] == 3
    assert [p["spec"]["workloadRef"] for p in pods] == [
        {"name": "sched-gang", "podGroup": "workers"}
    ] * 3
    plain = control_plane.gpu_pods("research", "sched-plain", 3, None)
    assert [p["kind"] for p in plain] == ["Pod"] * 3
    assert not any("workloadRef" in p["spec"] for p in plain)
    for pod in [*pods, *plain]:
        # A node's 8 GPUs each, so one pod per node; the team's own taint tolerated only.
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]
        assert resources["limits"]["nvidia.com/gpu"] == "8"
        assert pod["spec"]["tolerations"] == [
            {"key": "gpuinfra.io/team", "value": "research", "effect": "NoSchedule"}
        ]


def test_scheduling_runs_a_pod_per_team_node_without_then_with_a_gang_and_restores_the_taint(
    fake_cluster,
):
    """The research team's three nodes lose the preflight taint, get a plain batch of three and
    then one gang of three (its Workload created alone, before the pods), each deleted before
    the next; the inference team's nodes are never touched; the taint goes back at the end."""
    lines: list[str] = []
    result = control_plane.scheduling(_Loaded(), lines.append)
    research = sorted(n for n in fake_cluster.nodes if "research" in n)
    assert result["team"] == "research" and result["nodes"] == 3
    plain, gang = result["batches"]
    assert (plain["gang"], gang["gang"]) == (False, True)
    for figures in (plain, gang):
        assert figures["pods"] == figures["running"] == figures["scheduled"] == 3
        assert figures["scheduled_p99_s"] == 2.0 and figures["ready_p99_s"] == 3.0
        assert figures["all_running_s"] == 3.0  # the first creation to the last Ready
    taints = [c for c in fake_cluster.calls if c[:2] == ("taint", "nodes")]
    assert taints[0] == ("taint", "nodes", *research, "gpuinfra.io/preflight-")
    assert taints[-1] == (
        "taint",
        "nodes",
        "--overwrite",
        *research,
        "gpuinfra.io/preflight=true:NoSchedule",
    )
    # The plain batch's pods, then the Workload alone, then the gang's pods.
    kinds = [[o["kind"] for o in objects] for objects in fake_cluster.created]
    assert kinds == [["Pod"] * 3, ["Workload"], ["Pod"] * 3]
    deletes = [c for c in fake_cluster.calls if c[0] == "delete"]
    assert [c[1] for c in deletes] == ["pods", "pods", "workloads.scheduling.k8s.io"]
    # Waiting polls names only, never the pods' whole objects.
    polls = [c for c in fake_cluster.calls if c[:2] == ("get", "pods")]
    assert sum(c[-1] == "json" for c in polls) == 2  # one read per batch, for the figures
    assert len(lines) == 2 and "no gang" in lines[0] and "one gang" in lines[1]


def test_the_batches_leave_the_teams_gpu_balloons_their_nodes(fake_cluster, monkeypatch):
    """research's 8-GPU balloon holds one of its three nodes: two pods a batch. Another
    team's balloon and a CPU balloon of research's hold none of its GPU nodes."""
    pools = {
        "gpu": BalloonPool(replicas=1, team="research", gpus=8),
        "cpu": BalloonPool(replicas=2, team="research"),
        "other": BalloonPool(replicas=1, team="inference", gpus=8),
    }
    config = FleetPolicyConfig(balloons=pools)
    monkeypatch.setattr(control_plane, "fleet_config", lambda loaded: config)
    result = control_plane.scheduling(_Loaded(), lambda _line: None)
    assert result["nodes"] == 3 and result["balloon_nodes"] == 1
    assert [b["pods"] for b in result["batches"]] == [2, 2]


def test_a_batch_that_never_runs_whole_is_recorded_and_the_taint_still_goes_back(
    fake_cluster, monkeypatch
):
    """Two of three pods run (a gang would run none; this is the count recorded, not a hang):
    the batch ends at its timeout with running 2 and no all-running time. A batch that cannot
    be deleted raises, and the preflight taint is put back all the same."""
    fake_cluster.runs = 2
    clock = iter(range(0, 10_000, 100))
    monkeypatch.setattr(control_plane.time, "monotonic", lambda: next(clock))
    figures = control_plane.schedule_batch(_Loaded(), "research", 3, None)
    assert figures["running"] == 2 and figures["all_running_s"] is None
    assert figures["scheduled"] == 2 and figures["pods"] == 3

    def stuck(loaded, *args, stdin=None):
        fake_cluster.calls.append(args)
        if args[:2] == ("get", "pods"):
            if args[-2:] == ("-o", "name"):
                return "pod/x\n"
            labels = {"batch": "sched-plain"}
            stamp = "2026-12-02T10:00:00Z"
            pod = {"metadata": {"name": "x", "labels": labels, "creationTimestamp": stamp}}
            return json.dumps({"items": [pod]})
        return ""

    monkeypatch.setattr(fleet, "kubectl", stuck)
    with pytest.raises(LabError, match="not gone"):
        control_plane.scheduling(_Loaded(), lambda _line: None)
    assert fake_cluster.calls[-1][:3] == ("taint", "nodes", "--overwrite")


# ---------------------------------------------------------------- the Events' own etcd


def test_an_events_member_is_told_from_the_main_member_on_the_same_host():
    """Both are `etcd` on the same host: keyed alike, one hid the other's memory and CPU."""
    events = b"/usr/local/bin/etcd\0--name=etcd-1-events\0--data-dir=/var/lib/etcd/events\0"
    main = b"/usr/local/bin/etcd\0--name=etcd-1\0--data-dir=/var/lib/etcd\0"
    assert control_plane.events_member(events)
    assert not control_plane.events_member(main)
    # A main member whose data folder only mentions events is still the main one.
    assert not control_plane.events_member(b"etcd\0--name=etcd-1\0--wal-dir=/events\0")


def test_the_comparison_lab_keeps_the_events_in_the_main_etcd(monkeypatch, tmp_path):
    from lab import lifecycle

    written = tmp_path / "cluster.yml"

    class Up:
        inventory_path = written

    def up(lab, topology, inventory_path=None, kubernetes=False):
        etcd = {"source": "mirror", "events": {"enabled": True}}
        data = {"group_vars": {"etcd": {"etcd": etcd}}, "hosts": {}}
        written.write_text(yaml.safe_dump(data))
        return Up()

    monkeypatch.setattr(lifecycle, "up", up)
    control_plane.boot("bench", written)
    etcd = yaml.safe_load(written.read_text())["group_vars"]["etcd"]["etcd"]
    assert etcd == {"source": "mirror", "events": {"enabled": True}}  # the sample's choice
    control_plane.boot("bench", written, events_apart=False)
    etcd = yaml.safe_load(written.read_text())["group_vars"]["etcd"]["etcd"]
    assert etcd == {"source": "mirror", "events": {"enabled": False}}


def test_the_events_in_main_run_grows_the_same_steps_without_scheduler_batches(
    monkeypatch, tmp_path
):
    lab = FakeLab(monkeypatch, tmp_path)
    results = control_plane.suite(
        (0, 500), 0.0, tmp_path / "work", lambda _: None, events_apart=False
    )
    assert [s["size"] for s in results["steps"]] == [0, 500]
    assert results["events_etcd"] is False and "scheduling" not in results
    assert ("boot", suites.LAB, "events in main") in lab.calls
    assert ("scheduling", "loaded") not in lab.calls
    # Control: the sample's run measures the scheduler.
    assert "scheduling" in control_plane.suite((0, 500), 0.0, tmp_path / "w2", lambda _: None)


def _events_in_main(measured: dict) -> dict:
    """The measured steps as the before: the main etcd twice as large, more commits and
    slower, and the Events' writes through the API servers unchanged."""
    before = copy.deepcopy(measured)
    before["machine"] = {"date": "2026-12-03 15:00 UTC"}
    for step in before["steps"]:
        for member in step["etcd"].values():
            member["db_bytes"] *= 2
            member["db_in_use_bytes"] *= 2
            member["backend_commit_count"] += 100
            member["backend_commit_p99_s"] *= 1.5
    before["steps"] = [s for s in before["steps"] if s["size"] != 1000]
    return before


def test_the_events_comparison_pairs_the_sizes_both_runs_measured(measured):
    before = _events_in_main(measured)
    rows = cp_report.events_comparison(measured, before)
    assert [row["size"] for row in rows] == [0, 500]  # 1,000 only in the after
    row = rows[1]
    assert row["db_bytes_before"] == 2 * row["db_bytes_after"]
    assert row["in_use_bytes_before"] == 2 * row["in_use_bytes_after"]
    assert row["commits_before"] == row["commits_after"] + 100 * 5
    assert row["commit_p99_s_before"] == pytest.approx(1.5 * row["commit_p99_s_after"])
    step = next(s for s in measured["steps"] if s["size"] == 500)
    posts = [e for n, e in step["requests"].items() if n.split(" ")[1] == "events"]
    assert row["event_writes_after"]["count"] == sum(e["count"] for e in posts)
    assert row["event_writes_after"]["p99_s"] == max(
        v for e in posts for v in e["p99"].values() if v is not None
    )


def test_the_section_gives_the_events_before_and_after_only_with_both_runs(measured, tmp_path):
    path = tmp_path / cp_report.DOC
    cp_report.write_doc(measured, path)
    assert "Events in their own etcd, before and after" not in path.read_text()
    cp_report.write_doc(measured, path, _events_in_main(measured))
    text = path.read_text()
    assert "Events in their own etcd, before and after" in text
    assert "run 2026-12-03 15:00 UTC" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| 500 |")][-1:]
    assert row.count(" / ") >= 6


def _fake_make_bench(monkeypatch, tmp_path: Path) -> tuple[Path, list[str]]:
    """`make bench BENCH_SUITES=controlplane` on a FakeLab at 0 and 500 nodes: its output
    folder and arguments."""
    FakeLab(monkeypatch, tmp_path)
    _as_make_bench(monkeypatch)
    out = tmp_path / "out"
    argv = ["--suites", "controlplane", "--cp-sizes", "0 500", "--cp-settle", "0",
            "--out", str(out), "--work", str(tmp_path / "work")]  # fmt: skip
    return out, argv


def test_make_bench_keeps_the_events_in_main_run_apart(monkeypatch, tmp_path):
    out, common = _fake_make_bench(monkeypatch, tmp_path)
    assert bench_main.main(common) == 0
    assert bench_main.main([*common, "--cp-events-in-main"]) == 0
    stored = json.loads((out / "results.json").read_text())
    assert stored["controlplane"]["events_etcd"] is True
    assert stored[control_plane.EVENTS_IN_MAIN]["events_etcd"] is False
    assert "Events in their own etcd, before and after" in (out / cp_report.DOC).read_text()


def _apf_phase(label: str, probe_p99: float, low: float | None, not_ready: int) -> dict:
    return {
        "flow_schema": label, "clients": 48, "seconds": 90.0,
        "flood": {"requests": 1200, "statuses": {"200": 1100, "429": 100}, "p50_s": 2.5},
        "probe": {"requests": 150, "statuses": {"403": 150}, "p50_s": 0.01, "p99_s": probe_p99},
        "lease_put_p99_s": 0.4, "nodes_not_ready_after": not_ready,
        "queue_wait_p99_s": {"gpuinfra-fleet-jobs": 1.5, **({"workload-low": low} if low else {})},
        "rejected": {},
    }  # fmt: skip


def test_the_section_gives_flow_controls_before_and_after_where_a_run_made_it(measured):
    assert not any("Priority and Fairness" in line for line in cp_report.markdown(measured))
    with_apf = measured | {
        "flow_control": {
            "size": 1000,
            "sampler": "system:serviceaccount:gpu-health:gpu-health-sampler",
            "phases": [_apf_phase("gpuinfra", 0.05, None, 0), _apf_phase("none", 2.0, 1.9, 12)],
            "recovery": [None, None, None],
        }
    }
    text = "\n".join(cp_report.markdown(with_apf))
    assert "API Priority and Fairness, before and after (the run above, at 1,000" in text
    rows = [line for line in text.splitlines() if line.startswith(("| fleet_policy", "| none"))]
    assert rows == [
        "| fleet_policy's | 1,200 (1,100 200, 100 429) | 2.500 | 0.010 / 0.050 | 1.500 / n/a "
        "| 0.400 | 0 |",
        "| none (before) | 1,200 (1,100 200, 100 429) | 2.500 | 0.010 / 2.000 | 1.500 / 1.900 "
        "| 0.400 | 12 |",
    ]


# ---------------------------------------------------------------- sizing from the fleet


def test_the_fleet_sized_settings_are_what_sizing_derives():
    assert control_plane.sized_settings(2500) == {
        "kubernetes": {"max_requests_inflight": 1500, "max_mutating_requests_inflight": 500},
        "etcd": {"quota_backend_bytes": 5 * 2**30},
    }
    # Control: five nodes are upstream's defaults, what the plain run's lab has.
    assert control_plane.sized_settings(5) == {
        "kubernetes": {"max_requests_inflight": 400, "max_mutating_requests_inflight": 200},
        "etcd": {"quota_backend_bytes": 2 * 2**30},
    }


def test_the_sized_lab_sets_the_fleets_slots_and_quota(monkeypatch, tmp_path):
    from lab import lifecycle

    written = tmp_path / "cluster.yml"

    class Up:
        inventory_path = written

    def up(lab, topology, inventory_path=None, kubernetes=False):
        data = {
            "group_vars": {
                "all": {"kubernetes": {"version": "1.35.4"}},
                "etcd": {"etcd": {"source": "mirror"}},
            },
            "hosts": {},
        }
        written.write_text(yaml.safe_dump(data))
        return Up()

    monkeypatch.setattr(lifecycle, "up", up)
    control_plane.boot("bench", written)
    group_vars = yaml.safe_load(written.read_text())["group_vars"]
    assert group_vars["all"]["kubernetes"] == {"version": "1.35.4"}  # sized by the lab's nodes
    assert group_vars["etcd"]["etcd"] == {"source": "mirror"}
    control_plane.boot("bench", written, sized_for=2500)
    group_vars = yaml.safe_load(written.read_text())["group_vars"]
    assert group_vars["all"]["kubernetes"] == {
        "version": "1.35.4", "max_requests_inflight": 1500, "max_mutating_requests_inflight": 500
    }  # fmt: skip
    assert group_vars["etcd"]["etcd"] == {"source": "mirror", "quota_backend_bytes": 5 * 2**30}


def test_the_sized_run_grows_the_same_steps_without_scheduler_batches(monkeypatch, tmp_path):
    lab = FakeLab(monkeypatch, tmp_path)
    results = control_plane.suite((0, 500), 0.0, tmp_path / "work", lambda _: None, sized_for=2500)
    assert [s["size"] for s in results["steps"]] == [0, 500]
    assert results["sized_for"]["nodes"] == 2500
    assert results["sized_for"]["kubernetes"]["max_requests_inflight"] == 1500
    assert "scheduling" not in results and ("scheduling", "loaded") not in lab.calls
    assert ("boot", suites.LAB, "sized for 2500") in lab.calls
    # Control: the plain run has no sizing of its own.
    assert "sized_for" not in control_plane.suite((0,), 0.0, tmp_path / "w2", lambda _: None)


def _sized(measured: dict) -> dict:
    """The measured steps as the after: single-object calls twice as fast, 429s gone."""
    after = copy.deepcopy(measured)
    after["machine"] = {"date": "2026-12-04 20:00 UTC"}
    after["sized_for"] = {"nodes": 2500, **control_plane.sized_settings(2500)}
    for step in after["steps"]:
        step["responses"] = {"200": 1000}
        for name, entry in step["requests"].items():
            if name.endswith(" resource"):
                entry["p99"] = {h: (v / 2 if v else v) for h, v in entry["p99"].items()}
    after["steps"] = [s for s in after["steps"] if s["size"] != 0]
    return after


def test_the_sizing_comparison_pairs_the_sizes_both_runs_measured(measured):
    plain = copy.deepcopy(measured)
    for step in plain["steps"]:
        step["responses"] = {"200": 900, "429": 7}
    rows = cp_report.sizing_comparison(plain, _sized(measured))
    assert [row["size"] for row in rows] == [500, 1000]  # 0 only in the before
    row = rows[0]
    assert row["single_p99_s_after"] == pytest.approx(row["single_p99_s_before"] / 2)
    assert row["list_p99_s_after"] == row["list_p99_s_before"]
    assert (row["refused_before"], row["refused_after"]) == (7, 0)
    assert row["cpu_seconds_after"] == pytest.approx(row["cpu_seconds_before"])
    assert row["ready_s_after"] == row["ready_s_before"]
    # A run from before the responses were read says so rather than zero.
    assert cp_report.sizing_comparison(measured, _sized(measured))[0]["refused_before"] is None


def test_the_section_gives_the_sizing_before_and_after_only_with_the_sized_run(measured, tmp_path):
    path = tmp_path / cp_report.DOC
    cp_report.write_doc(measured, path)
    assert "Sizing from the fleet, before and after" not in path.read_text()
    cp_report.write_doc(measured, path, sized=_sized(measured))
    text = path.read_text()
    assert "Sizing from the fleet, before and after" in text
    assert "`--max-requests-inflight` 1,500" in text and "quota 5 GiB" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| 1,000 |")][-1:]
    assert row.count(" / ") >= 7 and "n/a / 0" in row


def test_make_bench_keeps_the_sized_run_apart_and_runs_one_comparison_at_a_time(
    monkeypatch, tmp_path, capsys
):
    out, common = _fake_make_bench(monkeypatch, tmp_path)
    assert bench_main.main(common) == 0
    assert bench_main.main([*common, "--cp-sized-for", "2500"]) == 0
    stored = json.loads((out / "results.json").read_text())
    assert "sized_for" not in stored["controlplane"]
    assert stored[control_plane.SIZED]["sized_for"]["nodes"] == 2500
    assert "Sizing from the fleet, before and after" in (out / cp_report.DOC).read_text()
    with pytest.raises(SystemExit) as refused:
        bench_main.main([*common, "--cp-sized-for", "2500", "--cp-events-in-main"])
    assert refused.value.code == 2
    assert "one per run" in capsys.readouterr().err


def test_the_section_gives_the_events_clusters_own_members_where_the_run_read_them(measured):
    text = "\n".join(cp_report.markdown(measured))
    assert "The Events cluster itself" not in text  # a run from before they were read
    with_events = copy.deepcopy(measured)
    step = next(s for s in with_events["steps"] if s["size"] == 500)
    step["etcd_events"] = {
        f"etcd-{i}": {"db_bytes": 3 * 2**20, "leader": i == 2, "backend_commit_count": 40,
                      "backend_commit_p99_s": 0.02 * i, "wal_fsync_p99_s": 0.01}
        for i in range(1, 6)
    }  # fmt: skip
    text = "\n".join(cp_report.markdown(with_events))
    assert "The Events cluster itself" in text
    assert "| 500 | 3 | 100.0 | 10.0 | 200 |" in text
    assert not [line for line in text.splitlines() if line.startswith("| 1,000 | 3 |")]


# ---------------------------------------------------------------- the metric budget


def _prometheus_answers(monkeypatch) -> list[str]:
    """Prometheus' query API on the monitoring host, as host_get reaches it."""
    series = {
        "scrape_samples_scraped": [("node", "cp-1", 1900), ("node", "gpu-1", 2100),
                                   ("node", "mon-1", 1500), ("etcd", "etcd-1", 3000)],
        "scrape_samples_post_metric_relabeling": [("node", "cp-1", 1100), ("node", "gpu-1", 1300),
                                                  ("node", "mon-1", 900), ("etcd", "etcd-1", 1200)],
        "prometheus_tsdb_head_series": [("prometheus", "mon-1", 7777)],
    }  # fmt: skip
    asked = []

    def host_get(lab: str, host: str, url: str) -> str:
        import urllib.parse

        query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["query"][0]
        asked.append((host, url.split("?")[0], query))
        result = [
            {"metric": {"job": job, "host": name}, "value": [0, str(value)]}
            for job, name, value in series[query]
        ]
        return json.dumps({"status": "success", "data": {"result": result}})

    monkeypatch.setattr(control_plane, "host_get", host_get)
    return asked


def test_the_metric_budget_is_read_from_prometheus_per_target(monkeypatch, load_small):

    asked = _prometheus_answers(monkeypatch)
    budget = control_plane.metric_budget("bench", load_small())
    assert {host for host, _, _ in asked} == {"mon-1"}
    assert {url for _, url, _ in asked} == {"http://127.0.0.1:9090/api/v1/query"}
    assert budget["jobs"]["node"]["gpu-1"] == {"scraped": 2100, "kept": 1300}
    assert budget["jobs"]["etcd"] == {"etcd-1": {"scraped": 3000, "kept": 1200}}
    assert budget["head_series"] == 7777
    assert budget["kubernetes_nodes"] == ["cp-1", "cp-2", "cpu-1", "gpu-1"]
    assert budget["dcgm_keep_metrics"] == 13
    figures = cp_report.budget_figures(budget)
    # The nodes' mean: cp-1 and gpu-1 answered; mon-1 is not a Kubernetes node.
    assert figures["node_exporter_per_node"] == 1200
    assert figures["gpu_node"] == 1200 + 13 * 8
    text = "\n".join(cp_report._metric_budget_section(budget, "the run above"))
    assert "| node | 3 | 1,100, 1,300 | 1,833 |" in text
    assert "1,304 per GPU node against inventory/sizing.py's budget of 2,000" in text


def test_no_monitoring_host_no_budget_and_an_unread_one_says_why(small_cluster, load_small):

    del small_cluster["hosts"]["mon-1"]
    assert control_plane.metric_budget("bench", load_small()) == {}
    assert cp_report._metric_budget_section({}, "the run above") == []
    text = "\n".join(cp_report._metric_budget_section({"error": "connection refused"}, "it"))
    assert "were not read: connection refused" in text


def test_every_run_ends_with_the_metric_budget(monkeypatch, tmp_path):
    lab = FakeLab(monkeypatch, tmp_path)
    results = control_plane.suite((0,), 0.0, tmp_path / "work", lambda _: None)
    assert results["metric_budget"] == {"host": "mon-1", "jobs": {}}
    assert lab.calls.index(("metric budget", "loaded")) < len(lab.calls) - 1  # before the down
    saved = json.loads((tmp_path / "work" / "steps.json").read_text())
    assert saved["metric_budget"]["host"] == "mon-1"


def test_the_budget_and_the_events_cluster_come_from_the_sized_run_when_the_plain_has_none(
    monkeypatch, measured
):
    _prometheus_answers(monkeypatch)
    sized = _sized(measured)
    sized["metric_budget"] = {
        "host": "mon-1", "head_series": 1, "kubernetes_nodes": ["cp-1"], "dcgm_keep_metrics": 13,
        "jobs": {"node": {"cp-1": {"scraped": 500, "kept": 400}}},
    }  # fmt: skip
    text = "\n".join(cp_report.markdown(measured, sized=sized))
    assert "at the end of the run sized for its fleet" in text
    # Control: the plain run's own budget wins when it has one.
    plain = {**copy.deepcopy(measured), "metric_budget": sized["metric_budget"]}
    text = "\n".join(cp_report.markdown(plain, sized=sized))
    assert "at the end of the run above" in text and "sized for its fleet (`scrape" not in text
