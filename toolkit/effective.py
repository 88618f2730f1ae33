"""What the host will do, beside gpuinfra's own files: checks of the effective state that a file
gpuinfra does not own can change (a drop-in under a unit's `.d/` folder, an apt source, an
sshd setting read before ours, a second nftables table). Each role asks the facts of its own
services and hands what it finds to `nothing_overrides`.

A finding is a drift: plan and drift list the check as a pending change, with the findings
as its text (the runner shows them where a file would show its diff), and an apply stops the
host there with the same text, since removing a file somebody else wrote is the operator's
call. A file a site adds on purpose is declared in the inventory (`base.site_files`) and then
is no finding. Its facts are recorded like any other, so the drift fast path sends a host whose
answers moved to the exact check, which judges them."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.api.operation import OperationMeta

from toolkit import record
from toolkit.dropins import dropins_command, unit_name
from toolkit.pyinfra_api import op_hash
from toolkit.spec import HostContext

# Where systemd reads drop-ins that an administrator or a runtime command made; /usr/lib and
# /lib hold the packages' own, which the package pins decide.
ADMIN_DROPIN_ROOTS = ("/etc/", "/run/")


class UnitDropIns(FactBase):
    """Each unit's drop-in files, as systemd loaded them, and whether each carries gpuinfra's
    marker in its first lines: `{"etcd.service": {"/etc/systemd/system/etcd.service.d/x.conf":
    False}}`. A unit that does not exist has no entry."""

    @staticmethod
    def default():
        return {}

    def command(self, units: tuple[str, ...]) -> str:
        return dropins_command(units)

    def process(self, output: list[str]) -> dict[str, dict[str, bool]]:
        units: dict[str, dict[str, bool]] = {}
        unit, loaded = None, False
        for line in output:
            kind, _, value = line.partition(" ")
            if kind == "unit":
                unit, loaded = value, False
            elif kind == "load":
                loaded = value not in ("not-found", "")
                if loaded and unit:
                    units[unit] = {}
            elif kind in ("ours", "other") and unit and loaded:
                units[unit][value] = kind == "ours"
        return units


def foreign_dropins(found: dict[str, dict[str, bool]], allowed: Iterable[str]) -> list[str]:
    """A finding for each administrator's or runtime drop-in of the units that is not among
    `allowed` (`ours_or_declared`: the paths gpuinfra renders and the site's). Judged by path:
    the marker a foreign file may have copied into its first lines proves nothing."""
    kept = set(allowed)
    return [
        f"{unit}: drop-in {path} is not gpuinfra's and changes the unit "
        "(remove it, or declare it in base.site_files)"
        for unit, paths in sorted(found.items())
        for path in sorted(paths)
        if path.startswith(ADMIN_DROPIN_ROOTS) and path not in kept
    ]


@operation()
def _overrides(findings: tuple[str, ...]):
    if not findings:
        host.noop("nothing overrides gpuinfra's settings")
        return
    text = "; ".join(findings)
    yield f"echo {shlex.quote(f'overridden: {text}')} >&2; exit 1"


def nothing_overrides(name: str, findings: Iterable[str]) -> OperationMeta:
    """The check as an operation: a no-op without findings; with findings, a pending change in
    plan and drift (the findings as its text) and a failure in apply that names them."""
    found = tuple(findings)
    meta = _overrides(name=name, findings=found)
    if found:
        # Kept by operation hash, as a managed file is, for the runner to show.
        record.host(host.name).details[op_hash(meta)] = "\n".join(found)
    return meta


def unit_dropins(name: str, units: Iterable[str], allowed: Iterable[str]) -> OperationMeta:
    """`nothing_overrides` for the drop-ins of a role's units (`allowed`: `ours_or_declared`)."""
    asked = tuple(sorted(map(unit_name, units)))
    found = host.get_fact(UnitDropIns, units=asked) or {}
    return nothing_overrides(name, foreign_dropins(found, allowed))


def declared_files(settings: object) -> tuple[str, ...]:
    """The files a site declared on purpose (base.site_files), from a host's base settings."""
    return tuple(posixpath.normpath(path) for path in getattr(settings, "site_files", ()))


def ours_or_declared(ctx: HostContext) -> tuple[str, ...]:
    """The paths no foreign-file check reports on the host: every file a role of gpuinfra
    renders there (by path, whatever its first lines say) and the site's declared files."""
    return (*sorted(ctx.rendered_paths()), *declared_files(ctx.settings_of("base")))


def on_existing_files(globs: str, command: str) -> str:
    """Shell text that runs `command` once with every regular file `globs` names as its
    arguments, in order, and nothing when there is none (one process where a loop started one
    or two per file)."""
    return (
        f'set --; for f in {globs}; do [ -f "$f" ] && set -- "$@" "$f"; done; '
        f'[ $# -eq 0 ] || {command} "$@"'
    )


class ConfDirSettings(FactBase):
    """The lines that set `keys` in a configuration read from several folders where the later
    file wins (systemd-sysctl's sysctl.d, systemd's system.conf.d): `[(path, key, value)]` in
    the order of `folders` (a name in an earlier folder hides the same name in a later one;
    the files are read by name across the folders, which `later_file_wins` sorts by). The main
    file (system.conf) is read before every one of them and cannot win over ours."""

    def command(self, folders: tuple[str, ...], keys: tuple[str, ...]) -> str:
        pattern = "|".join(key.replace(".", "[./]") for key in keys)
        globs = " ".join(f"{folder}/*.conf" for folder in folders)
        # One awk: a name already seen in an earlier folder is left out, then each line that
        # sets a key is printed as `grep -H` prints it.
        program = (
            'BEGIN { for (i = 1; i < ARGC; i++) { n = ARGV[i]; sub(/.*\\//, "", n); '
            'if (n in seen) ARGV[i] = ""; seen[n] = 1 } } '
            '$0 ~ p { print FILENAME ":" $0 }'
        )
        awk = f"awk -v p='^[[:space:]]*-?({pattern})[[:space:]]*=' {shlex.quote(program)}"
        return on_existing_files(globs, awk) + "; true"

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[tuple[str, str, str]]:
        found = []
        for line in output:
            path, _, setting = line.partition(":")
            key, _, value = setting.partition("=")
            key = key.strip().lstrip("-").replace("/", ".")
            found.append((path, key, " ".join(value.split())))
        return found


def later_file_wins(
    found: list[tuple[str, str, str]],
    ours_path: str,
    ours: dict[str, str],
    label: str,
) -> list[str]:
    """A finding for each of our keys that a file read after ours sets to another value: the
    last value read wins, and files are read by name. Ours is placed by its name, written or
    not, so a plan before the first apply judges as a drift after it."""
    name = posixpath.basename(ours_path)
    findings = []
    for key, value in ours.items():
        later = [
            (path, other)
            for path, k, other in found
            if k == key and path != ours_path and posixpath.basename(path) > name
        ]
        later.sort(key=lambda entry: posixpath.basename(entry[0]))  # stable: lines in order
        if later and later[-1][1] != " ".join(value.split()):
            path, other = later[-1]
            findings.append(
                f"{label}: {key} = {other} set in {path} wins over gpuinfra's {value} "
                "at the next boot"
            )
    return findings


def assignments(text: str) -> dict[str, str]:
    """The `key = value` lines of a file gpuinfra renders (sysctl.d, system.conf.d), without
    comments and section headers."""
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith(("#", ";", "[")):
            pairs[key.strip().lstrip("-").replace("/", ".")] = " ".join(value.split())
    return pairs


def overridden_later(
    name: str, folders: tuple[str, ...], ours_path: str, ours_text: str, declared, label: str
) -> OperationMeta:
    """`nothing_overrides` for a file of ours in a folder where the later file wins."""
    ours = assignments(ours_text)
    found = host.get_fact(ConfDirSettings, folders=folders, keys=tuple(sorted(ours))) or []
    kept = [entry for entry in found if entry[0] not in set(declared)]
    return nothing_overrides(name, later_file_wins(kept, ours_path, ours, label))


LIMITS_DIR = "/etc/security/limits.d"


def limit_lines(text: str) -> dict[tuple[str, str, str], str]:
    """The `domain type item value` lines of a pam_limits file, by (domain, type, item); `-`
    (both soft and hard) stands for the two."""
    pairs = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 4 and not words[0].startswith("#"):
            domain, kind, item, value = words
            for one in ("soft", "hard") if kind == "-" else (kind,):
                pairs[(domain, one, item.lower())] = value
    return pairs


class LimitsSettings(FactBase):
    """The lines of limits.d's files that set one of `items`: `[(path, domain, type, item,
    value)]`, files in name order (pam_limits reads limits.conf, then these)."""

    def command(self, items: tuple[str, ...]) -> str:
        words = "|".join(items)
        awk = (
            f"awk -v p='^[[:space:]]*[^#[:space:]]+[[:space:]]+[^[:space:]]+[[:space:]]+({words})"
            "[[:space:]]' '$0 ~ p { print FILENAME \" \" $0 }'"
        )
        return on_existing_files(f"{LIMITS_DIR}/*.conf", awk) + "; true"

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[tuple[str, str, str, str, str]]:
        found = []
        for line in output:
            path, _, rest = line.partition(" ")
            for (domain, kind, item), value in limit_lines(rest).items():
                found.append((path, domain, kind, item, value))
        return found


def limits_overridden(
    found: list[tuple[str, str, str, str, str]], ours_path: str, ours_text: str, declared
) -> list[str]:
    """A finding for each of our limits that a limits.d file read after ours sets to another
    value for the same domain: pam_limits keeps the last one it reads."""
    name = posixpath.basename(ours_path)
    findings = []
    for (domain, kind, item), value in limit_lines(ours_text).items():
        later = [
            (path, other)
            for path, d, k, i, other in found
            if (d, k, i) == (domain, kind, item)
            and posixpath.basename(path) > name
            and path not in set(declared)
        ]
        if later and later[-1][1] != value:
            path, other = later[-1]
            findings.append(
                f"limits: {domain} {kind} {item} {other} set in {path} wins over gpuinfra's "
                f"{value} at the next login (remove it, or declare it in base.site_files)"
            )
    return findings


def limits_not_overridden(name: str, ours_path: str, ours_text: str, declared) -> OperationMeta:
    """`nothing_overrides` for a limits.d file of ours."""
    items = tuple(sorted({item for _, _, item in limit_lines(ours_text)}))
    found = host.get_fact(LimitsSettings, items=items) or []
    return nothing_overrides(name, limits_overridden(found, ours_path, ours_text, declared))


GRUB_DIR = "/etc/default/grub.d"
_GRUB_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?(GRUB_[A-Z0-9_]+)=(.*)$")


def grub_assignments(text: str) -> dict[str, str]:
    """The `GRUB_...=` lines of a grub.d file (the last one of each variable)."""
    pairs = {}
    for line in text.splitlines():
        found = _GRUB_ASSIGNMENT.match(line)
        if found:
            pairs[found[1]] = found[2].strip()
    return pairs


class GrubAssignments(FactBase):
    """The lines of grub.d's files that assign one of `names`: `[(path, name, value)]`, files
    in name order (update-grub sources /etc/default/grub, then these, in order)."""

    def command(self, names: tuple[str, ...]) -> str:
        pattern = f"^[[:space:]]*(export[[:space:]]+)?({'|'.join(names)})="
        grep = f"grep -H -E {shlex.quote(pattern)}"
        return on_existing_files(f"{GRUB_DIR}/*.cfg", grep) + "; true"

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[tuple[str, str, str]]:
        found = []
        for line in output:
            path, _, setting = line.partition(":")
            found += [(path, name, value) for name, value in grub_assignments(setting).items()]
        return found


def grub_overridden(found: list[tuple[str, str, str]], ours_path: str, declared) -> list[str]:
    """A finding for each grub.d file read after ours that sets one of our variables without
    keeping what came before it (`$NAME`): update-grub would drop gpuinfra's arguments."""
    name = posixpath.basename(ours_path)
    return [
        f"grub: {var} set in {path} drops gpuinfra's arguments at the next update-grub "
        f"(keep ${var} in it, remove it, or declare it in base.site_files)"
        for path, var, value in found
        if posixpath.basename(path) > name
        and path not in set(declared)
        and f"${var}" not in value
        and f"${{{var}}}" not in value
    ]


class FilesMatching(FactBase):
    """Every regular file a glob names, whatever it holds: `["/etc/containerd/conf.d/a.toml"]`
    (a file is told from gpuinfra's by its path, not by a marker it may have copied)."""

    def command(self, pattern: str) -> str:
        return on_existing_files(pattern, "printf '%s\\n'")

    @staticmethod
    def default() -> list[str]:
        return []

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line.strip()]


def foreign_files(found: Iterable[str], allowed: Iterable[str], why: str) -> list[str]:
    """A finding saying `why` for each file found that is not among `allowed`."""
    kept = set(allowed)
    return [
        f"{path} is not gpuinfra's: {why} (remove it, or declare it in base.site_files)"
        for path in found
        if path not in kept
    ]


def only_ours(name: str, pattern: str, allowed: Iterable[str], why: str) -> OperationMeta:
    """`nothing_overrides` for a folder a service reads every file of (`pattern`, a glob):
    a file that is not among `allowed` (`ours_or_declared`) is a finding saying `why`."""
    found = host.get_fact(FilesMatching, pattern=pattern) or []
    return nothing_overrides(name, foreign_files(found, allowed, why))


# Where modprobe (and systemd-modules-load, through libkmod) reads its configuration, in the
# order kmod gives same-named files precedence; every file counts for blacklist and install.
MODPROBE_CONF_DIRS = (
    "/etc/modprobe.d",
    "/run/modprobe.d",
    "/usr/local/lib/modprobe.d",
    "/usr/lib/modprobe.d",
    "/lib/modprobe.d",
)


def module_pattern(name: str) -> str:
    """kmod treats `-` and `_` in a module's name as one: a pattern for either spelling."""
    return "[-_]".join(re.escape(part) for part in re.split(r"[-_]", name))


class ModprobeBlocks(FactBase):
    """The `blacklist` and `install` lines of modprobe.d's files that name one of `modules`:
    `[(path, line)]`."""

    def command(self, modules: tuple[str, ...]) -> str:
        words = "|".join(module_pattern(m) for m in modules)
        awk = (
            f"awk -v p='^[[:space:]]*(blacklist|install)[[:space:]]+({words})([[:space:]]|$)' "
            "'$0 ~ p { print FILENAME \" \" $0 }'"
        )
        globs = " ".join(f"{folder}/*.conf" for folder in MODPROBE_CONF_DIRS)
        return on_existing_files(globs, awk) + "; true"

    @staticmethod
    def default() -> list:
        return []

    def process(self, output: list[str]) -> list[tuple[str, str]]:
        return [
            (path, rest.strip())
            for path, _, rest in (line.partition(" ") for line in output)
            if rest.strip()
        ]


def modules_blocked(found: list[tuple[str, str]], declared) -> list[str]:
    """A finding for each line that keeps one of our modules from loading: a `blacklist`
    (systemd-modules-load applies it) or an `install` command that never runs modprobe."""
    findings, declared = [], set(declared)
    for path, line in found:
        if path in declared:
            continue
        words = line.split()
        if words[0] == "install" and any("modprobe" in word for word in words[2:]):
            continue
        findings.append(
            f"modprobe: '{line}' in {path} keeps {words[1]} from loading at boot (remove it, "
            "or declare it in base.site_files)"
        )
    return findings
