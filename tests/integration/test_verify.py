"""`gpuinfra verify` on the lab: the suites pass on a converged cluster and name what breaks."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from cli.exitcodes import ExitCode
from tests.integration.test_engine import gpuinfra

pytestmark = pytest.mark.integration

ROGUE_DROPIN = "/etc/ssh/sshd_config.d/10-passwords.conf"


def test_verify_passes_on_a_converged_cluster(converged, tmp_path):
    junit = tmp_path / "verify.xml"
    result = gpuinfra(
        "verify", str(converged.inventory_path), "--roles", "base", "--junit", str(junit),
        "--format", "json",
    )  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert {r["host"] for r in report["results"]} == set(converged.hosts)
    assert report["counts"].get("passed", 0) == len(report["results"]) > 0

    suites = ET.parse(junit).getroot().findall("testsuite")
    assert [s.get("name") for s in suites] == ["base"]
    assert int(suites[0].get("tests")) == len(report["results"])
    assert suites[0].get("failures") == "0" and suites[0].get("errors") == "0"


def test_verify_names_the_host_whose_sshd_accepts_passwords(converged, tmp_path):
    """A drop-in sorting before ours turns password logins back on (sshd keeps the first value
    it reads): the file check of drift would not see it, the behaviour check of verify must."""
    lab = converged
    host = lab.hosts[-1]
    lab.ssh(host, f"echo 'PasswordAuthentication yes' > {ROGUE_DROPIN}")
    try:
        junit = tmp_path / "verify.xml"
        result = gpuinfra(
            "verify", str(lab.inventory_path), "--roles", "base", "--junit", str(junit),
            "--format", "json",
        )  # fmt: skip
        assert result.returncode == ExitCode.VERIFY_FAILED, result.stdout[-3000:]
        failed = [r for r in json.loads(result.stdout)["results"] if r["outcome"] != "passed"]
        assert [(r["host"], r["test"]) for r in failed] == [
            (host, f"test_sshd_refuses_password_logins[{host}-passwordauthentication]")
        ]
        failing_cases = [
            case.get("classname")
            for case in ET.parse(junit).getroot().iter("testcase")
            if case.find("failure") is not None
        ]
        assert failing_cases == [f"base.{host}"]
    finally:
        lab.ssh(host, f"rm -f {ROGUE_DROPIN}")


def test_verify_reports_a_stopped_host_as_unreachable(converged):
    lab = converged
    host = lab.hosts[0]
    gpuinfra("lab", "stop", host, "--name", lab.name)
    try:
        result = gpuinfra("verify", str(lab.inventory_path), "--roles", "base", "--format", "json")
        assert result.returncode == ExitCode.UNREACHABLE, result.stdout[-2000:]
        assert json.loads(result.stdout)["unreachable"] == [host]
    finally:
        started = gpuinfra("lab", "start", host, "--name", lab.name)
        assert started.returncode == 0, started.stderr


def test_verify_refuses_an_unknown_suite(converged):
    result = gpuinfra("verify", str(converged.inventory_path), "--roles", "nosuchrole")
    assert result.returncode == ExitCode.BAD_INPUT
    assert "nosuchrole" in result.stderr
