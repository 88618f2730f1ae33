"""The cluster-wide apply lock (issue 13, defect 4), contended by real processes: exactly one
holds it, the others are refused naming the holder, and a crashed holder blocks nobody.

The inventory's hosts are loopback addresses where nothing listens for SSH; the refused applies
stop before contacting any host."""

from __future__ import annotations

import getpass
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from engine.applylock import LOCK_FILE, LockHeld, apply_lock, current_holder
from tests.unit.loopback import loopback_cluster

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()

# Takes the lock, says so (or says who refused it), and holds it until its stdin closes.
CONTENDER = """
import sys
from pathlib import Path
from engine.applylock import LockHeld, apply_lock
try:
    with apply_lock(Path(sys.argv[1]), sys.argv[2]):
        print("held", flush=True)
        sys.stdin.read()
except LockHeld as exc:
    print(f"refused {exc.holder.pid if exc.holder else None}", flush=True)
"""


def contender(state_dir: Path, command: str = "holder-command") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CONTENDER, str(state_dir), command],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def holder(tmp_path):
    """A live process holding the lock of tmp_path/loop/.state."""
    cluster = loopback_cluster(tmp_path / "loop")
    process = contender(cluster / ".state")
    assert process.stdout.readline().strip() == "held"
    yield cluster, process
    process.stdin.close()
    process.wait()


def test_two_processes_started_together_exactly_one_holds(tmp_path):
    processes = [contender(tmp_path / ".state", f"apply-{i}") for i in range(2)]
    first_lines = [p.stdout.readline().split() for p in processes]
    winners = [p for p, line in zip(processes, first_lines, strict=True) if line == ["held"]]
    losers = [line for line in first_lines if line[0] == "refused"]
    assert len(winners) == 1 and len(losers) == 1, first_lines
    assert losers[0][1] == str(winners[0].pid)  # the refused one names the holder's pid
    for process in processes:
        process.stdin.close()
        process.wait()


def test_cli_apply_exits_with_the_lock_code_naming_the_holder(holder):
    cluster, process = holder
    result = runner.invoke(app, ["apply", str(cluster), "--yes"])
    assert result.exit_code == ExitCode.LOCKED == 8, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"pid {process.pid}" in lines[0] and "holder-command" in lines[0]
    assert f"{getpass.getuser()}@{socket.gethostname()}" in lines[0]
    assert "Traceback" not in result.output


def test_lock_is_released_at_exit(holder, tmp_path):
    cluster, process = holder
    process.stdin.close()
    process.wait()
    with apply_lock(cluster / ".state", "next") as held:
        assert held.taken_over is None  # released cleanly: no record left
    assert current_holder(cluster / ".state") is None


def test_a_crashed_holder_blocks_nobody(tmp_path):
    process = contender(tmp_path / ".state")
    assert process.stdout.readline().strip() == "held"
    process.kill()  # SIGKILL: no chance to release; the kernel drops the flock
    process.wait()
    assert current_holder(tmp_path / ".state") is None  # its pid is gone: nobody holds it
    with apply_lock(tmp_path / ".state", "next") as held:
        assert held.taken_over is not None and held.taken_over.pid == process.pid


def test_break_lock_refuses_while_a_live_process_holds_it(holder):
    cluster, process = holder
    with pytest.raises(LockHeld) as refused, apply_lock(cluster / ".state", break_lock=True):
        pass
    assert refused.value.holder.pid == process.pid
    result = runner.invoke(app, ["apply", str(cluster), "--yes", "--break-lock"])
    assert result.exit_code == ExitCode.LOCKED


def test_record_from_another_controller_needs_break_lock(tmp_path):
    state = tmp_path / ".state"
    state.mkdir()
    record = {
        "user": "ops",
        "controller": "another-controller",
        "pid": 4242,
        "started": "2026-11-23T09:00:00+00:00",
        "command": "gpuinfra apply x",
    }
    (state / LOCK_FILE).write_text(json.dumps(record))
    with pytest.raises(LockHeld, match="--break-lock"), apply_lock(state):
        pass
    with apply_lock(state, break_lock=True) as held:
        assert held.taken_over.controller == "another-controller"


def test_plan_and_drift_say_when_an_apply_holds_the_lock(holder):
    from inventory.loader import load
    from roles.dns.secrets import tsig_secret
    from roles.etcd.pki import ensure_pki
    from roles.loadbalancer.config import LoadBalancerConfig
    from roles.loadbalancer.files import vrrp_password

    cluster, process = holder
    loaded = load(cluster)
    ensure_pki(loaded)
    tsig_secret(loaded.state_dir)
    vrrp_password(loaded, LoadBalancerConfig())
    args = ["--limit", "cpu-1", "--connect-timeout", "2", "--format", "json"]
    for command in ("plan", "drift"):
        result = runner.invoke(app, [command, str(cluster), *args])
        assert "an apply is running on this cluster" in result.stderr, result.output
        assert f"pid {process.pid}" in result.stderr
        # Neither takes the lock: the holder still holds it.
        assert current_holder(cluster / ".state").pid == process.pid


def _record(**changes) -> dict:
    from engine.applylock import boot_id, machine_id

    return {
        "user": "ops",
        "controller": socket.gethostname(),
        "pid": 1,  # alive: init
        "started": "2026-11-23T09:00:00+00:00",
        "command": "gpuinfra apply x",
        "machine_id": machine_id(),
        "boot_id": boot_id(),
    } | changes


@pytest.fixture
def identity(tmp_path, monkeypatch):
    """This machine's id and boot id, from files the test writes."""
    from engine import applylock

    (tmp_path / "machine-id").write_text("a" * 32 + "\n")
    (tmp_path / "boot_id").write_text("boot-now\n")
    monkeypatch.setattr(applylock, "MACHINE_ID_FILES", (str(tmp_path / "machine-id"),))
    monkeypatch.setattr(applylock, "BOOT_ID_FILE", str(tmp_path / "boot_id"))


def test_the_record_names_the_machine_not_only_the_host_name(identity, tmp_path):
    with apply_lock(tmp_path / ".state", "gpuinfra apply x") as held:
        record = json.loads((tmp_path / ".state" / LOCK_FILE).read_text())
        assert record["machine_id"] == "a" * 32 and record["boot_id"] == "boot-now"
        assert record["controller"] == socket.gethostname()
        assert f"(machine {'a' * 12})" in held.holder.describe()


def test_same_host_name_on_another_machine_is_another_controller(identity, tmp_path):
    """Two containers or cloned VMs share a host name: a record from the other one names a pid
    this machine cannot judge, so it is not taken over without --break-lock."""
    state = tmp_path / ".state"
    state.mkdir()
    # Control: the same machine's record of a process that has ended is taken over.
    (state / LOCK_FILE).write_text(json.dumps(_record(pid=2**22 + 1)))
    assert current_holder(state) is None
    with apply_lock(state) as held:
        assert held.taken_over.pid == 2**22 + 1
    (state / LOCK_FILE).write_text(json.dumps(_record(machine_id="b" * 32, pid=2**22 + 1)))
    assert current_holder(state) is not None  # pid 2**22 + 1 here says nothing about there
    with pytest.raises(LockHeld, match="another controller.*--break-lock"), apply_lock(state):
        pass
    with apply_lock(state, break_lock=True) as held:
        assert held.taken_over.machine_id == "b" * 32


def test_a_record_from_before_this_machines_boot_holds_nothing(identity, tmp_path):
    state = tmp_path / ".state"
    state.mkdir()
    # Control: pid 1 runs, so this boot's record of it is a live holder.
    (state / LOCK_FILE).write_text(json.dumps(_record()))
    assert current_holder(state).pid == 1
    # The same pid before the last boot: that process has ended, whatever runs as pid 1 now.
    (state / LOCK_FILE).write_text(json.dumps(_record(boot_id="boot-before")))
    assert current_holder(state) is None


def test_a_record_without_a_machine_id_is_judged_by_host_name(identity, tmp_path):
    """Records written before the machine id was kept still parse and still block."""
    state = tmp_path / ".state"
    state.mkdir()
    old = _record()
    del old["machine_id"], old["boot_id"]
    (state / LOCK_FILE).write_text(json.dumps(old))
    assert current_holder(state).pid == 1
    (state / LOCK_FILE).write_text(json.dumps(old | {"controller": "elsewhere"}))
    with pytest.raises(LockHeld, match="--break-lock"), apply_lock(state):
        pass
