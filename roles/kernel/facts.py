"""Facts the kernel role reads: live sysctls, kernel modules, swap, sysfs settings, packages."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from toolkit.facts import lines_of


def sysctl_path(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")


class SysctlState(FactBase):
    """name -> (access, value): access is "rw", "ro" (read-only here, e.g. global sysctls in a
    container) or "absent" (the module providing it is not loaded); value has its whitespace
    folded to single spaces.

    One process for every key: the shell's builtins say each file's access, then one `grep`
    prints every line of every file as "path:line" (a `cat` per key cost a process each; dash's
    `read` gets one byte of a /proc/sys file)."""

    def command(self, names: list[str]) -> str:
        if not names:
            return "true"
        lines = []
        for name in names:
            path = shlex.quote(sysctl_path(name))
            quoted = shlex.quote(name)
            lines.append(
                f"if [ ! -e {path} ]; then a=absent; elif [ -w {path} ]; then a=rw; else a=ro; fi; "
                f"printf '%s\\t%s\\n' {quoted} \"$a\""
            )
        paths = " ".join(shlex.quote(sysctl_path(name)) for name in names)
        return "; ".join(lines) + f"; grep -a -s -H '' {paths} || true"

    def process(self, output: list[str]) -> dict[str, tuple[str, str]]:
        access: dict[str, str] = {}
        for line in output:
            if "\t" in line and not line.startswith("/proc/sys/"):
                name, _, found = line.partition("\t")
                access[name] = found.strip()
        lines = grep_lines(output, [sysctl_path(name) for name in access])

        def value(name: str) -> str:
            return " ".join(" ".join(lines.get(sysctl_path(name), [])).split())

        return {
            name: (found, "" if found == "absent" else value(name))
            for name, found in access.items()
        }


def grep_lines(output: list[str], paths: list[str]) -> dict[str, list[str]]:
    """path -> its lines, from `grep -H ''` output ("path:line") among other lines: each line
    goes to the longest of `paths` it starts with (a path may hold ":")."""
    found: dict[str, list[str]] = {}
    for line in output:
        path = max((p for p in paths if line.startswith(p + ":")), key=len, default=None)
        if path is not None:
            found.setdefault(path, []).append(line[len(path) + 1 :])
    return found


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


def swaps_command(path: str = "/proc/swaps") -> str:
    """The first field of each line of a /proc/swaps-shaped file after its heading, with shell
    builtins (once `sed 1d | cut -d' ' -f1`: two processes). The kernel escapes a space, tab or
    backslash in a name as an octal code, so the first field is the name; printf, unlike dash's
    echo, prints that code as it is."""
    return (
        f"{{ read -r _; while read -r name _; do printf '%s\\n' \"$name\"; done; }} "
        f"2>/dev/null < {path} || true"
    )


class ActiveSwap(FactBase):
    """Swap devices and files in use (from /proc/swaps, which needs no util-linux)."""

    def command(self) -> str:
        return swaps_command()

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


class SysfsValues(FactBase):
    """path -> (access, value) for each file matching a glob; a bracketed choice
    ("always [madvise] never") is read as the chosen word. One `grep` reads every file (a
    `cat` per file cost a process per CPU for the CPU governors)."""

    def command(self, pattern: str) -> str:
        return (
            f'set --; for f in {pattern}; do [ -e "$f" ] || continue; '
            'if [ -w "$f" ]; then a=rw; else a=ro; fi; '
            'printf \'access\\t%s\\t%s\\n\' "$f" "$a"; set -- "$@" "$f"; done; '
            "[ $# -eq 0 ] || grep -a -s -H '' \"$@\" || true"
        )

    def process(self, output: list[str]) -> dict[str, tuple[str, str]]:
        access: dict[str, str] = {}
        for line in output:
            if line.startswith("access\t"):
                _, path, found = (line.split("\t") + ["", ""])[:3]
                access[path] = found
        lines = grep_lines(
            [line for line in output if not line.startswith("access\t")], list(access)
        )
        return {
            path: (found, chosen_value(" ".join(lines.get(path, []))))
            for path, found in access.items()
        }


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
        return lines_of("/etc/fstab")

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if is_swap_entry(line)]


def is_swap_entry(line: str) -> bool:
    fields = line.split()
    return len(fields) >= 3 and not fields[0].startswith("#") and fields[2] == "swap"
