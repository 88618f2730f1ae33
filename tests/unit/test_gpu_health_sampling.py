"""The periodic CronJob's sample grows with the fleet, so every GPU worker is checked within
`retest_interval_days`, and never takes more nodes out of service than the cordon budget."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from engine.context import load
from inventory.errors import InventoryInvalid
from roles.gpu_health.config import GpuHealthConfig
from roles.gpu_health.files import MANIFEST, cluster_files
from roles.gpu_health.sampling import (
    UncountedSchedule,
    cluster_sample,
    periodic_sample,
    runs_per_day,
)
from tests.unit.test_gpu_health_manifests import write_cluster as manifests_cluster

SAMPLE = Path(__file__).resolve().parents[2] / "inventory" / "sample"


def write_cluster(tmp_path: Path, gpu_health: dict) -> Path:
    """Three GPU workers, the settings in group_vars.gpu_worker."""
    return manifests_cluster(tmp_path, {"gpu_worker": {"gpu_health": gpu_health}})


def cronjob(loaded) -> dict:
    documents = yaml.safe_load_all(cluster_files(loaded)[MANIFEST])
    return next(d for d in documents if d["kind"] == "CronJob")


@pytest.mark.parametrize(
    ("schedule", "runs"),
    [
        ("17 */6 * * *", 4),
        ("0 */5 * * *", 5),  # 0, 5, 10, 15, 20
        ("0 */1 * * *", 24),
        ("30 * * * *", 24),
        ("5 3 * * *", 1),
        ("0 1,13 * * *", 2),
        ("0 1,1,13 * * *", 2),
    ],
)
def test_runs_per_day_of_the_counted_forms(schedule, runs):
    assert runs_per_day(schedule) == runs


@pytest.mark.parametrize(
    "schedule",
    [
        "*/15 * * * *",  # several runs an hour
        "17 */6 * * 1",  # a weekday
        "17 */6 1 * *",  # a day of the month
        "17 1-5 * * *",  # a range
        "17 */0 * * *",
        "17 24 * * *",
        "60 3 * * *",
        "@daily",
        "17 */6 * *",
    ],
)
def test_schedules_it_cannot_count_are_refused(schedule):
    with pytest.raises(UncountedSchedule):
        runs_per_day(schedule)


# Defaults: 4 runs a day, 30 days, a budget of 10%. (GPU workers, per run, mean interval days)
@pytest.mark.parametrize(
    ("gpu_workers", "per_run", "interval"),
    [
        (2, 1, 0.5),
        (8, 1, 2.0),  # the sample inventory
        (100, 1, 25.0),
        (2500, 21, 29.76),
        (7500, 63, 29.76),
    ],
)
def test_the_sample_grows_with_the_fleet(gpu_workers, per_run, interval):
    sample = periodic_sample(GpuHealthConfig(), gpu_workers)
    assert (sample.per_run, sample.runs_per_day, sample.explicit) == (per_run, 4, False)
    assert sample.interval_days == pytest.approx(interval, abs=0.01)
    assert not sample.over_budget


def test_every_fleet_size_is_checked_within_the_interval_and_the_budget():
    cfg = GpuHealthConfig(retest_interval_days=7, cronjob_schedule="0 2,14 * * *")
    for gpu_workers in range(1, 10001, 37):
        sample = periodic_sample(cfg, gpu_workers)
        assert sample.interval_days is not None
        assert sample.interval_days <= 7, gpu_workers
        assert 1 <= sample.per_run <= sample.budget, gpu_workers


def test_a_sample_past_the_budget_is_capped_at_it():
    cfg = GpuHealthConfig(retest_interval_days=1, cordon_budget="1%")
    sample = periodic_sample(cfg, 7500)
    assert (sample.wanted, sample.budget, sample.per_run) == (1875, 75, 75)
    assert sample.over_budget
    assert sample.interval_days == pytest.approx(25.0)


def test_an_explicit_parallelism_overrides_the_derivation():
    sample = periodic_sample(GpuHealthConfig(cronjob_parallelism=5), 7500)
    assert (sample.per_run, sample.explicit) == (5, True)
    assert sample.interval_days == pytest.approx(375.0)  # 7500 / (5 * 4)


def test_an_explicit_parallelism_needs_no_countable_schedule():
    cfg = GpuHealthConfig(cronjob_parallelism=3, cronjob_schedule="*/20 * * * *")
    sample = periodic_sample(cfg, 100)
    assert (sample.per_run, sample.runs_per_day, sample.interval_days) == (3, None, None)
    with pytest.raises(UncountedSchedule):
        periodic_sample(GpuHealthConfig(cronjob_schedule="*/20 * * * *"), 100)


def test_the_sample_inventory_states_its_sample_and_interval():
    loaded = load(SAMPLE)
    sample = cluster_sample(loaded)
    assert (sample.gpu_workers, sample.per_run, sample.budget) == (8, 1, 1)
    cron = cronjob(loaded)
    assert cron["metadata"]["annotations"] == {
        "gpuinfra.io/gpu-workers": "8",
        "gpuinfra.io/sample-per-run": "1",
        "gpuinfra.io/cordon-budget": "1",
        "gpuinfra.io/retest-interval-days": "2.0",
    }
    command = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--count=1" in command
    text = cluster_files(loaded)[MANIFEST]
    assert "# Each of the 8 GPU workers is checked every 2.0 days on average." in text


def test_an_uncounted_schedule_is_an_inventory_error_naming_the_key(tmp_path):
    path = write_cluster(tmp_path, {"cronjob_schedule": "*/20 * * * *"})
    with pytest.raises(InventoryInvalid) as raised:
        load(path)
    message = str(raised.value)
    assert "group_vars.gpu_worker.gpu_health.cronjob_schedule" in message
    assert "cronjob_parallelism" in message


def test_an_uncounted_schedule_renders_with_an_explicit_parallelism(tmp_path):
    settings = {"cronjob_schedule": "*/20 * * * *", "cronjob_parallelism": 1}
    cron = cronjob(load(write_cluster(tmp_path, settings)))
    assert cron["metadata"]["annotations"]["gpuinfra.io/retest-interval-days"] == "unknown"
    assert cron["metadata"]["annotations"]["gpuinfra.io/sample-per-run"] == "1"


def test_an_interval_the_budget_cannot_meet_is_an_inventory_error(tmp_path):
    # 3 workers, one run a day, every day: 3 a run, and 10% of 3 is a budget of 1.
    path = write_cluster(tmp_path, {"cronjob_schedule": "0 5 * * *", "retest_interval_days": 1})
    with pytest.raises(InventoryInvalid) as raised:
        load(path)
    message = str(raised.value)
    assert "group_vars.gpu_worker.gpu_health.retest_interval_days" in message
    assert "needs 3 nodes per run, more than the cordon budget of 1" in message
    assert "at the budget each is checked every 3.0 days" in message


def test_an_explicit_parallelism_past_the_budget_is_an_inventory_error(tmp_path):
    path = write_cluster(tmp_path, {"cronjob_parallelism": 2})
    with pytest.raises(InventoryInvalid, match="cronjob_parallelism") as raised:
        load(path)
    assert "more than the cordon budget of 1 of 3 GPU workers" in str(raised.value)
    # Within the budget it renders as set, whatever the fleet's size.
    cron = cronjob(load(write_cluster(tmp_path, {"cronjob_parallelism": 2, "cordon_budget": "2"})))
    assert cron["metadata"]["annotations"]["gpuinfra.io/sample-per-run"] == "2"


def test_the_documented_figures_are_the_derived_ones():
    doc = (SAMPLE.parents[1] / "docs" / "gpu-health.md").read_text()
    for gpu_workers in (8, 2500, 7500):
        sample = periodic_sample(GpuHealthConfig(), gpu_workers)
        row = (
            f"| {gpu_workers:,}{' (inventory/sample)' if gpu_workers == 8 else ''} | "
            f"{sample.per_run} | {sample.budget} | {sample.interval_days:.1f} days |"
        )
        assert row in doc, row
