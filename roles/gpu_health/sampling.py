"""How many GPU workers each periodic CronJob run checks, so that every one is checked within
`retest_interval_days` on average, and never more at once than the cordon budget allows.

A fixed sample does not scale: 2 nodes every 6 hours reach each of 7,500 GPU workers about once
in 2.5 years. The sample is the fleet divided by the runs in one interval, rounded up; the runs
are counted from the CronJob's schedule (`runs_per_day`)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from inventory.model import Cluster, LoadedCluster
from roles.gpu_health.config import GpuHealthConfig, cluster_config, parse_budget
from toolkit.spec import HostSettings

# The forms whose runs a day are counted; anything else needs an explicit cronjob_parallelism.
COUNTED_FORMS = "`M */N * * *`, `M H1,H2 * * *`, `M H * * *` or `M * * * *`"


class UncountedSchedule(ValueError):
    """A schedule whose runs per day are not counted here."""


@dataclass(frozen=True)
class PeriodicSample:
    """The CronJob's draw for a fleet: what the interval asks, what the budget allows."""

    gpu_workers: int
    wanted: int  # per run: what the interval needs, or the explicit cronjob_parallelism
    budget: int  # nodes the cordon budget lets be out of service at once
    runs_per_day: int | None  # None: a schedule not counted (only with explicit parallelism)
    explicit: bool

    @property
    def per_run(self) -> int:
        """What the sampler draws: a check takes its node out of service while it runs."""
        return min(self.wanted, self.budget)

    @property
    def over_budget(self) -> bool:
        return self.wanted > self.budget

    @property
    def interval_days(self) -> float | None:
        """Mean days between two checks of one node (draws are uniform; a small fleet is
        checked whole every run)."""
        if self.runs_per_day is None:
            return None
        return self.gpu_workers / (min(self.per_run, self.gpu_workers) * self.runs_per_day)


def runs_per_day(schedule: str) -> int:
    """Runs a day of a cron schedule in one of COUNTED_FORMS; UncountedSchedule otherwise."""
    fields = schedule.split()
    if len(fields) != 5 or fields[2:] != ["*", "*", "*"] or not _in_range(fields[0], 59):
        raise UncountedSchedule(f"cannot count the runs a day of {schedule!r}")
    hours = fields[1]
    if hours == "*":
        return 24
    if step := re.fullmatch(r"\*/(\d+)", hours):
        every = int(step[1])
        if not 1 <= every <= 23:
            raise UncountedSchedule(f"hour step {every} of {schedule!r}: give 1 to 23")
        return len(range(0, 24, every))
    listed = hours.split(",")
    if not all(_in_range(hour, 23) for hour in listed):
        raise UncountedSchedule(f"cannot count the runs a day of {schedule!r}")
    return len({int(hour) for hour in listed})


def _in_range(value: str, highest: int) -> bool:
    return value.isdigit() and int(value) <= highest


def periodic_sample(cfg: GpuHealthConfig, gpu_workers: int) -> PeriodicSample:
    """The sample for `gpu_workers` nodes. Raises UncountedSchedule only when it is needed: an
    explicit cronjob_parallelism draws that many whatever the schedule."""
    budget = parse_budget(cfg.cordon_budget, gpu_workers)
    try:
        runs = runs_per_day(cfg.cronjob_schedule)
    except UncountedSchedule:
        if cfg.cronjob_parallelism is None:
            raise
        runs = None
    if cfg.cronjob_parallelism is not None:
        return PeriodicSample(gpu_workers, cfg.cronjob_parallelism, budget, runs, explicit=True)
    assert runs is not None  # counted, or raised above
    wanted = max(1, math.ceil(gpu_workers / (runs * cfg.retest_interval_days)))
    return PeriodicSample(gpu_workers, wanted, budget, runs, explicit=False)


def cluster_sample(loaded: LoadedCluster) -> PeriodicSample:
    return periodic_sample(cluster_config(loaded), len(loaded.cluster.in_group("gpu_worker")))


def checks(loaded: LoadedCluster, settings: HostSettings) -> Iterator[tuple[str, str]]:
    """A schedule the sample cannot be derived from, and a sample past the cordon budget: the
    interval the inventory asks for could not be met, so it is refused rather than capped
    unseen."""
    cluster = loaded.cluster
    gpu_workers = len(cluster.in_group("gpu_worker"))
    if not gpu_workers:
        return
    try:
        sample = cluster_sample(loaded)
    except UncountedSchedule as exc:
        yield (
            _key(cluster, "cronjob_schedule"),
            f"{exc}: use one of {COUNTED_FORMS}, or set gpu_health.cronjob_parallelism",
        )
        return
    if not sample.over_budget:
        return
    if sample.explicit:
        yield (
            _key(cluster, "cronjob_parallelism"),
            f"{sample.wanted} nodes per run is more than the cordon budget of {sample.budget} "
            f"of {gpu_workers} GPU workers: each check takes its node out of service",
        )
        return
    cfg = cluster_config(loaded)
    yield (
        _key(cluster, "retest_interval_days"),
        f"checking {gpu_workers} GPU workers within {cfg.retest_interval_days} days at "
        f"{sample.runs_per_day} runs a day needs {sample.wanted} nodes per run, more than the "
        f"cordon budget of {sample.budget}; at the budget each is checked every "
        f"{sample.interval_days:.1f} days: raise cordon_budget or retest_interval_days, run "
        f"more often, or set cronjob_parallelism to at most {sample.budget}",
    )


def _key(cluster: Cluster, name: str) -> str:
    """Where the fleet-wide setting is made (gpu_worker wins over all, as cluster_config
    merges them), or where it would be."""
    for group in ("gpu_worker", "all"):
        if name in cluster.group_vars.get(group, {}).get("gpu_health", {}):
            return f"group_vars.{group}.gpu_health.{name}"
    return f"group_vars.gpu_worker.gpu_health.{name}"
