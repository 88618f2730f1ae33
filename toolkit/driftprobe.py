"""The drift Job's probe on a host: where it is installed, the forced command that runs it and
how its answer is read and digested, shared by the drift_job role (which writes the forced
command), the apply (which installs each host's probe) and the shard in a pod (which runs it).

Standard library only: the shard imports it in a pod with no inventory.

The probe lives outside every path a role manages or a fact asks about (its own folder under
/var/lib, created by `install_command`, never by a pyinfra operation): installing a new probe
moves the folder's mtime, and a folder a role's `files.directory` had asked about would then
differ from its record on every host, so no host would keep drift's fast path
(tests/unit/test_drift_job.py keeps it so).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
from collections.abc import Iterable

PROBE_DIR = "/var/lib/gpuinfra-drift"
PROBE_FILE = f"{PROBE_DIR}/probe.sh"
WRAPPER = "/usr/local/sbin/gpuinfra-drift-probe"
# The first line the probe prints: what an sshrc, a motd or PAM printed before it is skipped.
BEGIN = "gpuinfra-drift-probe-begin"
# The wrapper's environment, whatever the login's (HOME, umask, LANG, cwd): the apply installs
# and digests the probe under the same one (`run_command`), so both answers are alike.
ENVIRONMENT = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C")
HOME = "/"

# The fields of a line of pyinfra's file facts (stat) that move while the host is unchanged:
# the access time (the probe itself reads files), and a directory's times and size, which move
# with its entries (a file written into it), never with what files.directory sets (mode, owner,
# group). A file's mtime, ctime and size stay compared.
_ATIME = re.compile(r"^(user=\S* group=\S* mode=\S* atime=)-?[0-9]+( mtime=)")
_DIRECTORY = re.compile(
    r"^(user=\S* group=\S* mode=d\S* atime=)-?[0-9]+( mtime=)-?[0-9]+( ctime=)-?[0-9]+"
    r"( size=)[0-9]+ "
)


def masked(line: str) -> str:
    """A line of an answer as its digest sees it (see _ATIME): stat's moving fields as `*`."""
    if not line.startswith("user="):  # the patterns' own start: other lines stay as they are
        return line
    line, directories = _DIRECTORY.subn(r"\1*\2*\3*\4* ", line)
    return line if directories else _ATIME.sub(r"\1*\2", line)


def run_command(path: str) -> str:
    """How the wrapper runs a probe file: from /, umask 022, a fixed environment, no input."""
    env = " ".join(shlex.quote(item) for item in (f"HOME={HOME}", *ENVIRONMENT))
    return f"cd / && umask 022 && exec env -i {env} sh {shlex.quote(path)} </dev/null"


def wrapper_text() -> str:
    """/usr/local/sbin/gpuinfra-drift-probe: the one thing the forced command may run, as root
    through sudo, with no arguments (sudoers' `""`); exit 3 while no probe is installed."""
    return (
        "#!/bin/sh\n"
        "# Managed by gpuinfra (role drift_job): runs this host's last recorded drift probe.\n"
        f'[ "$#" -eq 0 ] || exit 2\n'
        f"[ -f {PROBE_FILE} ] || exit 3\n"
        f"{run_command(PROBE_FILE)}\n"
    )


def probe_file(script: str, host: str) -> str:
    """The installed probe: the begin line, then the probe script (fingerprint.probe_script)."""
    return (
        "#!/bin/sh\n"
        f"# gpuinfra drift probe of {host}, written by the last apply that recorded it.\n"
        f"printf '%s\\n' {BEGIN}\n"
        f"{script}"
    )


def answer_lines(output: bytes) -> list[str] | None:
    """The probe's own lines: what follows its begin line (None: no begin line, the probe did
    not run). An sshrc, a motd or a PAM module may print before it; nothing prints after."""
    text = output.decode("utf-8", errors="replace")
    lines = text.split("\n")
    try:
        start = lines.index(BEGIN)
    except ValueError:
        return None
    return lines[start + 1 :]


def lines_digest(lines: Iterable[str]) -> str:
    """The digest of a command's output lines, stat's moving fields masked (`masked`): what a
    record keeps of each command (engine.fingerprint's `output_digest` is this function)."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(masked(line).encode(errors="surrogateescape") + b"\n")
    return digest.hexdigest()


def answer_digest(output: bytes) -> str | None:
    """The digest of a probe's answer (`lines_digest`); None: no answer."""
    lines = answer_lines(output)
    return None if lines is None else lines_digest(lines)


def install_command(script_bytes: int) -> str:
    """The remote command an apply sends with the operator's key, the probe on stdin
    (`script_bytes` long): write it beside the live one (0600 from creation), run it as the
    wrapper would, and move it into place. Its stdout is the probe's answer."""
    staged = posixpath.join(PROBE_DIR, "probe.sh.new")
    quoted, live = shlex.quote(staged), shlex.quote(PROBE_FILE)
    return (
        f"umask 077 && mkdir -p {shlex.quote(PROBE_DIR)} && chmod 0700 {shlex.quote(PROBE_DIR)}"
        f" && head -c {script_bytes} > {quoted} && [ $(wc -c < {quoted}) -eq {script_bytes} ]"
        f" && ( {run_command(staged)} ) && mv -f {quoted} {live}"
    )
