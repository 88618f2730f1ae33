"""Facts shared by several roles: small pyinfra fact classes (a command and how to read it)."""

from __future__ import annotations

from pyinfra.api import FactBase


def lines_of(path: str) -> str:
    """What `cat PATH 2>/dev/null || true` prints, line by line, with shell builtins: each line
    as it is (no field splitting, backslashes kept), the last one also without its newline;
    nothing, and success, when the file cannot be read. A process fewer on every host."""
    return (
        '{ while IFS= read -r line || [ -n "$line" ]; do printf \'%s\\n\' "$line"; done; } '
        f"2>/dev/null < {path} || true"
    )


class NodeName(FactBase):
    """The running host name: what `uname -n` prints (the kernel's name for this UTS
    namespace), read from /proc with the shell's `read`, no process. (pyinfra's Hostname fact
    runs `uname -n`.)"""

    def command(self) -> str:
        return "read -r name < /proc/sys/kernel/hostname && printf '%s\\n' \"$name\""

    def process(self, output: list[str]) -> str | None:
        return output[0] if output else None


class HeldPackages(FactBase):
    """The packages dpkg is told to hold, named as `apt-mark showhold` names them (sorted): with
    ":arch" only when that is neither the host's own architecture nor "all". Read from dpkg's
    database, which apt-mark reads through apt's cache at about 28 ms of the host's CPU a call
    (4 ms for these two dpkg commands, measured on a lab host)."""

    default = list

    def command(self) -> str:
        return (
            "dpkg --print-architecture 2>/dev/null; "
            "dpkg-query -W -f='${db:Status-Want} ${Package} ${Architecture}\\n' 2>/dev/null "
            "|| true"
        )

    def process(self, output: list[str]) -> list[str]:
        native = output[0].strip() if output else ""
        held = []
        for line in output[1:]:
            want, _, rest = line.strip().partition(" ")
            name, _, arch = rest.partition(" ")  # no architecture: a package not installed
            if want == "hold" and name:
                held.append(name if arch in ("", "all", native) else f"{name}:{arch}")
        return sorted(held)


class Container(FactBase):
    """The container technology the host runs in ("systemd-nspawn", "docker"...), or None."""

    def command(self) -> str:
        return "systemd-detect-virt --container || true"

    def process(self, output: list[str]) -> str | None:
        value = output[0].strip() if output else "none"
        return None if value in ("", "none") else value


class UnitState(FactBase):
    """Whether a systemd unit is enabled and active; None when the unit does not exist.
    (pyinfra's SystemdStatus and SystemdEnabled answer active and enabled in two round trips
    and cannot tell a missing unit from a stopped one, which `service_running` must.)"""

    def command(self, unit: str) -> str:
        return (
            f"systemctl show --property=LoadState,ActiveState,UnitFileState {unit} 2>/dev/null "
            "|| true"
        )

    def process(self, output: list[str]) -> dict[str, str] | None:
        state = dict(line.split("=", 1) for line in output if "=" in line)
        if state.get("LoadState") in (None, "not-found"):
            return None
        return state


REBOOT_FLAGS = ("/var/run/reboot-required", "/var/run/reboot-required.pkgs")


def reboot_required_command(flags: tuple[str, ...]) -> str:
    tests = " || ".join(f"[ -f {flag} ]" for flag in flags)
    return f"if {tests}; then echo yes; else echo no; fi"


class RebootRequired(FactBase):
    """Whether the host waits for a reboot: the flag files that Debian's and Ubuntu's packages
    (and gpuinfra's roles) leave. Shell builtins only: pyinfra's fact of the same name also
    covers Alpine and FreeBSD, at the cost of a `uname` process on every host and every run."""

    def command(self) -> str:
        return reboot_required_command(REBOOT_FLAGS)

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"


class RebootReasons(FactBase):
    """What asked for the reboot: the lines of /run/reboot-required.pkgs."""

    def command(self) -> str:
        return lines_of("/run/reboot-required.pkgs")

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


class Account(FactBase):
    """A user's passwd entry (getent: local files and NSS alike), or None when there is none.
    (pyinfra's Users fact reads every user's lastlog and groups: half a second on a host.)"""

    def command(self, user: str) -> str:
        return f"getent passwd {user} || true"

    def process(self, output: list[str]) -> dict[str, str] | None:
        fields = output[0].split(":") if output else []
        if len(fields) != 7:
            return None
        return {"uid": fields[2], "gid": fields[3], "home": fields[5], "shell": fields[6]}


class GroupEntry(FactBase):
    """A group's entry: its gid, or None when there is no such group."""

    def command(self, group: str) -> str:
        return f"getent group {group} || true"

    def process(self, output: list[str]) -> str | None:
        fields = output[0].split(":") if output else []
        return fields[2] if len(fields) == 4 else None


class SupplementaryGroups(FactBase):
    """The groups a user is in beyond its primary one: `["docker"]`; None without the user."""

    def command(self, user: str) -> str:
        return f"id -Gn {user} 2>/dev/null && id -gn {user} 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str] | None:
        if len(output) < 2:
            return None
        primary = output[1].strip()
        return [group for group in output[0].split() if group != primary]
