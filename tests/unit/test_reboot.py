"""Rolling reboots, with SSH replaced by a script of answers (no hosts in unit tests)."""

from __future__ import annotations

from engine.reboot import BOOT_MARKER, Rebooter
from toolkit.remote import RemoteResult


class ScriptedSsh:
    """Answers each host's probes from a list, like a host going down and booting again."""

    def __init__(self, probes: dict[str, list[tuple[int, str]]]):
        self.probes = probes
        self.commands: list[tuple[str, str]] = []

    def __call__(self, loaded, host: str, command: str, timeout: float) -> RemoteResult:
        ip = address(loaded, host)
        self.commands.append((ip, command))
        if "is-system-running" in command:
            code, out = self.probes[ip].pop(0) if self.probes[ip] else (255, "")
            return RemoteResult(host, code, out)
        if command == "systemctl reboot":
            return RemoteResult(host, 255, "", "connection closed")
        return RemoteResult(host, 0, "")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def rebooter(loaded, ssh, timeout=60.0) -> Rebooter:
    clock = Clock()
    return Rebooter(loaded, timeout=timeout, run=ssh, sleep=clock.sleep, clock=clock)


def address(loaded, host: str) -> str:
    return str(loaded.cluster.hosts[host].address)


def test_a_host_is_back_when_the_marker_is_gone_and_systemd_booted(loaded):
    ip = address(loaded, "cpu-1")
    ssh = ScriptedSsh({ip: [(0, "pending"), (255, ""), (1, "starting"), (1, "degraded")]})
    outcome = rebooter(loaded, ssh).reboot("cpu-1")
    assert outcome.ok, outcome.error
    commands = [command for _, command in ssh.commands]
    assert commands[0] == f"touch {BOOT_MARKER}"
    assert commands[1] == "systemctl reboot"
    assert commands[-1] == "rm -f /run/reboot-required /run/reboot-required.pkgs"


def test_a_host_that_does_not_come_back_fails_with_its_last_state(loaded):
    ssh = ScriptedSsh({address(loaded, "cpu-1"): []})
    outcome = rebooter(loaded, ssh, timeout=10).reboot("cpu-1")
    assert not outcome.ok
    assert "not back within 10 s (last state: unreachable)" in outcome.error


def test_a_failed_batch_stops_the_rollout(loaded):
    booted = [(1, "running")]
    ssh = ScriptedSsh(
        {
            address(loaded, "cpu-1"): list(booted),
            address(loaded, "gpu-1"): [],  # never comes back
            address(loaded, "cp-1"): list(booted),
        }
    )
    outcomes = rebooter(loaded, ssh, timeout=10).rolling([["cpu-1"], ["gpu-1"], ["cp-1"]])
    assert [(o.host, o.ok) for o in outcomes] == [("cpu-1", True), ("gpu-1", False)]
    assert not any(a == address(loaded, "cp-1") for a, _ in ssh.commands)


def test_apply_reboot_updates_the_report(small_cluster, write_cluster, monkeypatch):
    """`apply --reboot`: only converged hosts that wait for a reboot are rebooted, one at a
    time by default; one that does not come back fails the run, the rest keep their flag."""
    from cli import engine
    from cli.output import exit_code
    from engine import reboot
    from engine.reports import HostReport, HostStatus, Mode, RunReport

    seen: list[list[str]] = []

    class FakeRebooter:
        def __init__(self, loaded):
            pass

        def rolling(self, batches):
            seen.extend(batches)
            return [
                reboot.RebootOutcome("cpu-1", True, 3.0),
                reboot.RebootOutcome("gpu-1", False, 9.0, "not back"),
            ]

    monkeypatch.setattr(reboot, "Rebooter", FakeRebooter)
    report = RunReport("small", Mode.apply)
    report.hosts = {
        "cpu-1": HostReport("cpu-1", HostStatus.changed, reboot_required=True),
        "gpu-1": HostReport("gpu-1", HostStatus.ok, reboot_required=True),
        "cp-1": HostReport("cp-1", HostStatus.ok, reboot_required=True),
        "cp-2": HostReport("cp-2", HostStatus.failed, reboot_required=True),
        "etcd-1": HostReport("etcd-1", HostStatus.ok),
    }
    engine._reboot(write_cluster(small_cluster), report, None)
    assert seen == [["cpu-1"], ["gpu-1"], ["cp-1"]]
    assert report.hosts["cpu-1"].reboot_required is False
    assert report.hosts["gpu-1"].status is HostStatus.failed
    assert report.hosts["gpu-1"].error == "reboot: not back"
    assert report.hosts["cp-1"].reboot_required is True
    assert "still waiting for a reboot: gpu-1, cp-1" in report.notes
    assert exit_code(report) == 1
