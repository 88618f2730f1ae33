"""`gpuinfra verify` without hosts: which hosts each suite targets, collection, reports."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from engine.context import load
from engine.verify import SUITES, VerifyReport, VerifyResult, available_suites, write_junit
from tests.unit.conftest import REPO, SAMPLE
from tests.verify.conftest import role_groups, suite_role, targets


def test_every_suite_is_named_after_a_role_with_a_phase():
    from engine.registry import PHASES

    roles = {phase.role for phase in PHASES}
    assert "base" in available_suites()
    assert set(available_suites()) <= roles


def test_suite_role_is_the_folder_under_tests_verify():
    assert suite_role(SUITES / "base" / "test_base.py") == "base"
    assert suite_role(SUITES / "conftest.py") is None
    assert suite_role(REPO / "tests" / "unit" / "test_verify.py") is None


def test_targets_follow_the_phase_groups_and_the_limit():
    loaded = load(SAMPLE)
    every = list(loaded.cluster.hosts)
    assert role_groups("base") is None
    assert targets(loaded, None, set()) == every
    assert targets(loaded, ("etcd",), set()) == loaded.cluster.in_group("etcd")
    assert targets(loaded, None, {"etcd-1", "dns"}) == [
        name for name in every if name == "etcd-1" or "dns" in loaded.cluster.hosts[name].groups
    ]


def collect(suites: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Collect (never run) verification suites against the sample inventory."""
    argv = [sys.executable, "-m", "pytest", str(suites), "--collect-only", "-q",
            "-p", "no:cacheprovider", "-o", "addopts=", f"--rootdir={REPO}",
            f"--gpuinfra-inventory={SAMPLE}", *options]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO)


def test_the_suites_collect_once_per_targeted_host():
    """Collection alone, against the sample inventory: no host is contacted."""
    loaded = load(SAMPLE)
    done = collect(SUITES / "base", "--gpuinfra-limit=etcd")
    assert done.returncode == 0, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    hosts = loaded.cluster.in_group("etcd")
    assert collected and all(any(f"[{h}" in line for h in hosts) for line in collected)
    per_host = {h: sum(f"[{h}]" in line or f"[{h}-" in line for line in collected) for h in hosts}
    assert len(set(per_host.values())) == 1 and min(per_host.values()) > 0


def test_junit_has_one_suite_per_role_and_fails_the_failed_cases(tmp_path):
    report = VerifyReport(
        results=[
            VerifyResult("base", "a", "test_one[a]", "passed"),
            VerifyResult("base", "b", "test_one[b]", "failed", "assert 'yes' == 'no'"),
            VerifyResult("dns", "a", "test_two[a]", "error", "connection refused"),
        ]
    )
    write_junit(report, tmp_path / "v.xml")
    suites = {s.get("name"): s for s in ET.parse(tmp_path / "v.xml").getroot()}
    assert suites["base"].get("tests") == "2" and suites["base"].get("failures") == "1"
    assert suites["dns"].get("errors") == "1"
    failed = [c for c in suites["base"] if c.find("failure") is not None]
    assert [c.get("classname") for c in failed] == ["base.b"]
    assert failed[0].find("failure").get("message") == "assert 'yes' == 'no'"


def test_a_host_is_unreachable_only_when_every_check_errored():
    report = VerifyReport(
        results=[
            VerifyResult("base", "a", "t1", "error", "timed out"),
            VerifyResult("base", "a", "t2", "error", "timed out"),
            VerifyResult("base", "b", "t1", "error", "broken"),
            VerifyResult("base", "b", "t2", "passed"),
        ]
    )
    assert report.unreachable_hosts() == ["a"]
    assert len(report.failures()) == 3


def test_cli_refuses_an_unknown_suite_before_connecting():
    result = CliRunner().invoke(app, ["verify", str(SAMPLE), "--roles", "nosuchrole"])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "nosuchrole" in result.output


def test_suites_with_no_target_in_a_shard_are_deselected_not_skipped():
    """A process given only etcd-1 runs no load balancer checks: nothing placeholder-skipped."""
    done = collect(SUITES, "--gpuinfra-hosts=etcd-1")
    assert done.returncode == 0, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert collected and all("[etcd-1" in line for line in collected)
    assert "deselected" in done.stdout
