"""The drift fast path (engine/fingerprint/): the batched answers are the single commands'
answers, the key moves with everything a deploy is given, and nothing but atime is compared
loosely. Commands run with this machine's own shell and coreutils, as a host runs them."""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from pyinfra.api import StringCommand
from pyinfra.connectors.util import make_unix_command
from pyinfra.facts.files import File, Sha1File
from pyinfra.facts.systemd import SystemdStatus

import engine.context
from engine import fingerprint
from engine.context import host_context, host_files, load
from engine.factcache import _fact_command
from engine.fingerprint import Record
from roles.etcd.pki import pki_dir
from tests.unit.loopback import loopback_cluster
from toolkit import clock
from toolkit.effective import UnitDropIns
from toolkit.facts import UnitState

REPO = Path(__file__).resolve().parents[2]


def sent(cls, **kwargs) -> str:
    """The text pyinfra's SSH connector sends for a fact with no connector arguments."""
    return make_unix_command(StringCommand(_fact_command(cls, kwargs))).get_raw_value()


@pytest.mark.parametrize(
    ("cls", "kwargs", "kind", "text"),
    [
        (File, {"path": "/etc/hosts"}, "stat", fingerprint.file_fact_text),
        (Sha1File, {"path": "/etc/ssh/sshd_config.d/50-gpuinfra.conf"}, "sha1", None),
        (SystemdStatus, {"services": "chrony.service"}, "status", None),
        (UnitState, {"unit": "etcd-backup.timer"}, "unit", None),
        (UnitDropIns, {"units": ("etcd-backup.timer", "etcd.service")}, "dropins", None),
    ],
)
def test_each_group_recognises_exactly_the_text_its_fact_sends(cls, kwargs, kind, text):
    command = sent(cls, **kwargs)
    name = next(iter(kwargs.values()))
    name = " ".join(name) if isinstance(name, tuple) else name
    assert fingerprint.grouped(command) == (kind, name)
    # One character more or less and the command is run as it is, not grouped.
    assert fingerprint.grouped(command.replace("2>", "2 >", 1)) is None
    assert fingerprint.grouped(command + " ") is None


def test_a_path_with_shell_characters_is_never_grouped():
    assert fingerprint.grouped(sent(File, path="/tmp/a b")) is None
    assert fingerprint.grouped(sent(File, path="/tmp/$(x)")) is None


def run_probe(commands: list[str]) -> dict[int, tuple[int, list[str]]]:
    marker = "m-test"
    script = fingerprint.probe_script(commands, marker)
    output = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True).stdout
    return fingerprint.read_probe(output, marker, commands)


def alone(command: str) -> tuple[int, list[str]]:
    result = subprocess.run(["sh", "-c", command], capture_output=True, stdin=subprocess.DEVNULL)
    return result.returncode, result.stdout.decode().splitlines()


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    (tmp_path / "plain").write_text("plain\n")
    (tmp_path / "secret").write_text("k")
    (tmp_path / "secret").chmod(0o600)
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "plain")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    return {p.name: p for p in tmp_path.iterdir()} | {"missing": tmp_path / "missing"}


def test_batched_file_facts_answer_what_each_command_prints_alone(files):
    commands = [sent(File, path=str(path)) for path in files.values()]
    commands += [sent(Sha1File, path=str(files[n])) for n in ("plain", "secret", "missing")]
    commands.append("echo raw; exit 4")
    answers = run_probe(commands)
    assert sorted(answers) == list(range(len(commands)))
    for index, command in enumerate(commands):
        assert without_atime(answers[index]) == without_atime(alone(command)), command
    assert answers[len(commands) - 1] == (4, ["raw"])


def without_atime(answer: tuple[int, list[str]]) -> tuple[int, list[str]]:
    """The batch's own Sha1File reads a file, which may move its access time (relatime) before
    the same File fact runs alone: the one field a read changes, so compared without it."""
    status, lines = answer
    return status, [re.sub(r"atime=\d+ ", "atime=* ", line) for line in lines]


def stand_in_systemctl(folder: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """A `systemctl` on PATH that runs `script` (sh): this machine has no systemd to ask."""
    systemctl = folder / "systemctl"
    systemctl.write_text(script)
    systemctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


def test_a_unit_named_with_and_without_its_suffix_is_asked_once(tmp_path, monkeypatch):
    """The unit facts of `docker` and `docker.service` (the roles' and pyinfra's names of one
    unit) are answered from one block, each fact its own properties, with a stand-in for
    `systemctl` that prints what systemctl prints (one block per unit asked, properties in
    systemd's order, a blank line between units: this machine has no systemd to ask; the lab's
    drift test compares the answers with each command run alone on real hosts) and logs what it
    was asked."""
    log = tmp_path / "asked"
    stand_in_systemctl(
        tmp_path,
        monkeypatch,
        '#!/bin/sh\nshift 3\necho "$*" > ' + str(log) + "\nfirst=1\n"
        'for u in "$@"; do [ $first = 1 ] || echo; first=0; case $u in *.*) id=$u;; '
        "*) id=$u.service;; esac\n"
        'printf "Id=%s\\nLoadState=loaded\\nActiveState=active\\nSubState=running\\n'
        'UnitFileState=enabled\\n" "$id"; done\n',
    )
    commands = [
        sent(UnitState, unit="docker"),
        sent(UnitState, unit="etcd-backup.timer"),
        sent(SystemdStatus, services="docker.service"),
        sent(SystemdStatus, services="chrony.service"),
    ]
    answers = run_probe(commands)
    assert log.read_text().split() == ["docker.service", "etcd-backup.timer", "chrony.service"]
    unit = ["LoadState=loaded", "ActiveState=active", "UnitFileState=enabled"]
    assert answers == {
        0: (0, unit),
        1: (0, unit),
        2: (0, ["Id=docker.service", "SubState=running"]),
        3: (0, ["Id=chrony.service", "SubState=running"]),
    }


def test_a_property_no_fact_reads_is_not_in_the_answer(tmp_path, monkeypatch):
    """systemctl shows every asked property of every unit: a timer asked only for its state
    shows its SubState too, `running` while its service runs (CI of 02d9804: an etcd member's
    hourly backup). That line is no fact's, so it is not in the answer, whose digest the drift
    Job's shards compare; the SubState a status fact reads still is (the control)."""
    states = tmp_path / "states"
    stand_in_systemctl(
        tmp_path,
        monkeypatch,
        "#!/bin/sh\nwhile case $1 in show|-*) true;; *) false;; esac; do shift; done\n"
        f". {states}\nfirst=1\n"
        'for u in "$@"; do [ $first = 1 ] || echo; first=0; case $u in '
        "*.timer) sub=$timer;; *) sub=$service;; esac\n"
        'printf "Id=%s\\nLoadState=loaded\\nActiveState=active\\nSubState=%s\\n'
        'UnitFileState=enabled\\nDropInPaths=\\n" "$u" "$sub"; done\n',
    )
    commands = [
        sent(UnitState, unit="etcd-backup.timer"),
        sent(SystemdStatus, services="etcd.service"),
        sent(UnitDropIns, units=("etcd.service",)),
    ]
    script = fingerprint.probe_script(commands, "m-test")

    def answer(timer: str, service: str) -> bytes:
        states.write_text(f"timer={timer}\nservice={service}\n")
        return subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True).stdout

    waiting = answer("waiting", "running")
    assert b"SubState=waiting" not in waiting and b"SubState=running" in waiting
    assert answer("running", "running") == waiting
    assert answer("waiting", "exited") != waiting
    assert fingerprint.read_probe(waiting, "m-test", commands) == {
        0: (0, ["LoadState=loaded", "ActiveState=active", "UnitFileState=enabled"]),
        1: (0, ["Id=etcd.service", "SubState=running"]),
        2: (0, ["unit etcd.service", "load loaded"]),
    }


def test_the_drop_in_facts_of_all_roles_are_one_systemctl_show(tmp_path, monkeypatch):
    """Each role asks about its own units' drop-ins; the probe asks systemd once for every unit
    (a unit two roles ask about once) and gives each fact what it prints alone: a stand-in
    `systemctl` prints what systemctl show prints (a block per unit, properties in systemd's
    order, a blank line between units; not-found for a unit that does not exist) and logs each
    call."""
    ours, other = tmp_path / "10-gpuinfra.conf", tmp_path / "99-admin.conf"
    ours.write_text("# Managed by gpuinfra (role etcd)\n[Service]\n")
    other.write_text("[Service]\nNice=5\n")
    log = tmp_path / "asked"
    stand_in_systemctl(
        tmp_path,
        monkeypatch,
        "#!/bin/sh\nwhile case $1 in show|-*) true;; *) false;; esac; do shift; done\n"
        'echo "$*" >> ' + str(log) + "\nfirst=1\n"
        'for u in "$@"; do [ $first = 1 ] || echo; first=0; case $u in '
        f'etcd.service) printf "Id=%s\\nLoadState=loaded\\nDropInPaths={ours} {other}\\n" "$u";; '
        'gone.service) printf "Id=%s\\nLoadState=not-found\\nDropInPaths=\\n" "$u";; '
        '*) printf "Id=%s\\nLoadState=loaded\\nDropInPaths=\\n" "$u";; esac; done\n',
    )
    commands = [
        sent(UnitDropIns, units=("etcd-backup.timer", "etcd.service")),
        sent(UnitDropIns, units=("chrony.service", "etcd.service", "gone.service")),
    ]
    answers = run_probe(commands)
    assert log.read_text().splitlines() == [
        "etcd-backup.timer etcd.service chrony.service gone.service"
    ]
    for index, command in enumerate(commands):
        assert answers[index] == alone(command), command
    assert answers[1][1] == [
        "unit chrony.service", "load loaded",
        "unit etcd.service", "load loaded", f"ours {ours}", f"other {other}",
        "unit gone.service", "load not-found",
    ]  # fmt: skip


def test_a_group_that_does_not_add_up_answers_none_of_its_commands(files):
    """sha1sum cannot hash a directory: the group's answer is short by one line, so none of its
    commands is answered and the host goes to the exact check (never a guessed answer)."""
    commands = [sent(Sha1File, path=str(files[n])) for n in ("plain", "dir")]
    commands.append(sent(File, path=str(files["plain"])))
    answers = run_probe(commands)
    assert 0 not in answers and 1 not in answers
    # The other group is answered (its stat line compared without the access time, which the
    # group's own sha1sum of the file may move: see without_atime).
    assert without_atime(answers[2]) == without_atime(alone(commands[2]))


def test_only_the_access_time_is_compared_loosely():
    line = "user=root group=root mode=-rw-r--r-- atime=100 mtime=200 ctime=300 size=5 '/etc/x'"
    digest = fingerprint.output_digest([line])
    assert fingerprint.output_digest([line.replace("atime=100", "atime=999")]) == digest
    assert fingerprint.output_digest([line.replace("mtime=200", "mtime=201")]) != digest
    assert fingerprint.output_digest([line.replace("mode=-rw-r--r--", "mode=-rw-------")]) != (
        digest
    )
    # Outside stat's line shape, "atime=" is text like any other.
    assert fingerprint.output_digest(["atime=1"]) != fingerprint.output_digest(["atime=2"])


def test_a_directorys_times_and_size_are_masked_its_mode_and_owner_are_not():
    """A file written into a directory moves the directory's mtime, ctime and size (seen on a
    GPU worker: the health gate writes its textfile after the apply recorded the directory);
    files.directory sets only mode, user and group, so those alone are compared."""
    line = "user=root group=root mode=drwxr-xr-x atime=1 mtime=2 ctime=3 size=4096 '/var/lib/x'"
    digest = fingerprint.output_digest([line])
    moved = line.replace("mtime=2 ctime=3 size=4096", "mtime=9 ctime=9 size=8192")
    assert fingerprint.output_digest([moved]) == digest
    for old, new in [("root", "nobody"), ("drwxr-xr-x", "drwx------"), ("/x", "/y")]:
        assert fingerprint.output_digest([line.replace(old, new, 1)]) != digest, new
    # A file's own times and size stay compared.
    file_line = line.replace("mode=d", "mode=-")
    assert fingerprint.output_digest([file_line]) != fingerprint.output_digest(
        [file_line.replace("size=4096", "size=8192")]
    )


def test_no_operation_of_the_roles_sets_or_reads_access_times():
    """Why atime (and a directory's mtime) may be masked: a deploy that passed `atime` or
    `mtime` to pyinfra's files.file (the only operation that reads them) would decide from it."""
    found = [
        str(path.relative_to(REPO))
        for path in (REPO / "roles").rglob("*.py")
        if path.name != "fingerprint.py" and re.search(r"\b[am]time\b", path.read_text())
    ]
    assert found == []


def test_differences_name_failed_missing_and_changed_answers():
    record = Record(
        key="k",
        roles=("base",),
        commands=(
            ("a", (0,), fingerprint.output_digest(["x"])),
            ("b", (0, 1), fingerprint.output_digest([])),
            ("c", (0,), fingerprint.output_digest(["y"])),
        ),
        operations=(),
    )
    assert fingerprint.differences(record, {0: (0, ["x"]), 1: (1, []), 2: (0, ["y"])}) == []
    found = fingerprint.differences(record, {0: (0, ["x2"]), 1: (2, [])})
    assert found == [
        "command 0 printed something else",
        "command 1 exited 2",
        "no answer to command 2",
    ]


def test_a_record_reads_back_and_another_format_is_ignored(tmp_path):
    record = Record(
        key="k",
        roles=("base", "kernel"),
        commands=(("sh -c 'uname -n'", (0,), "d"),),
        operations=(("base", "Write /etc/hosts"),),
        notes=("chrony: skipped in a container",),
        reboot_required=True,
        parts=("a", "b", "c"),
        inputs="i",
        valid_until=1.5,
    )
    fingerprint.save_record(tmp_path, "h1", record)
    assert fingerprint.load_record(tmp_path, "h1") == record
    path = fingerprint.record_path(tmp_path, "h1")
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_bytes(path.read_bytes().replace(b'"format": 2', b'"format": 1'))
    assert fingerprint.load_record(tmp_path, "h1") is None
    path.write_text("{not json")
    assert fingerprint.load_record(tmp_path, "h1") is None
    assert fingerprint.load_record(tmp_path, "h2") is None


def key_of(cluster: Path, host: str = "cpu-1") -> str:
    loaded = load(cluster)
    return fingerprint.host_key(host_context(loaded, host), fingerprint.common_digest(loaded))


def test_the_key_moves_with_the_inventory_and_the_state_not_with_locks_or_records(tmp_path):
    cluster = loopback_cluster(tmp_path / "c")
    first = key_of(cluster)
    assert key_of(cluster) == first
    state = cluster / ".state"
    state.mkdir(mode=0o700)
    (state / "apply.lock").write_text("pid 1")
    (state / ".lock").touch()
    fingerprint.save_record(state, "cpu-1", Record("k", (), (), ()))
    assert key_of(cluster) == first
    (state / "dns").mkdir()
    (state / "dns" / "serials.json").write_text("{}")
    assert key_of(cluster) != first
    (state / "dns" / "serials.json").unlink()
    assert key_of(cluster) == first
    text = (cluster / "cluster.yml").read_text()
    (cluster / "cluster.yml").write_text(text.replace("name: loop", "name: loop2", 1))
    assert key_of(cluster) != first


def test_a_new_etcd_snapshot_moves_no_hosts_key(tmp_path, monkeypatch):
    """`gpuinfra etcd snapshot` keeps its copies under `.state/` by default, and no deploy reads
    them: a new one (hundreds of MiB on a big cluster) must not send every host to the exact
    check, nor be hashed by every drift."""
    from typer.testing import CliRunner

    import day2.etcd
    from cli.main import app

    cluster = loopback_cluster(tmp_path / "c")
    names = list(load(cluster).cluster.hosts)
    for name in names:  # makes the state, as apply does
        key_of(cluster, name)
    first = {name: key_of(cluster, name) for name in names}
    state = cluster / ".state"
    first_state = fingerprint.state_digest(state)

    def take(loaded, out, etcd=None):
        out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        out.write_bytes(b"snapshot bytes")
        return day2.etcd.SnapshotResult("etcd-1", str(out), out.stat().st_size, 7, 3, 0.1)

    monkeypatch.setattr(day2.etcd, "snapshot", take)
    taken = CliRunner().invoke(app, ["etcd", "snapshot", str(cluster), "--format", "json"])
    assert taken.exit_code == 0, taken.output
    written = Path(json.loads(taken.stdout)["path"])
    assert written.is_relative_to(state) and written.read_bytes() == b"snapshot bytes"
    assert fingerprint.state_digest(state) == first_state
    assert {name: key_of(cluster, name) for name in names} == first
    # The control: any other new file in the state, beside the snapshots, moves every key.
    (state / "kept-by-a-role.json").write_text("{}")
    assert all(key_of(cluster, name) != first[name] for name in names)


def test_the_state_digest_follows_symlinks_and_ends_a_loop(tmp_path):
    """The deploys read state through symlinks (a PKI folder kept elsewhere): its content is
    the state's, and a link back up is not walked forever."""
    state = tmp_path / ".state"
    state.mkdir()
    (state / "dns").mkdir()
    (state / "dns" / "serials.json").write_text("{}")
    elsewhere = tmp_path / "kept-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ca.key").write_text("one")
    (state / "etcd-pki").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "loop").symlink_to(state, target_is_directory=True)
    first = fingerprint.state_digest(state)
    (elsewhere / "ca.key").write_text("two")
    assert fingerprint.state_digest(state) != first
    (elsewhere / "ca.key").write_text("one")
    assert fingerprint.state_digest(state) == first
    # The control: a change in a folder held in place moves the digest too.
    (state / "dns" / "serials.json").write_text("{1}")
    assert fingerprint.state_digest(state) != first


def _site(folder: Path, *names: str) -> Path:
    folder.mkdir()
    for name in names:
        (folder / name).mkdir()
    return folder


def test_code_digest_sees_the_dependencies_of_a_wheel_install(tmp_path, monkeypatch):
    """Installed from a wheel, gpuinfra's code sits in site-packages beside every dependency:
    their versions are in the digest there too, gpuinfra's own metadata is not."""
    site = _site(tmp_path / "site", "pyinfra-3.5.1.dist-info", "gpuinfra-0.1.0.dist-info")
    monkeypatch.setattr(fingerprint.keys, "_ROOT", site.resolve())
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.setattr(fingerprint.keys, "_code_digest", "kept for the process")
    assert fingerprint.keys._distributions() == [f"{site}/pyinfra-3.5.1.dist-info"]
    first = fingerprint.code_digest(again=True)
    (site / "pyinfra-3.5.1.dist-info").rename(site / "pyinfra-3.6.0.dist-info")
    assert fingerprint.code_digest(again=True) != first


def test_code_digest_of_a_checkout_is_the_same_however_it_was_started(tmp_path, monkeypatch):
    """The control for the wheel: a checkout on sys.path (python -m from it) or not (the
    console script) gives one digest, and a dependency's version still moves it."""
    site = _site(tmp_path / "site", "pyinfra-3.5.1.dist-info", "gpuinfra-0.1.0.dist-info")
    checkout = _site(tmp_path / "checkout", "gpuinfra.egg-info")
    monkeypatch.setattr(fingerprint.keys, "_ROOT", checkout.resolve())
    monkeypatch.setattr(fingerprint.keys, "_code_digest", "kept for the process")
    monkeypatch.setattr(sys, "path", [str(site)])
    script = fingerprint.code_digest(again=True)
    monkeypatch.setattr(sys, "path", [str(checkout), str(site)])
    assert fingerprint.code_digest(again=True) == script
    (site / "pyinfra-3.5.1.dist-info").rename(site / "pyinfra-3.6.0.dist-info")
    assert fingerprint.code_digest(again=True) != script


def test_the_key_moves_with_a_managed_file(tmp_path, monkeypatch):
    """A rendered file can change with nothing else changed (a certificate renewed near its
    expiry, a zone's serial on a new day): the key digests every managed file's content."""
    cluster = loopback_cluster(tmp_path / "c")
    first = key_of(cluster)
    render = host_files

    def renewed(ctx):
        return [
            replace(f, content="other\n") if f.path == "/etc/hostname" else f for f in render(ctx)
        ]

    monkeypatch.setattr(engine.context, "host_files", renewed)  # fingerprint imports it per call
    assert key_of(cluster) != first


def test_only_an_exact_sh_c_text_is_unwrapped():
    assert fingerprint.unwrapped("sh -c 'uname -n'") == "uname -n"
    quoted = fingerprint.probe._sh("printf '%s\\n' \"$x\"; exit 3")
    assert fingerprint.unwrapped(quoted) == "printf '%s\\n' \"$x\"; exit 3"
    assert fingerprint.unwrapped("sudo -H -n sh -c 'id'") is None
    assert fingerprint.unwrapped('sh -c "id"') is None  # not the quoting pyinfra sends
    assert fingerprint.unwrapped("sh -c 'id' extra") is None
    assert fingerprint.unwrapped("sh -c 'unterminated") is None


def test_unwrapped_commands_answer_what_their_sh_c_answers(tmp_path):
    """Exit codes, output, $0, positional parameters and what a command leaves behind."""
    commands = [
        fingerprint.probe._sh('echo $0 $# "$*"; exit 5'),
        fingerprint.probe._sh("x=1; cd /; pwd; set -e; false; echo never"),
        fingerprint.probe._sh("echo ${x:-unset}; pwd"),
        fingerprint.probe._sh(f"cat {tmp_path}/missing 2>/dev/null || echo missing"),
    ]
    answers = run_probe(commands)
    for index, command in enumerate(commands):
        assert answers[index] == alone(command), command


# -- the inputs stand for the rendered files -------------------------------------------------

# Rendering every host of a copy of the sample inventory in a fresh interpreter, the second time
# as drift renders (existing state only), with an audit hook on every file and directory opened.
_RENDERING = """
import json, shutil, sys
from pathlib import Path
from engine import fingerprint
from toolkit import clock
from engine.context import host_context, host_files, load

folder = Path(sys.argv[1])
loaded = load(folder)
for name in loaded.cluster.hosts:  # makes the state, as apply does
    host_files(host_context(loaded, name))
fingerprint.code_digest()  # reads the code itself: kept for the process
opened = []
watched = {"open", "os.listdir", "os.scandir"}
sys.addaudithook(lambda event, args: event in watched and opened.append(args[0]))
common = fingerprint.common_digest(loaded)
keys, unkeyed = fingerprint.record_keys(loaded, list(loaded.cluster.hosts), common)
assert not unkeyed, unkeyed
opened = [p.decode() if isinstance(p, bytes) else str(p) for p in opened if not isinstance(p, int)]
code = [m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)]
until = {name: found.valid_until for name, found in keys.items()}
print(json.dumps({"opened": opened, "code": code, "until": until}))
"""


@pytest.fixture(scope="module")
def rendering(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sample")
    (folder / "cluster.yml").write_bytes((REPO / "inventory/sample/cluster.yml").read_bytes())
    argv = [sys.executable, "-c", _RENDERING, str(folder)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
    return folder, json.loads(done.stdout)


def test_rendering_reads_nothing_the_inputs_do_not_digest(rendering):
    """Every file the rendering of every host opens is the cluster's state (state_digest), the
    code and templates (code_files) or an installed distribution's or Python's own file (their
    versions are in code_digest): the inputs key covers all of it."""
    folder, seen = rendering
    code = {str(path) for _, path in fingerprint.code_files()}
    state = folder / ".state"
    installed = [Path(sys.prefix), Path(sys.base_prefix)]

    def digested_state(path: Path) -> bool:  # not a lock, a record or an etcd snapshot
        return path.is_relative_to(state) and (
            path == state or path.relative_to(state).parts[0] not in fingerprint.keys._STATE_IGNORED
        )

    outside = [
        path
        for path in seen["opened"]
        if not (
            path in code
            or digested_state(Path(path))
            or any(Path(path).is_relative_to(root) for root in installed)
            or Path(path).name == "__pycache__"
        )
    ]
    assert seen["opened"], "the audit hook saw nothing: the test would prove nothing"
    assert any(digested_state(Path(p)) for p in seen["opened"])  # the hook sees state reads
    assert not digested_state(state / "etcd-snapshots" / "loop.db")
    assert outside == []


# Reading the clock or the environment: allowed in toolkit/clock.py only, among the modules loaded
# when rendering.
_CLOCK_OR_ENVIRONMENT = re.compile(
    r"\b(datetime\.now|datetime\.today|date\.today|utcnow|time\.time|time\.time_ns|"
    r"time\.localtime|time\.gmtime|time\.strftime|time\.ctime|time\.asctime|environ|getenv|"
    r"expanduser|Path\.home|gethostname|getpass|getlogin)\b"
)


# (module, function) that read them and never while rendering, each with why.
_NOT_RENDERING = {
    # Issuing a certificate (apply only): it is written to `.state/`, which the key digests.
    ("roles/etcd/pki.py", "_validity"),
    # `gpuinfra etcd certs` and the CA rotation commands (day 2), not a rendering.
    ("roles/etcd/pki.py", "expiry_report"),
    ("roles/etcd/pki.py", "begin_ca_rotation"),
    # Reading an Ansible inventory: its result is the cluster, which the key digests.
    ("inventory/ansible_import.py", "_read_with_ansible"),
    # The inventory's SSH key and known_hosts paths (`~` allowed): the connection's, never a
    # rendering's (the audit hook sees any file a rendering would read through it).
    ("inventory/model.py", "resolve"),
    # What `~` stood for when the last apply validated the inventory, and stands for now: the
    # drift that answers without loading compares the two (fingerprint.settled).
    ("engine/fingerprint/early.py", "_alone"),
    ("engine/fingerprint/early.py", "_loads_the_same"),
}


def _clock_readers(path: Path) -> list[tuple[str, str]]:
    """(function, what) for each clock or environment read in a module's source."""
    source = path.read_text()
    spans = [
        (node.lineno, node.end_lineno, node.name)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    found = []
    for match in _CLOCK_OR_ENVIRONMENT.finditer(source):
        line = source.count("\n", 0, match.start()) + 1
        inner = [(end - start, name) for start, end, name in spans if start <= line <= end]
        found.append((min(inner)[1] if inner else "<module>", match.group(0)))
    return found


def test_the_modules_that_render_read_the_clock_only_through_roles_clock(rendering):
    _, seen = rendering
    ours = [
        Path(path)
        for path in seen["code"]
        if Path(path).is_relative_to(REPO) and not Path(path).is_relative_to(Path(sys.prefix))
    ]
    assert REPO / "roles/etcd/pki.py" in ours and REPO / "roles/dns/files.py" in ours
    readers = [
        f"{path.relative_to(REPO)} {function}: {what}"
        for path in ours
        if path != REPO / "toolkit/clock.py"
        for function, what in _clock_readers(path)
        if (str(path.relative_to(REPO)), function) not in _NOT_RENDERING
    ]
    assert readers == [], readers
    planted = REPO / "toolkit/clock.py"  # the positive control: the scan sees clock.py's reads
    assert ("today", "date.today") in _clock_readers(planted)


def test_a_kept_certificate_sets_the_horizon_and_a_clean_zone_none(rendering):
    """etcd members' files hold their certificates, kept until the renewal window opens: their
    records stand until then; a host with neither certificates nor zones has no horizon."""
    folder, seen = rendering
    until = seen["until"]
    loaded = load(folder)
    members = loaded.cluster.in_group("etcd")
    window = 30 * 86400
    assert members and all(until[name] is not None for name in members)
    assert all(until[name] > time.time() + window for name in members)
    plain = [n for n in loaded.cluster.in_group("cpu_worker") if n not in members]
    assert plain and all(until[name] is None for name in plain)


def test_the_inputs_stand_for_the_key_until_the_horizon_or_a_change(tmp_path, monkeypatch):
    cluster = loopback_cluster(tmp_path / "c")
    keys, unkeyed = fingerprint.record_keys(
        load(cluster), ["etcd-1"], fingerprint.common_digest(load(cluster))
    )
    assert keys == {} and "run `gpuinfra apply` first" in unkeyed["etcd-1"]  # nothing made
    made = load(cluster)  # as apply has made it
    for name in made.cluster.hosts:
        host_files(host_context(made, name))
    keys, unkeyed = fingerprint.record_keys(
        load(cluster), ["etcd-1", "cpu-1"], fingerprint.common_digest(load(cluster))
    )
    assert unkeyed == {}
    pki = pki_dir(made)
    leaf = pki / "etcd-1" / "peer.crt"
    kept = leaf.read_bytes()
    leaf.unlink()  # what apply would issue again: rendered as a placeholder, never recorded
    _, unkeyed = fingerprint.record_keys(
        load(cluster), ["etcd-1", "cpu-1"], fingerprint.common_digest(load(cluster))
    )
    assert list(unkeyed) == ["etcd-1"] and "next apply" in unkeyed["etcd-1"]
    leaf.write_bytes(kept)  # back to the state the keys below were made from
    keys, _ = fingerprint.record_keys(
        load(cluster), ["etcd-1", "cpu-1"], fingerprint.common_digest(load(cluster))
    )
    common = fingerprint.common_digest(load(cluster))

    def record(name):
        found = keys[name]
        return Record(found.key, (), (), (), inputs=found.inputs, valid_until=found.valid_until)

    assert fingerprint.inputs_stand(record("cpu-1"), common, "cpu-1")
    assert fingerprint.inputs_stand(record("etcd-1"), common, "etcd-1")
    assert not fingerprint.inputs_stand(record("cpu-1"), common, "etcd-1")
    horizon = keys["etcd-1"].valid_until
    monkeypatch.setattr(time, "time", lambda: horizon)
    assert not fingerprint.inputs_stand(record("etcd-1"), common, "etcd-1")
    assert fingerprint.inputs_stand(record("cpu-1"), common, "cpu-1")
    (cluster / ".state" / "dns" / "extra").write_text("x")
    assert not fingerprint.inputs_stand(
        record("cpu-1"), fingerprint.common_digest(load(cluster)), "cpu-1"
    )


def test_nested_clock_watches_each_see_what_is_read_inside_them():
    with clock.watching() as outer:
        with clock.watching() as inner:
            pass
        clock.today()
    assert outer.until is not None and inner.until is None


def _unwrapped_by_shlex(command: str) -> str | None:
    """The reference: what shlex.split finds, when quoting it again gives `command` back."""
    try:
        parts = shlex.split(command)
    except ValueError:
        return None
    if len(parts) == 3 and parts[:2] == ["sh", "-c"] and fingerprint.probe._sh(parts[2]) == command:
        return parts[2]
    return None


def test_unwrapping_finds_what_shlex_finds():
    """On quoted texts, on texts one edit away from one, and on the lab's recorded commands'
    kind of text: the same answer as splitting with shlex (which is 10x slower)."""
    rng = random.Random(7)
    alphabet = "ab '\"\\$;|&()-_=/\n\t"
    found = 0
    for _ in range(3000):
        inner = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        command = "sh -c " + shlex.quote(inner)
        at = rng.randrange(len(command) + 1)
        edited = command[:at] + rng.choice(alphabet) + command[at:]
        for text in (command, edited, command[:at], "sh -c" + command[5:at]):
            assert fingerprint.unwrapped(text) == _unwrapped_by_shlex(text), repr(text)
            found += fingerprint.unwrapped(text) is not None
    assert found > 3000  # every quoted text at least, and some edits still quote something


def test_an_apply_records_nothing_when_its_code_changed_on_disk_during_the_run(
    tmp_path, monkeypatch
):
    """The records an apply keeps name the code it ran with: the digest taken when the command
    started. When the files on disk are no longer those at the end of the run (an upgrade or a
    checkout meanwhile), no host is recorded and the records from before go too: drift checks
    each host operation by operation. Control: the same call with the code unchanged records
    the converged host (cpu-1: the loopback cluster's one host keyed without controller state)."""
    from engine.fingerprint import recording
    from engine.reports import HostReport, Mode, RunOptions, RunReport

    loaded = load(loopback_cluster(tmp_path / "c"))
    loaded.state_dir.mkdir(mode=0o700)
    contexts = {
        ctx.name: ctx for ctx in engine.context.host_contexts(loaded) if ctx.name == "cpu-1"
    }
    asked = {"cpu-1": (("echo cpu-1", (0,), fingerprint.output_digest(["cpu-1"])),)}

    def no_check(options: RunOptions) -> RunReport:
        raise AssertionError("no host changed: there is nothing to check again")

    def record() -> RunReport:
        report = RunReport(cluster="loop", mode=Mode.plan, hosts={"cpu-1": HostReport("cpu-1")})
        recording.record_converged(
            loaded, RunOptions(mode=Mode.plan), report, asked, contexts, check=no_check
        )
        return report

    assert record().notes == []
    assert fingerprint.load_record(loaded.state_dir, "cpu-1") is not None
    monkeypatch.setattr(fingerprint.keys, "_code_digest", "the code when the run began")
    assert record().notes == [f"{recording.NOT_RECORDED}: {recording.CODE_CHANGED}"]
    assert fingerprint.load_record(loaded.state_dir, "cpu-1") is None


def test_an_apply_checks_the_hosts_it_changed_again_and_keeps_only_the_converged(tmp_path):
    """A host the apply changed is recorded only if the exact check run after it (a recording
    plan of the changed hosts) finds it converged; otherwise its earlier record goes and the
    report says so. Control: the same apply whose check finds the host converged keeps it."""
    from engine.fingerprint import recording
    from engine.reports import HostReport, HostStatus, Mode, RunOptions, RunReport

    loaded = load(loopback_cluster(tmp_path / "c"))
    loaded.state_dir.mkdir(mode=0o700)
    contexts = {ctx.name: ctx for ctx in engine.context.host_contexts(loaded)}
    asked_checks: list[RunOptions] = []

    def apply(found: HostStatus) -> RunReport:
        fingerprint.save_record(loaded.state_dir, "cpu-1", Record("key", (), (), ()))

        def check(options: RunOptions) -> RunReport:
            asked_checks.append(options)
            return RunReport(
                cluster="loop", mode=Mode.plan, hosts={"cpu-1": HostReport("cpu-1", found)}
            )

        changed = HostReport("cpu-1", HostStatus.changed)
        report = RunReport(cluster="loop", mode=Mode.apply, hosts={"cpu-1": changed})
        options = RunOptions(mode=Mode.apply, roles=("base",), connect_timeout=7)
        recording.record_converged(loaded, options, report, {}, contexts, check=check)
        return report

    still = apply(HostStatus.drift)
    assert still.notes == [
        "checked again after the apply, not converged: cpu-1 "
        "(`gpuinfra plan` shows what would still change)"
    ]
    assert fingerprint.load_record(loaded.state_dir, "cpu-1") is None
    assert asked_checks == [
        RunOptions(mode=Mode.plan, limit=("cpu-1",), roles=("base",), connect_timeout=7)
    ]
    assert "converged check" in still.phase_seconds
    assert apply(HostStatus.ok).notes == []
    assert fingerprint.load_record(loaded.state_dir, "cpu-1") is not None
