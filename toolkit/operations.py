"""Operations shared by the roles: managed files and services that respect containers."""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, Link, Sha1File

from toolkit import record
from toolkit.dropins import unit_name
from toolkit.facts import Account, Container, GroupEntry, NodeName, RebootReasons, UnitState
from toolkit.pyinfra_api import op_hash
from toolkit.spec import ManagedFile


def put_file(managed: ManagedFile) -> OperationMeta:
    """Upload a rendered file; the runner turns a pending change into a unified diff. Every file
    is staged beside the live one and moved into place (see `put_checked`), validated first when
    it has a `check`: pyinfra's `files.put` writes the live path in place over SFTP, so a
    controller killed mid-upload would leave it truncated (found by tests/integration/
    test_faults.py's review of pyinfra 3.10's ssh connector)."""
    meta = put_checked(
        name=f"Write {managed.path}",
        content=managed.content,
        dest=managed.path,
        check=managed.check,
        mode=managed.mode,
        user=managed.user,
        group=managed.group,
    )
    remember_file(meta, managed)
    return meta


def prefetch_requests(managed: list[ManagedFile]) -> list[tuple[type, dict]]:
    """The facts `put_file` (through pyinfra's `files.put` or `put_checked`), `service_running`
    and `apt.packages` ask for on a host with these files: the runner fetches them in one
    command per host (engine/factcache.py). A fact missing here is only fetched on its own."""
    requests: list[tuple[type, dict]] = [(Container, {}), (DebPackages, {}), (NodeName, {})]
    for f in managed:
        requests += [(File, {"path": f.path}), (Sha1File, {"path": f.path})]
        requests.append((File, {"path": pending_marker(f.path)}))
    return requests


def remember_file(meta: OperationMeta, managed: ManagedFile) -> None:
    # Remembered by operation hash so the runner can diff exactly this file on this host.
    record.host(host.name).files[op_hash(meta)] = managed


# A written file whose restart or reload (the operations hanging off its change) has not run
# yet is marked here; see `put_checked` and `clear_pending`.
PENDING_DIR = "/var/lib/gpuinfra/pending"


def pending_marker(dest: str) -> str:
    """The marker of a file written by a run that has not yet finished the file's phase."""
    return posixpath.join(PENDING_DIR, dest.strip("/").replace("%", "%25").replace("/", "%2F"))


def staged_path(dest: str) -> str:
    """Where a checked file waits for its validation, beside the live one (same filesystem, so
    the final move is atomic)."""
    directory, name = posixpath.split(dest)
    return posixpath.join(directory, f".{name}.gpuinfra-new")


@operation()
def put_checked(
    content: str,
    dest: str,
    check: str | None = None,
    mode: str = "0644",
    user: str = "root",
    group: str = "root",
):
    """Replace a file atomically, validated first when `check` is given: the content goes to a
    staged path beside the live one (created empty with its final owner and mode before any
    byte is written, so a secret is never readable by others, not even for a moment), `check`
    runs with `{path}` set to it, and a passing file is moved over the live one. A failing
    check removes the staged file, fails the operation and leaves the live config as it was,
    so a daemon restarted later never reads a broken file. A controller killed at any point
    leaves the old file or the new one, at worst with a staged file the next run replaces.

    The move also marks the file pending (`pending_marker`) until its phase has finished on the
    host (`clear_pending`): a run stopped between a write and the restart hanging off it (a
    killed controller, a lost host) leaves the mark, and the next run counts the up-to-date
    file as changed again, so the restart runs then instead of never."""
    current = host.get_fact(File, path=dest)
    marker = pending_marker(dest)
    digest = hashlib.sha1(content.encode()).hexdigest()
    if (
        current
        and host.get_fact(Sha1File, path=dest) == digest
        and current.get("mode") == int(mode)
        and current.get("user") == user
        and current.get("group") == group
    ):
        if host.get_fact(File, path=marker):
            # Written by a run that stopped before the restart or reload hanging off it.
            yield f"test -e {shlex.quote(marker)}"
            return
        host.noop(f"{dest} is up to date")
        return
    staged = staged_path(dest)
    quoted_staged, quoted_dest = shlex.quote(staged), shlex.quote(dest)
    yield f"mkdir -p {shlex.quote(posixpath.dirname(dest))}"
    # The upload truncates and fills the existing staged file, which keeps its owner and mode.
    yield (
        f"rm -f {quoted_staged} && (umask 077 && : > {quoted_staged}) && "
        f"chown {user}:{group} {quoted_staged} && chmod {mode} {quoted_staged}"
    )
    yield FileUploadCommand(StringIO(content), staged)
    if check is not None:
        validate = check.format(path=quoted_staged)
        yield f"{{ {validate} ; }} || {{ rc=$?; rm -f {quoted_staged}; exit $rc; }}"
    yield (
        f"mkdir -p {PENDING_DIR} && touch {shlex.quote(marker)} && "
        f"mv -f {quoted_staged} {quoted_dest}"
    )


@operation()
def clear_pending(paths: list[str]):
    """The last operation of a phase on a host: its files' restarts and reloads have run, so
    their pending marks go. Asked again while executing, it sees the marks this run made."""
    markers = [pending_marker(path) for path in paths]
    present = [marker for marker in markers if host.get_fact(File, path=marker)]
    if not present:
        host.noop("no restart pending")
        return
    yield "rm -f " + " ".join(shlex.quote(marker) for marker in present)


@operation()
def service_running(unit: str, container_skips: bool = False):
    """Enable and start a unit. Units that cannot work in a container (chrony cannot set the
    clock there) are reported and left alone when `container_skips` is set."""
    if container_skips and host.get_fact(Container):
        host.noop(f"{unit} does not run in a container ({host.get_fact(Container)})")
        return
    state = host.get_fact(UnitState, unit=unit)
    if state is None:
        # Not installed yet when the run is prepared: a package operation before this one
        # installs it. Should it still be missing, systemctl fails and names the unit.
        yield f"systemctl enable {unit}"
        yield start_command(unit)
        return
    # `enabled-runtime` is enabled for this boot only (a link under /run): not at the next boot.
    if state.get("UnitFileState") not in ("enabled", "static", "alias"):
        yield f"systemctl enable {unit}"
    if state.get("ActiveState") == "failed":
        # A unit that failed several times in a row refuses `start` ("start request repeated
        # too quickly") until its failure is cleared.
        yield f"systemctl reset-failed {unit}"
    if state.get("ActiveState") != "active":
        yield start_command(unit)


@operation()
def service_stopped(unit: str):
    """Keep a unit a package ships and starts stopped, and off at boot. A unit that does not
    exist (the package is not there) is left alone: nothing of it runs."""
    state = host.get_fact(UnitState, unit=unit)
    if state is None:
        # Installed by a package operation before this one in the same run, or never: the
        # shell form does both without failing on a unit that is not there.
        yield f"if systemctl cat {unit} >/dev/null 2>&1; then systemctl disable --now {unit}; fi"
        return
    if state.get("UnitFileState") in ("enabled", "enabled-runtime"):
        yield f"systemctl disable {unit}"
    if state.get("ActiveState") in ("active", "activating", "reloading"):
        yield f"systemctl stop {unit}"


def unit_journal_command(unit: str, lines: int = 10) -> str:
    """The unit's last journal lines, to stderr: why an operation on it failed. `journalctl -u`
    finds a process's own message by the unit journald reads from the process's cgroup, and a
    process gone before journald reads its message has none. systemd's executor says why a unit
    could not start ("Unable to locate executable ...") and exits at once, so on a busy host
    `-u` left out the one line that says why (CI once; every time on a lab host whose journald
    was held back for a second). Those messages also name the unit in UNIT=, as systemd's own
    do: either field matches. `--sync` first: journald has taken in all that was sent."""
    quoted = shlex.quote(unit_name(unit))
    return (
        "journalctl --sync 2>/dev/null; "
        f"journalctl _SYSTEMD_UNIT={quoted} + UNIT={quoted} -n {lines} --no-pager -o cat >&2"
    )


def start_command(unit: str) -> str:
    """`systemctl start`, tried once more when systemd could not spawn the unit or one it needs
    (result `resources`, or `dependency` after such a failure of a dependency): seen on a lab
    host under load, "etcd-data.service: Failed to spawn executor", which failed etcd's start.
    Any other failure, or a second one, fails with the unit's last journal lines."""
    quoted = shlex.quote(unit)
    result = f"$(systemctl show -p Result --value {quoted})"
    transient = f'case "{result}" in resources|dependency) true ;; *) false ;; esac'
    journal = unit_journal_command(unit)
    return (
        f"systemctl start {quoted} || {{ {transient} && sleep 2 && systemctl start {quoted}; }}"
        f" || {{ {journal}; exit 1; }}"
    )


def restart_command(unit: str, reload: bool = False) -> str:
    """The host's side of `restart_if_running`. A restart whose job fails with systemd's
    result `resources` ("unavailable resources or another system error": systemd could not
    spawn the new process, a refusal of the moment, not of the configuration) is started once
    more: seen once in CI on a lab host (containerd on a first apply), in none of 168 restarts
    tried by hand on lab hosts. Any other failure (the daemon exits on its configuration, a
    timeout, the start limit), or a second one, fails the operation with the unit's last
    journal lines. A unit the host does not have is not running: nothing to restart (systemd
    fails try-restart with "Unit ... not found"; Docker's unit on a host with containerd alone)."""
    quoted = shlex.quote(unit)
    verb = "try-reload-or-restart" if reload else "try-restart"
    absent = f'[ "$(systemctl show -p LoadState --value {quoted})" = not-found ]'
    transient = f'[ "$(systemctl show -p Result --value {quoted})" = resources ]'
    journal = unit_journal_command(unit)
    return (
        f"systemctl {verb} {quoted} || {absent}"
        f" || {{ {transient} && systemctl start {quoted}; }} || {{ {journal}; exit 1; }}"
    )


@operation()
def restart_if_running(unit: str, reload: bool = False):
    """Restart a unit for its new configuration (reload it, with `reload`, where the unit can
    reload), only when it runs: systemd's try-restart and try-reload-or-restart, decided on the
    host as the operation runs (see `restart_command`). pyinfra's
    systemd.service(restarted=True) decides from the unit's state read when the run is
    prepared: a fact that every plan and drift asked systemd for (a GetAll of every property of
    the unit, on every host), for a restart that runs only when a file changed."""
    yield restart_command(unit, reload)


# sshd's own listening sockets, "address:port inode" (none under socket activation: systemd's).
SSHD_LISTENERS = (
    "ss -Htlnpe | awk '/\"sshd\"/ { for (i = 1; i <= NF; i++) if ($i ~ /^ino:/) print $4, $i }'"
)


def reload_sshd_command(seconds: int = 10) -> str:
    """The host's side of `reload_sshd`: reload, then wait until sshd listens again. sshd
    answers SIGHUP by closing its sockets and re-executing itself; `systemctl reload` returns
    before the new sockets are bound (the unit is Type=notify, not notify-reload). A connection
    opened in between is refused: 1 in 30 reloads on a lab host, and CI saw one. The wait ends
    when none of the old sockets is left and sshd listens on every port `sshd -T` names. Ports,
    not addresses: sshd names [::] on a host without IPv6 too, and skips what it cannot bind."""
    port = "sed 's/.*://' | sort -u"
    old = f"old=$({SSHD_LISTENERS} | cut -d' ' -f2)"
    want = f"want=$(sshd -T | awk '$1 == \"listenaddress\" {{print $2}}' | {port})"
    now = f"now=$({SSHD_LISTENERS})"
    same = f'[ "$(echo "$now" | cut -d" " -f1 | {port})" = "$want" ]'
    gone = '! echo "$now" | grep -qwF "$old"'
    return (
        f"{old}; {{ {restart_command('ssh', reload=True)}; }} || exit 1; "
        '[ -n "$old" ] || exit 0; '  # sshd held no socket of its own (socket activation)
        f"{want}; for attempt in $(seq {seconds * 10}); do {now}; "
        f"if {same} && {gone}; then exit 0; fi; sleep 0.1; done; "
        f'echo "sshd does not listen again on port $want after {seconds} s" >&2; exit 1'
    )


@operation()
def reload_sshd():
    """Reload sshd for its new configuration, where it runs, and wait until it listens again
    (see `reload_sshd_command`): the next connection, this run's or anyone's, is not refused."""
    yield reload_sshd_command()


UNIT_DIR = "/etc/systemd/system"


def wants_link(unit: str, target: str) -> str:
    """The symlink `systemctl enable` makes for a unit of /etc/systemd/system whose [Install]
    section says WantedBy=`target`."""
    return f"{UNIT_DIR}/{target}.wants/{unit}"


def wanted_by(unit_text: str) -> str:
    """The one target a unit's [Install] section wants it by: the only symlink `systemctl
    enable` makes for it. Any other [Install] line (RequiredBy, Alias, Also, a second target)
    is refused, since boot_wanted would not see what enable makes for it."""
    section = unit_text.split("\n[Install]\n", 1)[-1].split("\n[", 1)[0]
    lines = [line for line in section.splitlines() if line.strip() and line[0] not in "#;"]
    if "\n[Install]\n" not in unit_text or len(lines) != 1 or not lines[0].startswith("WantedBy="):
        raise ValueError(f"[Install] is not one WantedBy= line: {lines}")
    return lines[0].removeprefix("WantedBy=").strip()


@operation()
def boot_wanted(unit: str, target: str):
    """Enable one of gpuinfra's own units at boot (`target`: `wanted_by` of its file), without
    starting it: enabled is the symlink `systemctl enable` makes, read as pyinfra's file facts
    read any path (one batched `stat` in drift's probe, where a unit's state costs its own
    GetAll from systemd)."""
    link = host.get_fact(Link, path=wants_link(unit, target))
    if link and link.get("link_target") == f"{UNIT_DIR}/{unit}":
        host.noop(f"{unit} is wanted by {target}")
        return
    yield f"systemctl enable {shlex.quote(unit)}"


def enable_at_boot(unit_file: ManagedFile, name: str) -> None:
    """boot_wanted for one of gpuinfra's unit files, the unit named by its path and the target
    read from its own [Install] section (wanted_by)."""
    unit = posixpath.basename(unit_file.path)
    boot_wanted(name=name, unit=unit, target=wanted_by(unit_file.content))


@operation()
def system_account(user: str, group: str, home: str, shell: str = "/usr/sbin/nologin"):
    """A system user with its own primary group, the home it is given and no login, for a
    service to run as (what pyinfra's server.group and server.user with system=True make,
    from two getent lookups instead of every user's lastlog)."""
    gid = host.get_fact(GroupEntry, group=group)
    if gid is None:
        yield f"groupadd --system {shlex.quote(group)}"
    account = host.get_fact(Account, user=user)
    if account is None:
        yield (
            f"useradd --system --gid {shlex.quote(group)} --home-dir {shlex.quote(home)} "
            f"--no-create-home --shell {shlex.quote(shell)} {shlex.quote(user)}"
        )
        return
    changes = []
    if gid is None or account["gid"] != gid:
        changes += ["--gid", group]
    if account["home"] != home:
        changes += ["--home", home]
    if account["shell"] != shell:
        changes += ["--shell", shell]
    if changes:
        yield shlex.join(["usermod", *changes, user])


@operation()
def live_hostname(hostname: str):
    """Set the running hostname (the /etc/hostname file is a managed file of its own)."""
    if host.get_fact(NodeName) != hostname:
        yield f"hostname {hostname}"


def report_note(message: str) -> None:
    """Say why an operation did nothing on this host (a container forbids it, a module is not
    installed yet): logged like pyinfra's noop and collected into the run report's host notes."""
    host.noop(message)
    # An ordered dict: the note once, though the body runs again while executing.
    record.host(host.name).notes[message] = None


REBOOT_FLAG = "/run/reboot-required"


def reboot_flag_commands(reason: str) -> list[str]:
    """Shell commands for Debian's reboot convention: the flag file, and the reason (a package
    name, by convention) once in the .pkgs list."""
    pkgs = shlex.quote(f"{REBOOT_FLAG}.pkgs")
    quoted = shlex.quote(reason)
    return [
        f"echo '*** System restart required ***' > {REBOOT_FLAG}",
        f"grep -qxF {quoted} {pkgs} 2>/dev/null || echo {quoted} >> {pkgs}",
    ]


@operation()
def reboot_required(reason: str):
    """Mark the host "reboot required" (hang it off the change that needs the reboot with
    `_if`); `gpuinfra apply --reboot` reboots marked hosts in rolling batches."""
    if reason in (host.get_fact(RebootReasons) or []):
        host.noop(f"reboot already required for {reason}")
        return
    yield from reboot_flag_commands(reason)


def wait_for(command: str, seconds: int = 60) -> str:
    """A shell loop that retries a readiness probe once a second until it passes or time is up
    (daemons answer a moment after `systemctl restart` or a reload signal returns)."""
    return (
        f"for attempt in $(seq {seconds}); do {command} && exit 0; sleep 1; done; "
        f"echo {shlex.quote(f'not ready after {seconds} s: {command}')} >&2; exit 1"
    )
