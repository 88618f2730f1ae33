"""What sshd and apt will do, beside the base role's own files: an sshd setting read before ours
(sshd keeps the first value it reads of most keywords), an apt source or pin gpuinfra did not
write, ssh left off at boot. See toolkit/effective.py for how a finding is reported."""

from __future__ import annotations

import base64
import binascii
import hashlib
import posixpath
import re
import shlex
from collections.abc import Iterable
from pathlib import Path

from pyinfra.api import FactBase

from toolkit.effective import on_existing_files

SSHD_CONFIG = "/etc/ssh/sshd_config"
SSHD_DROPINS = "/etc/ssh/sshd_config.d"
PASSWD = "/etc/passwd"
# sshd -T prints some values under another name than the one a file may use.
SSHD_SYNONYMS = {"prohibit-password": "without-password"}
# Keywords sshd takes every value of, not the first: another file adds to ours.
SSHD_CUMULATIVE = frozenset({"port"})


def sshd_settings(text: str) -> dict[str, str]:
    """The keyword -> value pairs of an sshd configuration file (keywords in lower case)."""
    pairs: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split(None, 1)
        if words and not words[0].startswith("#") and len(words) == 2:
            pairs.setdefault(words[0].lower(), words[1].strip())
    return pairs


def _normal(value: str) -> str:
    value = value.strip().lower()
    return SSHD_SYNONYMS.get(value, value)


class SshdSettings(FactBase):
    """The effective values of `keys` (`sshd -T`) and every line of the configuration files
    that sets one of them, in the files' own order:
    `{"effective": {"passwordauthentication": ["no"]}, "lines": [(path, keyword, value), ...],
    "files": [paths]}`. Include and Match lines are kept too: they decide the order."""

    @staticmethod
    def default():
        return {"effective": {}, "lines": [], "files": [], "matched": {}}

    def command(
        self,
        keys: tuple[str, ...],
        connections: tuple[str, ...] = (),
        others: tuple[str, tuple[str, ...]] | None = None,
    ) -> str:
        """`connections`: `sshd -C` specs (user=,host=,addr=) whose Match blocks are judged too:
        their values under "matched". `others`: (host, addresses) to judge, as well, for every
        other user who may log in (login_users_command) but those of `connections`."""
        words = "|".join(keys)
        matched = "".join(
            f"sshd -T -C {shlex.quote(spec)} 2>/dev/null | awk -v p='^({words}) ' -v c="
            f'{shlex.quote(spec)} \'tolower($0) ~ p {{ print "match " c " " $0 }}\'; '
            for spec in connections
        )
        if others is not None:
            host, addresses = others
            known = sorted({part[5:] for spec in connections for part in spec.split(",")
                            if part.startswith("user=")})  # fmt: skip
            unknown = "".join(f" -e {shlex.quote(user)}" for user in known) or " -e ''"
            spec = f'"user=$u"{shlex.quote(f",host={host},addr=")}"$a"'
            matched += (
                f"for u in $({login_users_command()} | grep -vxF{unknown}); do "
                f"for a in {' '.join(shlex.quote(a) for a in addresses)}; do "
                f"sshd -T -C {spec} 2>/dev/null | awk -v p='^({words}) ' -v c={spec} "
                '\'tolower($0) ~ p { print "match " c " " $0 }\'; done; done; '
            )
        # One awk reads every file (a `file` line for each, empty ones too, in order).
        program = (
            "BEGIN { i = 1 } "
            'FNR == 1 { while (i < ARGC && ARGV[i] != FILENAME) print "file " ARGV[i++]; '
            'print "file " ARGV[i++] } '
            'tolower($0) ~ p { print "line " $0 } '
            'END { while (i < ARGC) print "file " ARGV[i++] }'
        )
        lines = f"awk -v p='^[[:space:]]*({words}|include|match)[[:space:]]' {shlex.quote(program)}"
        return (
            f"sshd -T 2>/dev/null | awk -v p='^({words}) ' "
            "'tolower($0) ~ p { print \"effective \" $0 }'; "
            + matched
            + on_existing_files(f"{SSHD_CONFIG} {SSHD_DROPINS}/*.conf", lines)
        )

    def process(self, output: list[str]) -> dict:
        effective: dict[str, list[str]] = {}
        matched: dict[str, dict[str, list[str]]] = {}
        lines: list[tuple[str, str, str]] = []
        files: list[str] = []
        current = ""
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "effective":
                key, _, value = rest.partition(" ")
                effective.setdefault(key.lower(), []).append(value.strip())
            elif kind == "match":
                spec, _, setting = rest.partition(" ")
                key, _, value = setting.partition(" ")
                matched.setdefault(spec, {}).setdefault(key.lower(), []).append(value.strip())
            elif kind == "file":
                current = rest
                files.append(rest)
            elif kind == "line" and current:
                words = rest.split(None, 1)
                if words:
                    lines.append((current, words[0].lower(), words[1].strip() if words[1:] else ""))
        return {"effective": effective, "lines": lines, "files": files, "matched": matched}


def _read_order(found: dict, ours: str) -> list[tuple[str, str, str]]:
    """The setting lines in the order sshd reads them, with `ours` in its place among the
    drop-ins whether or not it is written yet: the main file up to its Include of the drop-in
    folder, the drop-ins in name order, then the rest of the main file. A line inside a Match
    block applies only to some connections and is left out."""
    by_file: dict[str, list[tuple[str, str, str]]] = {}
    for path, key, value in found["lines"]:
        by_file.setdefault(path, []).append((path, key, value))
    dropins = sorted({p for p in found["files"] if p != SSHD_CONFIG} | {ours})

    def unmatched(entries: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        kept = []
        for entry in entries:
            if entry[1] == "match":
                break
            kept.append(entry)
        return kept

    main = unmatched(by_file.get(SSHD_CONFIG, []))
    include = next(
        (i for i, e in enumerate(main) if e[1] == "include" and SSHD_DROPINS in e[2]), None
    )
    before, after = (main, []) if include is None else (main[:include], main[include + 1 :])
    ordered = list(before)
    if include is not None:
        for path in dropins:
            ordered += unmatched(by_file.get(path, [(ours, "", "")] if path == ours else []))
    return ordered + after


def sshd_findings(
    found: dict, ours_path: str, ours_text: str, declared: tuple[str, ...] = ()
) -> list[str]:
    """A finding for each of our keywords that another file decides: the first value sshd
    reads wins (every value counts for Port). With our file in place, `sshd -T` must also
    agree, which catches what the files alone do not show (an Include elsewhere). A keyword
    that a file the site declared sets is the site's choice, and not judged."""
    ours = sshd_settings(ours_text)
    chosen = {key for path, key, _ in found["lines"] if path in declared}
    ours = {key: value for key, value in ours.items() if key not in chosen}
    ordered = [e for e in _read_order(found, ours_path) if e[1] not in ("include", "match")]
    written = ours_path in found["files"]
    findings = []
    included = any(e[1] == "include" and SSHD_DROPINS in e[2] for e in found["lines"])
    if found["files"] and not included:
        return [f"sshd: {SSHD_CONFIG} does not include {SSHD_DROPINS}: gpuinfra's is not read"]
    for key, value in ours.items():
        setting = [e for e in ordered if e[1] == key or (e[0] == ours_path and e[1] == "")]
        if key in SSHD_CUMULATIVE:
            others = [e for e in setting if e[0] != ours_path and _normal(e[2]) != _normal(value)]
        else:
            first = next(iter(setting), None)
            others = [first] if first and first[0] != ours_path else []
            others = [e for e in others if _normal(e[2]) != _normal(value)]
        for path, _, other in others:
            findings.append(
                f"sshd: {key} {other} set in {path} wins over gpuinfra's {value} "
                "(remove it, or declare it in base.site_files)"
            )
        effective = [_normal(v) for v in found["effective"].get(key, [])]
        # sshd -T reads the files as they are: only while ours already says what it will say
        # (an apply that changes our value, the port say, rewrites ours first).
        as_written = [_normal(v) for path, k, v in found["lines"] if path == ours_path and k == key]
        settled = written and as_written == [_normal(value)]
        if settled and not others and effective and effective != [_normal(value)]:
            findings.append(
                f"sshd: sshd -T says {key} {' '.join(effective)}, gpuinfra's is {value}"
            )
        if settled and key not in SSHD_CUMULATIVE:
            findings += _match_findings(found, key, value, effective)
    return findings


# The connections whose Match blocks are judged (sshd -T -C): root and the inventory's SSH user,
# from an address outside every network (TEST-NET-3, never dialled: sshd only evaluates it)
# and from the host's own network.
OUTSIDE_ADDRESS = "203.0.113.1"


def match_connections(host: str, address: str, users: Iterable[str]) -> tuple[str, ...]:
    return tuple(
        f"user={user},host={host},addr={addr}"
        for user in dict.fromkeys(users)
        for addr in match_addresses(address)
    )


def match_addresses(address: str) -> tuple[str, ...]:
    """The addresses each user's Match blocks are judged from (see OUTSIDE_ADDRESS)."""
    return (OUTSIDE_ADDRESS, address)


# Shells that never give a session: an account with one logs nobody in over ssh.
NO_LOGIN_SHELLS = ("nologin", "false", "sync", "shutdown", "halt")
# A user name sshd -C is asked about: a plain name (a Match pattern, `!` or `*`, is not one).
_USER_NAME = "^[A-Za-z_][A-Za-z0-9_.-]*$"


def login_users_command() -> str:
    """Who else may log in, one name a line: each account of PASSWD with a login shell, and
    each plain name a `Match User` line spells out (an account sshd knows from elsewhere, LDAP
    say, is judged by the block that names it)."""
    shells = "|".join(NO_LOGIN_SHELLS)
    named = (
        'awk \'tolower($1) == "match" { for (i = 2; i < NF; i++) '
        'if (tolower($i) == "user") print $(i + 1) }\''
    )
    return (
        f"{{ awk -F: '$7 !~ /({shells})$/ {{ print $1 }}' {shlex.quote(PASSWD)} 2>/dev/null; "
        f"cat {shlex.quote(SSHD_CONFIG)} {shlex.quote(SSHD_DROPINS)}/*.conf 2>/dev/null | "
        f"{named} | "
        f"tr ',' '\\n'; }} | grep -E '{_USER_NAME}' | sort -u"
    )


def _match_findings(found: dict, key: str, value: str, effective: list[str]) -> list[str]:
    """A Match block that gives one of the judged connections another value of our keyword than
    ours (a value sshd -T already reports for every connection is named once, above)."""
    findings = []
    for spec, settings in found.get("matched", {}).items():
        values = [_normal(v) for v in settings.get(key, [])]
        if values and values != [_normal(value)] and values != effective:
            fields = dict(part.partition("=")[::2] for part in spec.split(","))
            findings.append(
                f"sshd: a Match block gives {fields.get('user')} from {fields.get('addr')} "
                f"{key} {' '.join(values)}, gpuinfra's is {value} (remove it, or declare its "
                "file in base.site_files)"
            )
    return findings


APT_SOURCES = "/etc/apt/sources.list.d"
APT_PREFERENCES = "/etc/apt/preferences.d"
# apt reads *.list and *.sources from sources.list.d, and files with no extension or .pref
# from preferences.d, of letters, digits, `_`, `-` and `.` only (apt.conf(5), apt_preferences(5)).
_APT_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def apt_reads(path: str) -> bool:
    folder, name = posixpath.split(path)
    if not _APT_NAME.match(name):
        return False
    if folder == APT_SOURCES:
        return name.endswith((".list", ".sources"))
    return "." not in name or name.endswith(".pref")


# The files apt reads its sources and pins from (toolkit.effective.FilesMatching lists them).
APT_FILES = f"{APT_SOURCES}/* {APT_PREFERENCES}/*"


def apt_findings(found: list[str], removed: tuple[str, ...], allowed: tuple[str, ...]) -> list:
    """A finding for each source or pin apt reads that gpuinfra does not render (by path),
    will not remove and the site did not declare (`allowed`: toolkit's `ours_or_declared`)."""
    return [
        f"apt: {path} is not gpuinfra's (remove it, or declare it in base.site_files)"
        for path in found
        if apt_reads(path) and path not in removed and path not in allowed
    ]


APT_CONF_DIR = "/etc/apt/apt.conf.d"
_APT_SETTING = re.compile(r'^\s*([A-Za-z0-9:_.-]+)\s+"([^"]*)"\s*;')
_APT_TRUE = frozenset({"1", "yes", "true", "with", "on", "enable"})


def apt_conf_settings(text: str) -> dict[str, str]:
    """The `Key "value";` lines of an apt.conf file gpuinfra renders (keys in lower case)."""
    pairs = {}
    for line in text.splitlines():
        found = _APT_SETTING.match(line)
        if found:
            pairs[found[1].lower()] = found[2]
    return pairs


class AptConfig(FactBase):
    """What apt makes of `keys` after reading every file (`apt-config dump`), and which files of
    apt.conf.d set them: `{"effective": {key: value}, "lines": [(path, key, value)]}`."""

    @staticmethod
    def default() -> dict:
        return {"effective": {}, "lines": []}

    def command(self, keys: tuple[str, ...]) -> str:
        words = "|".join(keys)  # letters, digits, `:`, `_`, `.` and `-`: literal enough
        grep = f"grep -H -i -E {shlex.quote(f'^[[:space:]]*({words})[[:space:]]')}"
        return (
            f"apt-config dump --format '%f=%v%n' {' '.join(map(shlex.quote, keys))} "
            "2>/dev/null | sed 's/^/effective /'; "
            + on_existing_files(f"{APT_CONF_DIR}/*", grep)
            + "; true"
        )

    def process(self, output: list[str]) -> dict:
        effective: dict[str, str] = {}
        lines: list[tuple[str, str, str]] = []
        for line in output:
            if line.startswith("effective "):
                key, _, value = line[len("effective ") :].partition("=")
                effective[key.lower()] = value.strip()
            else:
                path, _, setting = line.partition(":")
                for key, value in apt_conf_settings(setting).items():
                    lines.append((path, key, value))
        return {"effective": effective, "lines": lines}


def _apt_value(value: str) -> str:
    lowered = value.strip().lower()
    if lowered in _APT_TRUE:
        return "true"
    if lowered in {"0", "no", "false", "without", "off", "disable"}:
        return "false"
    return value.strip()


def apt_conf_findings(found: dict, ours_path: str, ours_text: str, declared) -> list[str]:
    """A finding for each of our apt settings that apt reads otherwise, once ours is in place
    with its value (before, apt's default is no finding), naming the other files that set it;
    a key a declared file sets is the site's choice."""
    ours = apt_conf_settings(ours_text)
    written = {key: value for path, key, value in found["lines"] if path == ours_path}
    chosen = {key for path, key, _ in found["lines"] if path in set(declared)}
    findings = []
    for key, value in ours.items():
        effective = found["effective"].get(key)
        if key in chosen or written.get(key) != value or effective is None:
            continue
        if _apt_value(effective) != _apt_value(value):
            others = sorted({path for path, k, _ in found["lines"] if k == key} - {ours_path})
            where = f"set in {', '.join(others)}" if others else "set outside apt.conf.d"
            findings.append(
                f"apt: {key} is {effective} for apt, gpuinfra's is {value}: {where} "
                "(remove it, or declare it in base.site_files)"
            )
    return findings


SSH_UNITS = ("ssh.service", "ssh.socket")


def ssh_off_at_boot(states: dict[str, dict | None]) -> bool:
    """Neither sshd's service nor its socket (Ubuntu 24.04 starts sshd by its socket) is
    enabled for every boot: `enabled-runtime` lasts until the next one."""
    return not any((states.get(u) or {}).get("UnitFileState") == "enabled" for u in SSH_UNITS)


# The keys files sshd reads by default (AuthorizedKeysFile), under the user's home.
KEYS_FILES = (".ssh/authorized_keys", ".ssh/authorized_keys2")
# A key in an authorized_keys line (after its options, which may quote spaces): type, blob.
_KEY = re.compile(r"(?:^|\s)((?:ssh|ecdsa|sk)-[A-Za-z0-9@.-]+)\s+([A-Za-z0-9+/]+=*)(?:\s+(.*))?$")


def key_blob(line: str) -> tuple[str, str, str] | None:
    """(type, base64 blob, comment) of an authorized_keys or `.pub` line; None if it holds none."""
    found = _KEY.search(line.strip())
    if found is None:
        return None
    return found.group(1), found.group(2), (found.group(3) or "").strip()


def fingerprint(blob: str) -> str:
    """The key's SHA256 fingerprint as `ssh-keygen -l` prints it."""
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        raw = blob.encode()
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


class AuthorizedKeys(FactBase):
    """The keys in the default keys files of each user, in order:
    `[(user, path, key type, base64 blob, comment)]`. A user or file that does not exist adds
    nothing."""

    @staticmethod
    def default() -> list:
        return []

    def command(self, users: tuple[str, ...]) -> str:
        files = " ".join(f'"$h/{name}"' for name in KEYS_FILES)
        program = '!/^[[:space:]]*(#|$)/ { print u " " FILENAME " " $0 }'
        return (
            f"for u in {' '.join(shlex.quote(user) for user in users)}; do "
            'h=$(getent passwd "$u" | cut -d: -f6); [ -n "$h" ] || continue; '
            f'for f in {files}; do [ -f "$f" ] && '
            f'awk -v u="$u" {shlex.quote(program)} "$f"; done; done; true'
        )

    def process(self, output: list[str]) -> list[tuple[str, str, str, str, str]]:
        found = []
        for line in output:
            user, _, rest = line.partition(" ")
            path, _, entry = rest.partition(" ")
            key = key_blob(entry)
            if key is not None:
                found.append((user, path, *key))
        return found


def controller_public_key(controller_key: Path) -> str | None:
    """The public half of the controller's key, as an authorized_keys line: its `.pub` beside
    it, else read from the key when it is not encrypted; None when neither can be read."""
    public = Path(f"{controller_key}.pub")
    try:
        text = public.read_text() if public.exists() else _public_half(controller_key)
    except (OSError, ValueError, TypeError):
        return None
    return text.strip() if key_blob(text) is not None else None


def declared_keys(listed: Iterable[str], controller_key: Path | None) -> set[str]:
    """The blobs of the keys that may log in: the listed public keys, and the public half of
    the controller's key (controller_public_key)."""
    blobs = {key[1] for key in map(key_blob, listed) if key is not None}
    text = controller_public_key(controller_key) if controller_key is not None else None
    key = key_blob(text) if text is not None else None
    return blobs | ({key[1]} if key is not None else set())  # unreadable: the listed ones


def _public_half(private: Path) -> str:
    from toolkit.sshkeys import public_key

    return public_key(private.read_text())


def unknown_keys(found: list[tuple[str, str, str, str, str]], declared: set[str]) -> list[str]:
    """A finding for each key in a keys file that the inventory does not declare, named by its
    fingerprint and comment (never the whole key)."""
    return [
        f"ssh: {path} lets {user} log in with a key the inventory does not declare: "
        f"{kind} {fingerprint(blob)}{f' ({comment})' if comment else ''} "
        "(remove it, or declare it in base.authorized_keys)"
        for user, path, kind, blob, comment in found
        if blob not in declared
    ]
