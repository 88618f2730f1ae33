"""A batched apply that stops early still reports every host: the untried ones as `skipped`
with the reason, in the JSON report and in JUnit (issue 13, defect 6).

Stand-in: the batch runner (`engine.runner._run_batch`, which connects to hosts) is replaced by
one that fails every host of its batch; the loop around it (engine/rolling.py), the report and
JUnit are real."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict

from engine import runner
from engine.junit import write_junit
from engine.reports import HostReport, HostStatus, Mode, RunOptions
from engine.runner import run
from inventory.loader import load
from tests.unit.loopback import loopback_cluster


def failing_batch(loaded, options, contexts, phases, report, progress, asked=None) -> None:
    for ctx in contexts:
        report.hosts[ctx.name] = HostReport(ctx.name, HostStatus.failed, error="stand-in failure")


def test_untried_hosts_are_reported_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "_run_batch", failing_batch)
    loaded = load(loopback_cluster(tmp_path / "loop"))
    options = RunOptions(mode=Mode.apply, batch="2", fail_percent=10)
    report = run(loaded, options)

    assert report.stopped  # why it stopped, in the runner's words
    assert list(report.hosts) == list(loaded.cluster.hosts)  # every host, inventory order
    statuses = {name: host.status for name, host in report.hosts.items()}
    assert statuses == {
        "etcd-1": HostStatus.failed,
        "lb-1": HostStatus.failed,
        "lb-2": HostStatus.skipped,
        "dns-1": HostStatus.skipped,
        "cpu-1": HostStatus.skipped,
    }
    assert report.hosts["cpu-1"].error.startswith("not tried")

    document = json.loads(json.dumps(asdict(report)))
    assert document["hosts"]["dns-1"]["status"] == "skipped"
    assert "not tried" in document["hosts"]["dns-1"]["error"]

    junit = tmp_path / "apply.xml"
    write_junit(report, junit)
    suite = ET.parse(junit).getroot()
    assert suite.get("skipped") == "3" and suite.get("errors") == "2"
    skipped = {case.get("classname") for case in suite if case.find("skipped") is not None}
    assert skipped == {"lb-2", "dns-1", "cpu-1"}


def test_a_run_that_does_not_stop_skips_nobody(tmp_path, monkeypatch):
    """Control: without --fail-percent every batch runs and no host is skipped."""
    monkeypatch.setattr(runner, "_run_batch", failing_batch)
    loaded = load(loopback_cluster(tmp_path / "loop"))
    report = run(loaded, RunOptions(mode=Mode.apply, batch="2"))
    assert report.stopped is None
    assert {host.status for host in report.hosts.values()} == {HostStatus.failed}
