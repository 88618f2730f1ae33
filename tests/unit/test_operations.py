"""Managed files replace the live file atomically (staged beside it with its final owner and mode
before any byte is written, then moved over it: a killed controller leaves old or new), and a
write stays marked pending until its phase's restarts have run."""

from __future__ import annotations

import hashlib
import subprocess
from typing import Any

import pytest
from pyinfra.context import ctx_host
from pyinfra.facts.files import File, Sha1File

from tests.unit.fake_host import commands, keyed_host
from toolkit.facts import UnitState
from toolkit.operations import (
    clear_pending,
    pending_marker,
    put_checked,
    service_stopped,
    staged_path,
)

DEST = "/etc/etcd/pki/member.key"
STAGED = "/etc/etcd/pki/.member.key.gpuinfra-new"
MARKER = "/var/lib/gpuinfra/pending/etc%2Fetcd%2Fpki%2Fmember.key"
MOVE = f"mkdir -p /var/lib/gpuinfra/pending && touch {MARKER} && mv -f {STAGED} {DEST}"
KEY_FILE = {"mode": 600, "user": "etcd", "group": "etcd"}


class KeyedHost:
    """Facts keyed by class and path, so a lookup of the wrong path finds nothing."""

    def __init__(self, facts: dict[tuple[type, str], Any]):
        self.facts = facts
        self.noops: list[str] = []

    def get_fact(self, fact: type, path: str) -> Any:
        return self.facts.get((fact, path))

    def noop(self, message: str) -> None:
        self.noops.append(message)


def run(operation, facts: dict[tuple[type, str], Any], **arguments: Any):
    host = KeyedHost(facts)
    with ctx_host.use(host):
        return [str(c) for c in operation._inner(**arguments)], host.noops


def put_key(facts: dict[tuple[type, str], Any]):
    return run(put_checked, facts, content="KEY", dest=DEST, mode="0600", user="etcd", group="etcd")


def test_staged_path_and_marker_are_named_after_the_file():
    assert staged_path(DEST) == STAGED
    assert pending_marker(DEST) == MARKER


def test_an_unchecked_file_is_staged_then_moved_never_written_in_place():
    ran, _ = put_key({})
    assert ran[0] == "mkdir -p /etc/etcd/pki"
    # Created empty, 0600 and owned by etcd before the upload fills it: never readable by others.
    assert ran[1] == (
        f"rm -f {STAGED} && (umask 077 && : > {STAGED}) && "
        f"chown etcd:etcd {STAGED} && chmod 0600 {STAGED}"
    )
    assert ran[2].startswith("FileUploadCommand(") and ran[2].endswith(f", {STAGED})")
    assert ran[3:] == [MOVE]


def test_a_checked_file_is_validated_before_the_move():
    ran, _ = run(
        put_checked, {}, content="table", dest="/etc/nftables.conf", check="nft -c -f {path}"
    )
    staged = "/etc/.nftables.conf.gpuinfra-new"
    assert ran[3] == f"{{ nft -c -f {staged} ; }} || {{ rc=$?; rm -f {staged}; exit $rc; }}"
    assert ran[4].endswith(f"mv -f {staged} /etc/nftables.conf")


def test_an_up_to_date_file_is_left_alone():
    digest = hashlib.sha1(b"KEY").hexdigest()
    ran, noops = put_key({(File, DEST): KEY_FILE, (Sha1File, DEST): digest})
    assert ran == [] and noops == [f"{DEST} is up to date"]


def test_an_up_to_date_file_still_marked_pending_counts_as_changed():
    """Written by a run that stopped before the reload hanging off it: changed again, so the
    reload runs now."""
    digest = hashlib.sha1(b"KEY").hexdigest()
    facts = {(File, DEST): KEY_FILE, (Sha1File, DEST): digest, (File, MARKER): {"mode": 644}}
    ran, _ = put_key(facts)
    assert ran == [f"test -e {MARKER}"]


def test_a_wrong_mode_is_corrected_through_the_staged_file():
    digest = hashlib.sha1(b"KEY").hexdigest()
    ran, _ = put_key({(File, DEST): dict(KEY_FILE, mode=644), (Sha1File, DEST): digest})
    assert ran[-1] == MOVE


def test_clear_pending_removes_only_the_marks_present():
    other = "/etc/hosts"
    ran, _ = run(clear_pending, {(File, MARKER): {"mode": 644}}, paths=[DEST, other])
    assert ran == [f"rm -f {MARKER}"]
    ran, noops = run(clear_pending, {}, paths=[DEST, other])
    assert ran == [] and noops == ["no restart pending"]


@pytest.mark.parametrize(
    ("state", "want"),
    [
        # What Debian's ceph-base leaves: ceph-crash enabled and running.
        (
            {"UnitFileState": "enabled", "ActiveState": "active"},
            ["systemctl disable ceph-crash", "systemctl stop ceph-crash"],
        ),
        ({"UnitFileState": "disabled", "ActiveState": "active"}, ["systemctl stop ceph-crash"]),
        ({"UnitFileState": "enabled", "ActiveState": "inactive"}, ["systemctl disable ceph-crash"]),
        # Control: off and stopped is nothing to do (a second apply changes nothing).
        ({"UnitFileState": "disabled", "ActiveState": "inactive"}, []),
        ({"UnitFileState": "disabled", "ActiveState": "failed"}, []),
        # Not there when the run was prepared: decided on the host, a missing unit left alone.
        (
            None,
            [
                "if systemctl cat ceph-crash >/dev/null 2>&1; "
                "then systemctl disable --now ceph-crash; fi"
            ],
        ),
    ],
)
def test_a_unit_kept_stopped_is_stopped_and_disabled_only_where_it_is_not(state, want):
    with keyed_host({(UnitState, (("unit", "ceph-crash"),)): state}):
        ran = [str(c) for c in service_stopped._inner(unit="ceph-crash")]
    assert ran == want


# -- boot_wanted: gpuinfra's own units, enabled as the symlink `systemctl enable` makes ---------


def test_a_unit_is_enabled_only_when_its_wants_link_is_missing_or_elsewhere():
    from pyinfra.facts.files import Link

    from toolkit.operations import boot_wanted, wants_link

    link = wants_link("gpuinfra-thp.service", "basic.target")
    assert link == "/etc/systemd/system/basic.target.wants/gpuinfra-thp.service"
    found = {
        "user": "root",
        "group": "root",
        "link_target": "/etc/systemd/system/gpuinfra-thp.service",
    }
    elsewhere = {**found, "link_target": "/dev/null"}
    for state, enables in ((found, False), (None, True), (elsewhere, True), (False, True)):
        with keyed_host({(Link, (("path", link),)): state}) as host:
            yielded = [
                str(c)
                for c in boot_wanted._inner(unit="gpuinfra-thp.service", target="basic.target")
            ]
        assert yielded == (["systemctl enable gpuinfra-thp.service"] if enables else [])
        assert bool(host.noops) is not enables


def test_each_unit_enabled_by_its_wants_link_is_wanted_by_that_target_alone():
    """`systemctl enable` acts on the whole [Install] section: a unit boot_wanted checks by one
    symlink must want that one target and nothing else (no RequiredBy, Alias or Also)."""
    import pytest

    from engine.context import host_contexts, host_files, load
    from roles.kernel.files import GOVERNOR_UNIT, THP_UNIT
    from roles.nvidia.files import CDI_UNIT
    from tests.unit.conftest import SAMPLE
    from toolkit.operations import wanted_by

    wanted = {GOVERNOR_UNIT: "multi-user.target", THP_UNIT: "basic.target"}
    wanted[CDI_UNIT] = "multi-user.target"
    seen = set()
    for ctx in host_contexts(load(SAMPLE)):
        for managed in host_files(ctx):
            unit = managed.path.removeprefix("/etc/systemd/system/")
            if unit not in wanted:
                continue
            install = managed.content.split("[Install]\n", 1)[1].split("\n[", 1)[0]
            lines = [line for line in install.splitlines() if line.strip() and line[0] not in "#;"]
            assert lines == [f"WantedBy={wanted[unit]}"], f"{ctx.name} {unit}"
            assert wanted_by(managed.content) == wanted[unit]
            seen.add(unit)
    assert seen == set(wanted)  # every one of them rendered somewhere in the sample
    with pytest.raises(ValueError, match="RequiredBy"):
        wanted_by("[Unit]\n[Install]\nWantedBy=a.target\nRequiredBy=b.target\n")
    with pytest.raises(ValueError):
        wanted_by("[Unit]\nDescription=no install section\n")


def test_a_restart_or_reload_is_decided_on_the_host_when_it_runs():
    """No fact: systemd restarts (or reloads) the unit only if it runs when the operation does."""
    from toolkit.operations import restart_command, restart_if_running

    assert commands(restart_if_running, {}, unit="docker") == ([restart_command("docker")], [])
    assert commands(restart_if_running, {}, unit="ssh", reload=True) == (
        [restart_command("ssh", reload=True)],
        [],
    )
    assert restart_command("ssh", reload=True).startswith("systemctl try-reload-or-restart ssh ")


def fake_commands(folder, scripts: dict[str, str]) -> None:
    """Executable stand-in scripts (systemctl, journalctl, ...) in folder, first on PATH."""
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)


FAKE_JOURNALCTL = """#!/bin/sh
[ "$1" = --sync ] && exit 0
echo "journal $*" >> "$LOG"
echo "containerd: the why"
"""

FAKE_SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$LOG"
case "$1" in
  try-restart|try-reload-or-restart) exit "$RESTART_RC" ;;
  show) case "$*" in *LoadState*) echo "${LOAD_STATE:-loaded}" ;; *) echo "$RESULT" ;; esac ;;
  start) exit "$START_RC" ;;
esac
"""


@pytest.mark.parametrize(
    ("restart_rc", "result", "start_rc", "rc", "calls"),
    [
        (0, "success", 0, 0, ["try-restart"]),
        (1, "resources", 0, 0, ["try-restart", "show", "show", "start"]),
        (1, "resources", 1, 1, ["try-restart", "show", "show", "start", "journal"]),
        (1, "exit-code", 0, 1, ["try-restart", "show", "show", "journal"]),
        (1, "start-limit-hit", 0, 1, ["try-restart", "show", "show", "journal"]),
    ],
)
def test_a_restart_refused_for_want_of_resources_is_started_once_more(
    tmp_path, restart_rc, result, start_rc, rc, calls
):
    """The host's command under /bin/sh, with systemctl and journalctl replaced by scripts that
    play systemd's answers (a stand-in: a spawn failure of systemd cannot be caused on demand on
    a lab host; the lab's applies run the same command against real systemd). Only the result
    `resources` earns a second start; every failure shows the unit's journal."""
    from toolkit.operations import restart_command

    log = tmp_path / "calls"
    fake_commands(
        tmp_path,
        {
            "systemctl": FAKE_SYSTEMCTL,
            "journalctl": FAKE_JOURNALCTL,
        },
    )
    env = {
        "PATH": f"{tmp_path}:/usr/bin:/bin",
        "LOG": str(log),
        "RESTART_RC": str(restart_rc),
        "RESULT": result,
        "START_RC": str(start_rc),
    }
    run = subprocess.run(
        ["/bin/sh", "-c", restart_command("containerd")], env=env, capture_output=True, text=True
    )
    assert run.returncode == rc
    seen = [
        line.split()[1] if line.startswith("systemctl") else "journal"
        for line in log.read_text().splitlines()
    ]
    assert seen == calls
    assert ("containerd: the why" in run.stderr) == ("journal" in calls)
    if "journal" in calls:  # either field names the unit, by its full name
        asked = "journal _SYSTEMD_UNIT=containerd.service + UNIT=containerd.service"
        assert asked in log.read_text()
    assert "systemctl show -p Result --value containerd" in log.read_text() or "show" not in calls


def test_the_journal_of_a_unit_is_asked_for_by_its_full_name():
    """journalctl's field matches take a unit's full name (`-u` adds .service itself); a name
    that has its type already keeps it."""
    from toolkit.operations import unit_journal_command

    assert "UNIT=containerd.service -n 10 " in unit_journal_command("containerd")
    assert "_SYSTEMD_UNIT=etcd-data.mount +" in unit_journal_command("etcd-data.mount")
    assert "UNIT=kubelet.service -n 3 " in unit_journal_command("kubelet.service", lines=3)
    assert unit_journal_command("ssh").startswith("journalctl --sync 2>/dev/null; ")


def test_a_restart_of_a_unit_the_host_lacks_is_nothing_to_do(tmp_path):
    """try-restart fails on a unit systemd does not know ("Unit docker.service not found", a
    host with containerd alone): not running, so nothing to restart and no failure; a unit that
    exists and fails is the control."""
    from toolkit.operations import restart_command

    fake_commands(tmp_path, {"systemctl": FAKE_SYSTEMCTL, "journalctl": "#!/bin/sh\n"})
    for load_state, rc in (("not-found", 0), ("loaded", 1)):
        env = {
            "PATH": f"{tmp_path}:/usr/bin:/bin",
            "LOG": str(tmp_path / f"calls-{load_state}"),
            "RESTART_RC": "5",
            "RESULT": "exit-code",
            "LOAD_STATE": load_state,
        }
        run = subprocess.run(["/bin/sh", "-c", restart_command("docker")], env=env)
        assert run.returncode == rc, load_state


FAKE_SYSTEMCTL_START = """#!/bin/sh
echo "systemctl $*" >> "$LOG"
case "$1" in
  show) echo "$RESULT" ;;
  start) [ -e "$STARTED" ] && exit 0; touch "$STARTED"; exit 1 ;;
esac
"""


@pytest.mark.parametrize(
    ("result", "rc", "starts"),
    [("resources", 0, 2), ("dependency", 0, 2), ("exit-code", 1, 1)],
)
def test_a_start_refused_for_want_of_resources_is_tried_once_more(tmp_path, result, rc, starts):
    """The same stand-in for systemd as above, for a first start that fails: a spawn failure of
    the unit or of one it needs earns a second start, a failure of the unit itself does not."""
    from toolkit.operations import start_command

    log = tmp_path / "calls"
    fake_commands(
        tmp_path,
        {
            "systemctl": FAKE_SYSTEMCTL_START,
            "journalctl": '#!/bin/sh\necho "journal $*" >> "$LOG"\n',
            "sleep": "#!/bin/sh\n",
        },
    )
    env = {
        "PATH": f"{tmp_path}:/usr/bin:/bin",
        "LOG": str(log),
        "RESULT": result,
        "STARTED": str(tmp_path / "started"),
    }
    run = subprocess.run(["/bin/sh", "-c", start_command("etcd")], env=env, capture_output=True)
    assert run.returncode == rc
    calls = log.read_text().splitlines()
    assert sum(line.startswith("systemctl start") for line in calls) == starts
    assert any(line.startswith("journal") for line in calls) == (rc != 0)


FAKE_SS = """#!/bin/sh
n=$(($(cat "$DIR/ss.n" 2>/dev/null || echo 0) + 1)); echo "$n" > "$DIR/ss.n"
if [ -f "$DIR/ss.$n" ]; then cat "$DIR/ss.$n"; else cat "$DIR/ss.last"; fi
"""


def listener(address: str, inode: int, process: str = "sshd") -> str:
    """A line of `ss -Htlnpe` as the lab's hosts print it."""
    return (
        f'LISTEN 0      128    {address} 0.0.0.0:* users:(("{process}",pid=53,fd=6)) '
        f"ino:{inode} sk:63 cgroup:/system.slice/ssh.service <->"
    )


OLD = [listener("0.0.0.0:22", 100), listener("[::]:22", 101)]
NEW = [listener("0.0.0.0:22", 1000), listener("[::]:22", 1001)]


@pytest.mark.parametrize(
    ("answers", "want", "rc", "ss_calls"),
    [
        # The window after SIGHUP: old sockets, none, then a new one on each port.
        ([OLD, OLD, [], NEW[:1], NEW], "[::]:22\n0.0.0.0:22", 0, 4),
        # Two ports: one bound is not yet enough.
        ([OLD, NEW[:1], NEW[:1] + [listener("0.0.0.0:2222", 1002)]], "0.0.0.0:22\n[::]:2222", 0, 3),
        ([OLD, NEW], "[::]:22\n0.0.0.0:22", 0, 2),
        # sshd ignored the signal: its old sockets stay, and the wait gives up.
        ([OLD, OLD], "[::]:22\n0.0.0.0:22", 1, 11),
        # New sockets, but not on the port sshd -T names.
        ([OLD, NEW], "0.0.0.0:2222", 1, 11),
        # A port named twice, and [::] named on a host without IPv6: port 22 is enough.
        ([OLD, NEW[:1]], "[::]:22\n0.0.0.0:22\n0.0.0.0:22", 0, 2),
        # Socket activation: the sockets are systemd's, nothing of sshd's to wait for.
        ([[listener("0.0.0.0:22", 7, "systemd")]], "unused", 0, 1),
    ],
)
def test_a_reload_of_sshd_waits_until_sshd_listens_again(tmp_path, answers, want, rc, ss_calls):
    """The host's command under /bin/sh with ss, sshd and systemctl played by scripts (a
    stand-in: the window between sshd closing its sockets and binding new ones is too short to
    hit on demand on a lab host; the lab's applies run the same command). The wait ends when
    no old socket is left and sshd listens on exactly what `sshd -T` lists, not before."""
    from toolkit.operations import reload_sshd_command

    for number, lines in enumerate(answers, start=1):
        (tmp_path / f"ss.{number}").write_text("".join(f"{line}\n" for line in lines))
    (tmp_path / "ss.last").write_text("".join(f"{line}\n" for line in answers[-1]))
    listen = "".join(f"listenaddress {address}\n" for address in want.split("\n"))
    fake_commands(
        tmp_path,
        {
            "systemctl": FAKE_SYSTEMCTL,
            "ss": FAKE_SS,
            "sshd": f'#!/bin/sh\necho "sshd $*" >> "$LOG"\nprintf "port 22\\n{listen}"\n',
        },
    )
    log = tmp_path / "calls"
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "LOG": str(log), "DIR": str(tmp_path),
           "RESTART_RC": "0"}  # fmt: skip
    run = subprocess.run(
        ["/bin/sh", "-c", reload_sshd_command(seconds=1)], env=env, capture_output=True, text=True
    )
    assert run.returncode == rc, run.stderr
    assert int((tmp_path / "ss.n").read_text()) == ss_calls
    assert "systemctl try-reload-or-restart ssh" in log.read_text()
    assert ("sshd does not listen again" in run.stderr) == (rc == 1)


def test_a_failed_reload_of_sshd_is_not_waited_for(tmp_path):
    from toolkit.operations import reload_sshd_command

    (tmp_path / "ss.last").write_text(listener("0.0.0.0:22", 100) + "\n")
    fake_commands(
        tmp_path,
        {"systemctl": FAKE_SYSTEMCTL, "ss": FAKE_SS, "journalctl": "#!/bin/sh\necho why >&2\n"},
    )
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "LOG": str(tmp_path / "calls"),
           "DIR": str(tmp_path), "RESTART_RC": "1", "RESULT": "exit-code"}  # fmt: skip
    run = subprocess.run(["/bin/sh", "-c", reload_sshd_command(seconds=1)], env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 1 and run.stderr == "why\n"
    assert (tmp_path / "ss.n").read_text() == "1\n"
