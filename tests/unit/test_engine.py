"""Engine pieces that need no hosts: selection, batches, exit codes, JUnit and JSON reports."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from cli.output import exit_code
from engine.context import load
from engine.junit import write_junit
from engine.reports import HostReport, HostStatus, Mode, OperationResult, RunReport
from engine.runner import REDACTED, _diff
from engine.selection import select_hosts
from tests.unit.conftest import SAMPLE
from toolkit.spec import ManagedFile

runner = CliRunner()


def test_limit_takes_hosts_and_groups():
    loaded = load(SAMPLE)
    assert select_hosts(loaded, ["etcd-2"]) == ["etcd-2"]
    assert select_hosts(loaded, ["loadbalancer", "dns-1"]) == ["lb-1", "lb-2", "dns-1"]
    assert len(select_hosts(loaded, [])) == 28


def report_with(*statuses: HostStatus) -> RunReport:
    report = RunReport(cluster="c", mode=Mode.drift)
    for i, status in enumerate(statuses):
        report.hosts[f"h{i}"] = HostReport(f"h{i}", status=status)
    return report


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        ((HostStatus.ok, HostStatus.ok), ExitCode.OK),
        ((HostStatus.ok, HostStatus.drift), ExitCode.DRIFT),
        ((HostStatus.drift, HostStatus.unreachable), ExitCode.UNREACHABLE),
        ((HostStatus.unreachable, HostStatus.failed), ExitCode.ERROR),
    ],
)
def test_exit_codes_are_distinct_and_ordered(statuses, code):
    assert exit_code(report_with(*statuses)) == code


def test_junit_has_a_case_per_host_and_role_and_fails_drift_with_its_diff(tmp_path):
    report = report_with(HostStatus.ok, HostStatus.drift, HostStatus.unreachable)
    report.hosts["h0"].operations = [OperationResult("base", "Write /etc/hosts", False)]
    report.hosts["h1"].operations = [
        OperationResult("base", "Write /etc/hosts", True, diff="-old\n+new\n"),
        OperationResult("firewall", "Write /etc/nftables.conf", False),
    ]
    report.hosts["h2"].error = "host key refused"
    path = tmp_path / "junit.xml"
    write_junit(report, path)
    suite = ET.parse(path).getroot()
    cases = {(c.get("classname"), c.get("name")): c for c in suite.iter("testcase")}
    assert set(cases) == {("h0", "base"), ("h1", "base"), ("h1", "firewall"), ("h2", "connect")}
    assert cases[("h0", "base")].find("failure") is None
    assert "+new" in cases[("h1", "base")].find("failure").text
    assert cases[("h1", "firewall")].find("failure") is None
    assert cases[("h2", "connect")].find("error").get("message") == "host key refused"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "1")


def test_json_report_is_serialisable():
    report = report_with(HostStatus.drift)
    report.hosts["h0"].operations = [OperationResult("base", "Write /etc/hosts", True, "d")]
    document = json.loads(json.dumps(asdict(report)))
    assert document["hosts"]["h0"]["status"] == "drift"
    assert document["hosts"]["h0"]["operations"][0]["diff"] == "d"


def test_secret_files_are_never_diffed():
    secret = ManagedFile("dns", "/etc/bind/tsig.key", "secret=abc\n", secret=True)
    assert _diff(object(), secret) == REDACTED


def test_unknown_role_and_empty_limit_are_bad_input():
    result = runner.invoke(app, ["plan", str(SAMPLE), "--roles", "bsae"])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "--roles: unknown role bsae" in result.stderr
    result = runner.invoke(app, ["drift", str(SAMPLE), "--limit", "nosuchhost"])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "matches no host" in result.stderr


def test_bad_batch_is_refused_before_connecting():
    result = runner.invoke(app, ["apply", str(SAMPLE), "--batch", "ten", "--yes"])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "--batch" in result.stderr


def test_execution_skips_what_prepare_found_unchanged_until_a_command_runs():
    """pyinfra re-runs every operation's body while executing (each fact asked again over SSH).
    A host nothing has run on is as prepare saw it: its unchanged operations are skipped, and
    after its first command every later operation is evaluated again."""
    from types import SimpleNamespace

    from engine.runner import _skip_unchanged_while_clean

    evaluated: list[str] = []

    def op(name: str, will_change: bool | None, commands: list[str]):
        def generate():
            evaluated.append(name)
            yield from commands

        meta = SimpleNamespace(_maybe_is_change=will_change)
        return SimpleNamespace(operation_meta=meta, command_generator=generate, global_arguments={})

    class Host(SimpleNamespace):
        __hash__ = object.__hash__

    clean, dirty = Host(name="clean"), Host(name="dirty")
    state = SimpleNamespace(
        ops={
            clean: {"a": op("clean.a", False, []), "b": op("clean.b", False, [])},
            dirty: {
                "a": op("dirty.a", False, []),
                "b": op("dirty.b", True, ["write"]),
                # prepare saw nothing to do here, but `b` has run: ask again, and do it
                "c": op("dirty.c", False, ["fix"]),
                "d": op("dirty.d", None, []),
            },
        }
    )
    _skip_unchanged_while_clean(state, [clean, dirty])
    ran = {
        (host.name, key): list(data.command_generator())
        for host in (clean, dirty)
        for key, data in state.ops[host].items()
    }
    assert evaluated == ["dirty.b", "dirty.c", "dirty.d"]
    assert ran[("dirty", "b")] == ["write"] and ran[("dirty", "c")] == ["fix"]
    assert ran[("clean", "a")] == ran[("clean", "b")] == ran[("dirty", "a")] == []


def test_a_handler_whose_trigger_did_not_fire_leaves_the_host_clean():
    """A handler ("refresh package lists if the sources changed") always has commands, but
    with its condition false nothing runs: later operations stay skipped (found by profiling
    the default lab's no-op apply, where every host was re-evaluated from the base role on)."""
    from types import SimpleNamespace

    from engine.runner import _skip_unchanged_while_clean

    evaluated: list[str] = []

    def op(name: str, will_change: bool, condition=None):
        def generate():
            evaluated.append(name)
            yield f"run {name}"

        arguments = {"_if": [condition]} if condition else {}
        meta = SimpleNamespace(_maybe_is_change=will_change)
        return SimpleNamespace(
            operation_meta=meta, command_generator=generate, global_arguments=arguments
        )

    class Host(SimpleNamespace):
        __hash__ = object.__hash__

    host = Host(name="h")
    state = SimpleNamespace(
        ops={
            host: {
                "refresh": op("refresh", True, condition=lambda: False),
                "later": op("later", False),
                "fires": op("fires", True, condition=lambda: True),
                "after": op("after", False),
            }
        }
    )
    _skip_unchanged_while_clean(state, [host])
    ran = {key: list(data.command_generator()) for key, data in state.ops[host].items()}
    assert ran["refresh"] == [] and ran["later"] == []
    assert ran["fires"] == ["run fires"] and ran["after"] == ["run after"]
    assert evaluated == ["fires", "after"]
