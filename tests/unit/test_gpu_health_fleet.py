"""`gpuinfra health fleet`: sampling, unreachable hosts, and cordoning within the budget."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from engine.context import load
from gpuhealth.commands import CommandResult
from gpuhealth.fleet import run_fleet
from gpuhealth.node import NodeRequest, check_node
from gpuhealth.report import to_json
from roles.gpu_health.config import parse_budget
from toolkit.remote import RemoteResult

RECORDINGS = Path(__file__).parent / "recordings" / "gpu"
REMOTE = "gpuinfra health run --format json"


def write_cluster(tmp_path: Path, workers: int) -> Path:
    hosts = {
        f"gpu-{i}": {
            "address": f"10.0.0.{10 + i}",
            "groups": ["gpu_worker"],
            "gpu": {"model": "H100-SXM5-80GB", "count": 8},
        }
        for i in range(1, workers + 1)
    }
    hosts["cpu-1"] = {"address": "10.0.0.200", "groups": ["cpu_worker"]}
    cluster = {
        "name": "fleet",
        "domain": "fleet.test",
        "networks": {"node": "10.0.0.0/24", "admin": ["192.0.2.0/24"]},
    }
    path = tmp_path / "cluster.yml"
    path.write_text(yaml.safe_dump({**cluster, "hosts": hosts}))
    return path


def node_json(recording: str) -> str:
    """What `gpuinfra health run --format json` prints on a node like this recording."""
    report = check_node(NodeRequest(host="remote", expect_count=8, replay=RECORDINGS / recording))
    return to_json(report)


HEALTHY, FAILED = node_json("h100-healthy.json"), node_json("h100-ecc-xid79.json")


class FakeSsh:
    """Answers for each address as the real ssh would: the remote command's output and status."""

    def __init__(self, answers: dict[str, CommandResult]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, loaded, host: str, command: str, timeout: float) -> RemoteResult:
        self.calls.append((host, command))
        answer = self.answers[str(loaded.cluster.hosts[host].address)]
        return RemoteResult(host, answer.rc, answer.stdout, answer.stderr)


class FakeKubectl:
    def __init__(self, refuse: set[str] = frozenset()) -> None:
        self.calls: list[list[str]] = []
        self.refuse = refuse

    def __call__(self, argv: list[str], timeout: float) -> CommandResult:
        self.calls.append(argv)
        if argv[-1] in self.refuse:
            return CommandResult(1, "", f'Error from server (NotFound): nodes "{argv[-1]}"')
        return CommandResult(0, f"node/{argv[-1]} cordoned\n")

    @property
    def cordoned(self) -> list[str]:
        return [argv[-1] for argv in self.calls if "cordon" in argv]


def answers(count: int, failing: set[int], unreachable: set[int] = frozenset()):
    result = {}
    for i in range(1, count + 1):
        address = f"10.0.0.{10 + i}"
        if i in unreachable:
            result[address] = CommandResult(255, "", "ssh: connect to host: No route to host")
        elif i in failing:
            result[address] = CommandResult(6, FAILED)
        else:
            result[address] = CommandResult(0, HEALTHY)
    return result


@pytest.mark.parametrize(
    ("budget", "workers", "expected"),
    [("10%", 8, 1), ("10%", 10, 1), ("10%", 35, 3), ("50%", 10, 5), ("0%", 10, 1), ("4", 10, 4)],
)
def test_budget(budget, workers, expected):
    assert parse_budget(budget, workers) == expected


@pytest.mark.parametrize("budget", ["ten", "150%", "-1", "1.5"])
def test_bad_budget(budget):
    with pytest.raises(ValueError):
        parse_budget(budget, 10)


def test_mass_failure_cordons_only_the_budget(tmp_path):
    """Recordings (hand-written): 8 of 10 nodes report the Xid 79 node, 2 the healthy one."""
    loaded = load(write_cluster(tmp_path, 10))
    ssh, kubectl = FakeSsh(answers(10, failing=set(range(1, 9)))), FakeKubectl()
    report = run_fleet(
        loaded, sample=None, remote_command=REMOTE, budget="10%", cordon=True,
        kubeconfig=Path("/etc/kube/admin.conf"), ssh=ssh, kubectl=kubectl,
    )  # fmt: skip
    assert report.count("failed") == 8 and report.count("ok") == 2
    assert report.budget == 1
    assert len(kubectl.cordoned) == 1 == len(report.cordoned)
    assert kubectl.calls[0][:3] == ["kubectl", "--kubeconfig", "/etc/kube/admin.conf"]
    assert len(report.over_budget) == 7
    assert all(
        "budget of 1 spent" in o.cordon_note for o in report.hosts if o.host in report.over_budget
    )
    # Healthy nodes are never touched.
    assert not {"gpu-9", "gpu-10"} & set(kubectl.cordoned + report.over_budget)


def test_fleet_command_says_it_stopped_cordoning(tmp_path, monkeypatch):
    """Recordings (hand-written), through the real default runners: fake `ssh` and `kubectl`
    programs on PATH answer as 4 failing nodes and a cluster would."""
    cluster = write_cluster(tmp_path, 5)
    replies = tmp_path / "replies"
    replies.mkdir()
    for i in range(1, 6):
        (replies / f"10.0.0.{10 + i}").write_text(FAILED if i <= 4 else HEALTHY)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "kubectl.log"
    fake_ssh = f"""#!{sys.executable}
import sys
assert "StrictHostKeyChecking=yes" in sys.argv, sys.argv
text = open({str(replies)!r} + "/" + sys.argv[-2]).read()
sys.stdout.write(text)
sys.exit(6 if '"verdict": "failed"' in text else 0)
"""
    fake_kubectl = f"""#!{sys.executable}
import sys
open({str(log)!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
"""
    for name, text in (("ssh", fake_ssh), ("kubectl", fake_kubectl)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    result = CliRunner().invoke(
        app, ["health", "fleet", str(cluster), "--all", "--cordon", "--budget", "2"]
    )
    assert result.exit_code == ExitCode.UNHEALTHY, result.output
    cordons = [line for line in log.read_text().splitlines() if line.startswith("cordon")]
    assert len(cordons) == 2
    assert "budget of 2 spent: stopped cordoning" in result.stderr
    assert "2 failed node(s) left schedulable" in result.stderr

    as_json = CliRunner().invoke(
        app, ["health", "fleet", str(cluster), "--sample", "3", "--seed", "7", "--format", "json"]
    )
    data = json.loads(as_json.stdout)
    assert data["sampled"] == 3 and data["cordoned"] == [] and data["cordon"] is False


def test_unreachable_hosts_are_not_healthy(tmp_path):
    """Recordings (hand-written): 3 healthy nodes and one that ssh cannot reach."""
    loaded = load(write_cluster(tmp_path, 4))
    ssh = FakeSsh(answers(4, failing=set(), unreachable={2}))
    kubectl = FakeKubectl()
    report = run_fleet(
        loaded, sample=None, remote_command=REMOTE, budget="10%", cordon=True,
        ssh=ssh, kubectl=kubectl,
    )  # fmt: skip
    statuses = {o.host: o.status for o in report.hosts}
    assert statuses == {"gpu-1": "ok", "gpu-2": "unreachable", "gpu-3": "ok", "gpu-4": "ok"}
    assert "No route to host" in report.hosts[1].message
    # Unreachable is no evidence of a broken GPU: nothing is cordoned for it.
    assert kubectl.calls == []


def test_remote_error_without_a_report(tmp_path):
    loaded = load(write_cluster(tmp_path, 1))
    ssh = FakeSsh({"10.0.0.11": CommandResult(127, "", "bash: gpuinfra: command not found")})
    report = run_fleet(
        loaded, sample=None, remote_command=REMOTE, budget="1", cordon=False, ssh=ssh
    )
    assert report.hosts[0].status == "error"
    assert "command not found" in report.hosts[0].message


def test_ssh_command_line(tmp_path):
    loaded = load(write_cluster(tmp_path, 1))
    ssh = FakeSsh(answers(1, failing=set()))
    run_fleet(loaded, sample=None, remote_command=REMOTE, budget="1", cordon=False, ssh=ssh)
    # The command line itself is toolkit.remote's (tests/unit/test_remote.py).
    assert ssh.calls == [("gpu-1", REMOTE)]


def test_sample_is_random_distinct_and_repeatable(tmp_path):
    loaded = load(write_cluster(tmp_path, 20))

    def sampled(seed: int) -> list[str]:
        ssh = FakeSsh(answers(20, failing=set()))
        report = run_fleet(
            loaded, sample=5, remote_command=REMOTE, budget="1", cordon=False, seed=seed, ssh=ssh
        )
        return [o.host for o in report.hosts]

    first = sampled(1)
    assert len(first) == len(set(first)) == 5
    assert all(host.startswith("gpu-") for host in first)  # never the CPU worker
    assert sampled(1) == first
    assert any(sampled(seed) != first for seed in range(2, 6))


def test_refused_cordon_does_not_spend_the_budget(tmp_path):
    """Recordings (hand-written): two failing nodes, the API refuses to cordon the first."""
    loaded = load(write_cluster(tmp_path, 2))
    kubectl = FakeKubectl(refuse={"gpu-1"})
    report = run_fleet(
        loaded, sample=None, remote_command=REMOTE, budget="1", cordon=True,
        ssh=FakeSsh(answers(2, failing={1, 2})), kubectl=kubectl,
    )  # fmt: skip
    outcomes = {o.host: o for o in report.hosts}
    assert "kubectl cordon failed" in outcomes["gpu-1"].cordon_note
    assert report.cordoned == ["gpu-2"]
    assert report.over_budget == []


def test_fleet_needs_sample_or_all(tmp_path):
    cluster = write_cluster(tmp_path, 2)
    result = CliRunner().invoke(app, ["health", "fleet", str(cluster)])
    assert result.exit_code == ExitCode.BAD_INPUT
    both = CliRunner().invoke(app, ["health", "fleet", str(cluster), "--all", "--sample", "1"])
    assert both.exit_code == ExitCode.BAD_INPUT
    bad_budget = CliRunner().invoke(
        app, ["health", "fleet", str(cluster), "--all", "--budget", "lots"]
    )
    assert bad_budget.exit_code == ExitCode.BAD_INPUT
