"""The jobs suite's figures (benchmarks/jobreport.py) from a results.json made here, and the
controller's merge of many records (benchmarks/jobs.py merge-records) on a small fleet. No lab;
benchmarks never assert times, so the fixtures hold figures of a known line."""

from __future__ import annotations

import copy
import math

import pytest
import yaml

from benchmarks import jobreport, jobs, report
from engine import fingerprint

PER_HOST, PER_SHARD = 0.08, 0.6  # b and a of the fixture's shards
OUTSIDE, EACH_SHARD = 9.0, 0.5  # the controller's time outside the shards: C0 + c * S
MERGE = {
    "hosts": 7500, "shards": 38, "operations_per_record": 40, "report_mib": 9.5,
    "load_cpu_seconds": 2.0, "cpu_seconds": 3.0, "base_mib": 60.0, "after_load_mib": 180.0,
    "peak_mib": 410.0,
}  # fmt: skip


def run(engine: str, hosts: int, round_number: int) -> dict:
    shards = int(engine.split("-")[1]) if engine.startswith("job-") else 0
    usage = []
    for index in range(shards):
        mine = len(range(index, hosts, shards))
        cpu = PER_SHARD + PER_HOST * mine
        usage.append({"index": index, "hosts": mine, "cpu_s": cpu, "max_rss_kib": 60000,
                      "seconds": cpu * 2, "memory_peak_bytes": 90 * 2**20})  # fmt: skip
    slowest = max((u["seconds"] for u in usage), default=0)
    seconds = slowest + OUTSIDE + EACH_SHARD * shards if shards else 0.1 * hosts
    return {
        "engine": engine, "hosts": hosts, "round": round_number, "shards": shards,
        "seconds": seconds, "cpu_seconds": 0.09 * hosts if not shards else 3.0,
        "peak_tree_mib": 150.0, "max_process_mib": 100.0, "returncode": 0, "load_before": 1.5,
        "load_after": 1.6, "machine_cpu_seconds": 20.0, "status_counts": {"ok": hosts},
        "settled": hosts if shards else None, "shard_usage": usage, "same_as_local": True,
    }  # fmt: skip


def fleet_entry(hosts: int) -> dict:
    engines = ["local", "job-2", "job-4", "job-8"]
    return {
        "hosts": hosts, "lab_up_seconds": 60.0, "first_apply_seconds": 200.0,
        "runs": [run(e, hosts, r) for r in range(3) for e in engines],
    }  # fmt: skip


@pytest.fixture
def results() -> dict:
    return {
        "jobs_machine": {"date": "2026-11-28 10:00 UTC", "cpus": 2, "memory_gib": 23.5},
        "jobs": {
            "job_node": "cpu-1",
            "lab_a": {
                "hosts": 13,
                "runs": [run(e, 13, r) for r in range(3) for e in ("local", "job-2")],
            },  # fmt: skip
            "fleet": {"100": fleet_entry(100), "200": fleet_entry(200)},
            "merge_7500": MERGE,
            "sizes_note": "Lab B ran at 100, 200 hosts.",
        },
    }


def test_the_fit_recovers_the_shards_and_the_controllers_lines(results):
    model = jobreport.fit(results["jobs"])
    assert model["per_host_cpu_s"] == pytest.approx(PER_HOST, abs=1e-5)
    assert model["per_shard_cpu_s"] == pytest.approx(PER_SHARD, abs=1e-3)
    assert model["controller_per_shard_s"] == pytest.approx(EACH_SHARD, abs=1e-3)
    merge = MERGE["cpu_seconds"] + MERGE["load_cpu_seconds"]
    assert model["controller_fixed_s"] == pytest.approx(OUTSIDE + merge, abs=0.01)


def test_the_projection_names_the_fewest_shards_under_two_minutes(results):
    p = jobreport.projection(results["jobs"])
    fixed = OUTSIDE + MERGE["cpu_seconds"] + MERGE["load_cpu_seconds"] + PER_SHARD

    def wall(s: int) -> float:
        return fixed + EACH_SHARD * s + math.ceil(7500 / s) * PER_HOST

    meets = p["shards_meeting_target"]
    assert wall(meets) < 120 <= wall(meets - 1)
    assert p["table"]["8"] == pytest.approx(round(wall(8), 1), abs=0.2)
    assert p["local_cpu_per_host_s"] == pytest.approx(0.09, abs=1e-4)
    assert p["controller_memory_mib_7500"] == MERGE["peak_mib"]


def test_without_two_shard_sizes_there_is_no_projection(results):
    jobs_only_one = copy.deepcopy(results["jobs"])
    for entry in jobs_only_one["fleet"].values():
        for r in entry["runs"]:
            r["shard_usage"] = [dict(u, hosts=50) for u in r["shard_usage"]]
    assert jobreport.projection(jobs_only_one) is None
    assert jobreport.plot(jobs_only_one, None) is None  # no figure, and no matplotlib needed


def test_a_target_out_of_reach_is_said(results):
    slow = copy.deepcopy(results["jobs"])
    slow["merge_7500"]["cpu_seconds"] = 500.0
    p = jobreport.projection(slow)
    assert p["shards_meeting_target"] is None
    assert "Fewest shards under 120 s: **none**" in "\n".join(jobreport.markdown(slow))
    assert jobreport.target_row(slow).endswith("| no S | not met |")


def test_results_md_holds_the_jobs_section_and_its_target(results):
    text = report.markdown(results)
    assert "## drift --job: the drift check as a Kubernetes Job" in text
    assert "| A (13 hosts) | job-2 | 3 |" in text
    assert "| B (200 hosts) | job-8 | 3 |" in text
    assert "Lab B ran at 100, 200 hosts." in text
    meets = jobreport.projection(results["jobs"])["shards_meeting_target"]
    assert f"Fewest shards under 120 s: **{meets}**" in text
    assert "| 7500-host drift under 120 s (drift --job) | " in text
    assert "410 MiB peak" in text
    assert "![drift --job projection](drift-job.png)" in text


def test_a_run_unlike_local_drift_is_flagged(results):
    results["jobs"]["lab_a"]["runs"][1]["same_as_local"] = False
    assert "| A (13 hosts) | job-2 | 3 | " in report.markdown(results)
    row = next(r for r in jobreport.summary(results["jobs"]["lab_a"]) if r["engine"] == "job-2")
    assert row["same_as_local"] is False


def test_merge_records_reads_every_record_and_merges_every_shard(tmp_path):
    template = tmp_path / "record.json"
    template.write_bytes(
        fingerprint.Record(
            key="k", roles=("base",), commands=(),
            operations=tuple(("base", f"Write /etc/file-{i}") for i in range(30)),
            marker="m", probe_digest="d",
        ).to_json()
    )  # fmt: skip
    figures = jobs.merge_records(template, tmp_path / "work", hosts=60, per_shard=25)
    assert (figures["hosts"], figures["shards"], figures["operations_per_record"]) == (60, 3, 30)
    assert figures["peak_mib"] >= figures["after_load_mib"] >= figures["base_mib"] > 0


def test_lab_b_admits_the_key_from_its_gateway_only(tmp_path):
    inventory = tmp_path / "cluster.yml"
    inventory.write_text(
        "name: b\nnetworks: {node: 198.18.4.0/22, admin: [198.18.4.1/32]}\n"
        "group_vars: {all: {kubernetes: {enabled: false}}}\nhosts: {}\n"
    )
    assert jobs.lab_b_inventory(inventory) == "198.18.4.1/32"
    job = yaml.safe_load(inventory.read_text())
    assert job["group_vars"]["all"]["drift_job"] == {
        "enabled": True, "sources": ["198.18.4.1/32"], "parallel": jobs.PARALLEL
    }  # fmt: skip
