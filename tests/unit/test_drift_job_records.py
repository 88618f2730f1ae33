"""The drift Job's records (docs/design/fleet-jobs.md step 3): a probe installed per recorded
host, its answer's digest kept, nothing of it in records while the Job is off."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from engine.context import host_context, load
from engine.fingerprint import Record, load_record, output_digest, save_record
from engine.fingerprint.installed import checked_digest, install_probes, installed_probe
from engine.fingerprint.probe import file_fact_text
from engine.fingerprint.recording import drift_job_enabled
from roles.drift_job import deploy as drift_deploy
from tests.helpers import files_of
from tests.unit.conftest import SAMPLE
from toolkit import driftprobe
from toolkit.remote import RemoteResult

MARKER = "gpuinfra-fingerprint-0123456789abcdef"
TODAY = [
    "format",
    "key",
    "roles",
    "commands",
    "operations",
    "notes",
    "reboot_required",
    "parts",
    "inputs",
    "valid_until",
]


def record(marker: str = MARKER, **changes) -> Record:
    fields = {
        "key": "k",
        "roles": ("base",),
        "commands": (
            ("echo hello", (0,), output_digest(["hello"])),
            ("printf 'a\\nb\\n'", (0,), output_digest(["a", "b"])),
        ),
        "operations": (("base", "Write /etc/hosts"),),
        "marker": marker,
    }
    return Record(**{**fields, **changes})


def test_without_the_job_a_record_is_written_as_before():
    """Dormant: no marker, no digest, the same fields in the same order and format as main."""
    data = json.loads(record(marker="").to_json())
    assert list(data) == TODAY and data["format"] == 2
    assert Record.from_json(record(marker="").to_json()) == record(marker="")


def test_the_jobs_fields_are_kept_and_read_back():
    kept = record(probe_digest="d" * 64)
    assert json.loads(kept.to_json())["probe_digest"] == "d" * 64
    assert Record.from_json(kept.to_json()) == kept


def test_the_sample_inventory_does_not_enable_the_job():
    assert drift_job_enabled(load(SAMPLE / "cluster.yml")) is False


def local_host(motd: bytes = b"", fail: int = 0, tamper: bool = False):
    """A stand-in for run_remote that runs the probe here (as the installed wrapper would,
    minus the move into /var/lib), with what an sshrc or motd prints before it."""
    seen: list[tuple[str, bytes]] = []

    def runner(loaded, host, command, *, timeout, stdin=None):
        seen.append((command, stdin))
        if fail:
            return RemoteResult(host, fail, "", "Permission denied (publickey)")
        script = stdin.replace(b"echo hello", b"echo bye") if tamper else stdin
        done = subprocess.run(["sh"], input=script, capture_output=True, check=False)
        return RemoteResult(host, done.returncode, (motd + done.stdout).decode())

    runner.seen = seen
    return runner


def sample_in(folder: Path):
    """The sample inventory with its state in `folder` (state_dir is derived from base_dir):
    records written by a test stay out of the checkout's inventory/sample."""
    (folder / ".state").mkdir(mode=0o700)
    return load(SAMPLE / "cluster.yml").model_copy(update={"base_dir": folder})


def save(loaded, name="cpu-1", **changes) -> Record:
    kept = record(**changes)
    save_record(loaded.state_dir, name, kept)
    return kept


def test_the_digest_is_the_answers_output_digest_whatever_the_login_printed(tmp_path: Path):
    loaded = sample_in(tmp_path)
    name = next(iter(loaded.cluster.hosts))
    save(loaded, name)
    runner = local_host(motd=b"Welcome to Ubuntu\nhello\n")
    assert install_probes(loaded, [name], runner) == {}
    command, script = runner.seen[0]
    assert command == driftprobe.install_command(len(script))
    kept = load_record(loaded.state_dir, name)
    answer = subprocess.run(["sh"], input=script, capture_output=True).stdout
    lines = answer.decode().split("\n")[1:]  # after the begin line
    assert kept.probe_digest == output_digest(lines) == driftprobe.answer_digest(answer)
    assert kept.marker == MARKER and kept.commands == record().commands


def test_a_failed_install_leaves_no_digest(tmp_path: Path):
    loaded = sample_in(tmp_path)
    name = next(iter(loaded.cluster.hosts))
    save(loaded, name, probe_digest="old")
    failed = install_probes(loaded, [name], local_host(fail=255))
    assert "install failed" in failed[name]
    assert load_record(loaded.state_dir, name).probe_digest == ""


def test_an_answer_unlike_the_record_leaves_no_digest(tmp_path: Path):
    loaded = sample_in(tmp_path)
    name = next(iter(loaded.cluster.hosts))
    save(loaded, name)
    failed = install_probes(loaded, [name], local_host(tamper=True))
    assert failed[name] == "its answer differs from its record (command 0 printed something else)"
    assert load_record(loaded.state_dir, name).probe_digest == ""


def test_no_begin_line_is_no_answer():
    assert checked_digest(record(), b"hello\n") == (None, "the probe did not answer")
    assert driftprobe.answer_digest(b"motd only\n") is None


def test_access_times_are_masked_in_the_digest():
    line = "user=root group=root mode=-rwxr-xr-x atime={} mtime=1 ctime=1 size=3 '/x'"
    one = f"{driftprobe.BEGIN}\n{line.format(100)}\n".encode()
    two = f"{driftprobe.BEGIN}\n{line.format(200)}\n".encode()
    assert driftprobe.answer_digest(one) == driftprobe.answer_digest(two)


def test_the_probe_runs_in_a_fixed_environment_from_root():
    """Not the login's HOME, umask, LANG or working folder."""
    wrapper = driftprobe.wrapper_text()
    assert "cd / && umask 022 && exec env -i HOME=/ PATH=" in wrapper
    assert "LC_ALL=C" in wrapper and "</dev/null" in wrapper
    staged = f"{driftprobe.PROBE_DIR}/probe.sh.new"
    assert driftprobe.run_command(staged) in driftprobe.install_command(10)
    assert installed_probe("h", record()).startswith(b"#!/bin/sh\n")


# -- H1: the probe and its folder leave the host's fingerprint alone ---------------------------


def asked_paths(loaded, name: str) -> set[str]:
    """Every path a fact of the drift_job deploy asks about on `name`, and every managed path."""
    asked: set[str] = set()

    class Facts:
        def get_fact(self, fact, **arguments):
            asked.update(str(v) for v in arguments.values() if str(v).startswith("/"))

        def noop(self, message):
            pass

    from pyinfra.context import ctx_host

    from toolkit import operations

    ctx = host_context(loaded, name)
    with ctx_host.use(Facts()):
        for managed in drift_deploy.managed_files(ctx):
            list(operations.put_checked._inner(content=managed.content, dest=managed.path))
        asked.update(files_of(loaded, name))
    return asked


def test_no_fact_or_managed_file_touches_the_probe_or_its_folder(small_cluster, load_small):
    """H1: a probe folder managed by files.directory had its mtime move with every install,
    so no host kept the fast path. The folder is made by the install command only, and no
    role manages or asks about it or the folder it is in."""
    small_cluster["group_vars"] = {"all": {"drift_job": {"enabled": True, "nodes": ["cpu-1"]}}}
    loaded = load_small()
    parent = str(Path(driftprobe.PROBE_DIR).parent)
    for name in loaded.cluster.hosts:
        for path in asked_paths(loaded, name):
            assert not path.startswith(driftprobe.PROBE_DIR), path
            assert path != parent, path
    roots = [Path(__file__).resolve().parents[2] / folder for folder in ("roles", "toolkit")]
    probe_dir = re.compile(re.escape(driftprobe.PROBE_DIR) + "|PROBE_DIR")
    users = {
        str(path.relative_to(roots[0].parent))
        for root in roots
        for path in root.rglob("*.py")
        if probe_dir.search(path.read_text())
    }
    # The role names it only to remove it (remove: true, a phase of its own).
    assert users == {"toolkit/driftprobe.py", "roles/drift_job/deploy.py"}
    import inspect

    source = Path(drift_deploy.__file__).read_text()
    assert source.count("PROBE_DIR") == inspect.getsource(drift_deploy.removed).count("PROBE_DIR")


def test_the_recorded_commands_never_name_the_probe():
    """What the installed probe file is never asked about, so rewriting it moves nothing."""
    assert driftprobe.PROBE_FILE not in file_fact_text(driftprobe.WRAPPER)


def test_an_apply_installs_the_probes_only_with_the_job(tmp_path: Path, monkeypatch):
    """With the Job: each kept record has a marker and its probe is installed, after the
    records are kept. Without (the control, every inventory today): neither."""
    import engine.context
    import engine.fingerprint.installed
    from engine.fingerprint import recording
    from engine.reports import HostReport, Mode, RunOptions, RunReport
    from tests.unit.loopback import loopback_cluster

    loaded = load(loopback_cluster(tmp_path / "c"))
    loaded.state_dir.mkdir(mode=0o700)
    contexts = {
        ctx.name: ctx for ctx in engine.context.host_contexts(loaded) if ctx.name == "cpu-1"
    }
    asked = {"cpu-1": (("echo cpu-1", (0,), output_digest(["cpu-1"])),)}
    installed: list[list[str]] = []
    monkeypatch.setattr(
        engine.fingerprint.installed,
        "install_probes",
        lambda loaded, hosts: installed.append(list(hosts)) or {},
    )

    def no_check(options: RunOptions) -> RunReport:
        raise AssertionError("no host changed: there is nothing to check again")

    def apply() -> Record:
        report = RunReport(cluster="loop", mode=Mode.apply, hosts={"cpu-1": HostReport("cpu-1")})
        recording.record_converged(
            loaded, RunOptions(mode=Mode.apply), report, asked, contexts, check=no_check
        )
        return load_record(loaded.state_dir, "cpu-1")

    assert recording.drift_job_enabled(loaded) is False
    assert apply().marker == "" and installed == []
    assert list(json.loads(apply().to_json())) == TODAY
    monkeypatch.setattr(recording, "drift_job_enabled", lambda loaded: True)
    assert apply().marker.startswith("gpuinfra-fingerprint-")
    assert installed == [["cpu-1"]]
