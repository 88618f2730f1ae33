"""Facts the kernel role reads: live sysctls, kernel modules, swap, sysfs settings, packages."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


def sysctl_path(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")


class SysctlState(FactBase):
    """name -> (access, value): access is "rw", "ro" (read-only here, e.g. global sysctls in a
    container) or "absent" (the module providing it is not loaded); value has its whitespace
    folded to single spaces."""

    def command(self, names: list[str]) -> str:
        lines = []
        for name in names:
            path = shlex.quote(sysctl_path(name))
            quoted = shlex.quote(name)
            lines.append(
                f"if [ ! -e {path} ]; then printf '%s\\tabsent\\t\\n' {quoted}; "
                f"else access=ro; [ -w {path} ] && access=rw; "
                # One cat per key (not tr and sed), the words joined by single spaces by the
                # shell (dash's `read` gets one byte of a /proc/sys file).
                f"v=$(cat {path}); "
                f'set -f; set -- $v; printf \'%s\\t%s\\t%s\\n\' {quoted} "$access" "$*"; fi'
            )
        return "; ".join(lines) or "true"

    def process(self, output: list[str]) -> dict[str, tuple[str, str]]:
        state = {}
        for line in output:
            name, access, value = (line.split("\t") + ["", ""])[:3]
            state[name] = (access, value.strip())
        return state


class KernelModules(FactBase):
    """module -> "loaded" (or built in), "available" (modprobe would find it) or "missing"."""

    def command(self, modules: list[str]) -> str:
        lines = []
        for module in modules:
            sys_name = shlex.quote("/sys/module/" + module.replace("-", "_"))
            quoted = shlex.quote(module)
            lines.append(
                f"if [ -d {sys_name} ]; then echo {quoted} loaded; "
                f"elif modinfo {quoted} >/dev/null 2>&1; then echo {quoted} available; "
                f"else echo {quoted} missing; fi"
            )
        return "; ".join(lines) or "true"

    def process(self, output: list[str]) -> dict[str, str]:
        return dict(line.split(" ", 1) for line in output if " " in line)


class ActiveSwap(FactBase):
    """Swap devices and files in use (from /proc/swaps, which needs no util-linux)."""

    def command(self) -> str:
        return "sed 1d /proc/swaps | cut -d' ' -f1"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


class SysfsValues(FactBase):
    """path -> (access, value) for each file matching a glob; a bracketed choice
    ("always [madvise] never") is read as the chosen word."""

    def command(self, pattern: str) -> str:
        return (
            f'for f in {pattern}; do [ -e "$f" ] || continue; access=ro; '
            '[ -w "$f" ] && access=rw; printf \'%s\\t%s\\t%s\\n\' "$f" "$access" "$(cat "$f")"; '
            "done"
        )

    def process(self, output: list[str]) -> dict[str, tuple[str, str]]:
        values = {}
        for line in output:
            path, access, value = (line.split("\t") + ["", ""])[:3]
            values[path] = (access, chosen_value(value))
        return values


def chosen_value(text: str) -> str:
    """ "always [madvise] never" -> "madvise"; a plain value is returned as it is."""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text.strip()


class PackageVersion(FactBase):
    """The installed version of a Debian package and whether it is held; None if not installed."""

    def command(self, package: str) -> str:
        quoted = shlex.quote(package)
        return (
            f"dpkg-query -W -f='${{db:Status-Abbrev}} ${{Version}}\\n' {quoted} 2>/dev/null; "
            f"echo held=$(apt-mark showhold {quoted} 2>/dev/null)"
        )

    def process(self, output: list[str]) -> dict[str, object] | None:
        version = None
        held = False
        for line in output:
            if line.startswith("held="):
                held = bool(line[len("held=") :].strip())
            elif line.startswith("ii "):
                version = line.split()[-1]
        if version is None:
            return None
        return {"version": version, "held": held}


class SwapInFstab(FactBase):
    """Active (uncommented) swap entries in /etc/fstab."""

    def command(self) -> str:
        return "cat /etc/fstab 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if is_swap_entry(line)]


def is_swap_entry(line: str) -> bool:
    fields = line.split()
    return len(fields) >= 3 and not fields[0].startswith("#") and fields[2] == "swap"
