"""The drift_job role's deploy: the forced-command user, its key, sshd drop-in, sudoers rule
and wrapper, each file checked before it is live, and sshd's effective answer for the user
checked in the same apply, after the reload. Nothing while the Job is not enabled."""

from __future__ import annotations

import hashlib
import shlex

from pyinfra import host
from pyinfra.api import FactBase, deploy, operation
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files

from roles.drift_job.config import DriftJobConfig
from roles.drift_job.files import (
    FORCED_COMMAND,
    KEY,
    KEYS_FILE,
    SSHD_DROPIN,
    managed_files,
    removed_paths,
)
from roles.drift_job.role import fleet_config
from toolkit import driftprobe
from toolkit.effective import nothing_overrides
from toolkit.facts import Account
from toolkit.operations import reload_sshd
from toolkit.spec import HostContext

# The login shell runs the forced command (`sh -c`); "*" in shadow: no password ever matches,
# while sshd (which refuses a "!"-locked account without PAM) still takes the key.
SHELL = "/bin/sh"
HOME = "/"


@deploy("Drift job")
def apply(ctx: HostContext) -> None:
    cfg = fleet_config(ctx.loaded)
    if cfg.remove and not cfg.enabled:
        removed(cfg)
        return
    if not cfg.enabled:
        return  # no operation and no fact: the hosts' drift probes stay as they were
    drift_account(name=f"Add the {cfg.user} user", user=cfg.user)
    managed = managed_files(ctx)
    dropin = KEY.put_files(managed)[SSHD_DROPIN]
    source = one_source(ctx)
    # Right after the reload, in this apply: what sshd now does for the drift user.
    effective_now(
        name="Check sshd's settings for the drift user",
        command=effective_check(cfg, source, ctx.name),
        _if=dropin.did_change,
    )
    # On an apply that writes nothing, the same answer from a fact (drift asks it again).
    content = {f.path: f.content for f in managed}[SSHD_DROPIN]
    live = host.get_fact(Sha1File, path=SSHD_DROPIN) == _sha1(content)
    found = host.get_fact(DriftSshd, user=cfg.user, addr=source, host_name=ctx.name) if live else {}
    nothing_overrides(
        "Check that sshd forces the drift user's command", sshd_findings(found) if live else []
    )


def one_source(ctx: HostContext) -> str:
    """One address `from=` admits, for `sshd -T -C addr=`: the first fleet-ops node's."""
    cfg = fleet_config(ctx.loaded)
    if cfg.nodes:
        return str(ctx.cluster.hosts[cfg.nodes[0]].address)
    return str(cfg.sources[0].network_address) if cfg.sources else "127.0.0.1"


EXPECTED = {
    "authorizedkeysfile": KEYS_FILE,
    "forcecommand": FORCED_COMMAND,
    "disableforwarding": "yes",
    "permittty": "no",
    "permituserrc": "no",
}


def sshd_query(user: str, addr: str, host_name: str) -> str:
    spec = f"user={user},addr={addr},host={host_name}"
    keys = "|".join(EXPECTED)
    return f"sshd -T -C {shlex.quote(spec)} 2>/dev/null | grep -E '^({keys}) '"


def effective_check(cfg: DriftJobConfig, addr: str, host_name: str) -> str:
    """Fails, naming what sshd says, unless every expected setting is in force for the user."""
    wanted = "\n".join(f"{key} {value}" for key, value in EXPECTED.items())
    query = sshd_query(cfg.user, addr, host_name)
    return (
        f"found=$({query} | sort); wanted=$(printf '%s\\n' {shlex.quote(wanted)} | sort); "
        '[ "$found" = "$wanted" ] || { echo "sshd -T for the drift user says: $found" >&2; '
        "exit 1; }"
    )


@operation()
def effective_now(command: str):
    yield command


class DriftSshd(FactBase):
    """What `sshd -T -C user=…,addr=…,host=…` says of the drift user's settings:
    `{"forcecommand": "sudo -n …", "authorizedkeysfile": "…", …}`."""

    @staticmethod
    def default():
        return {}

    def command(self, user: str, addr: str, host_name: str) -> str:
        return sshd_query(user, addr, host_name) + " || true"

    def process(self, output: list[str]) -> dict[str, str]:
        found = {}
        for line in output:
            key, _, value = line.partition(" ")
            found[key] = value.strip()
        return found


def sshd_findings(found: dict[str, str]) -> list[str]:
    return [
        f"sshd: {key} for the drift user is {found.get(key, '(unset)')!r}, not {value!r}"
        for key, value in EXPECTED.items()
        if found.get(key) != value
    ]


@operation()
def drift_account(user: str):
    """The forced-command user: a system account with its own group, home /, shell /bin/sh and
    "*" for a password."""
    account = host.get_fact(Account, user=user)
    if account is None:
        yield (
            f"useradd --system --user-group --home-dir {HOME} --no-create-home "
            f"--shell {SHELL} --password '*' {shlex.quote(user)}"
        )
        return
    if (account["home"], account["shell"]) != (HOME, SHELL):
        yield f"usermod --home {HOME} --shell {SHELL} {shlex.quote(user)}"


def removed(cfg: DriftJobConfig) -> None:
    """`remove`: what an enabled apply installed, gone (the drop-in first, so sshd never names a
    keys file that is missing), sshd reloaded, then the rest, the probe and the user."""
    dropin, *rest = removed_paths()
    gone = files.file(name=f"Remove {dropin}", path=dropin, present=False)
    reload_sshd(name="Reload sshd", _if=gone.did_change)
    for path in rest:
        files.file(name=f"Remove {path}", path=path, present=False)
    files.directory(name=f"Remove {driftprobe.PROBE_DIR}", path=driftprobe.PROBE_DIR, present=False)
    remove_account(name=f"Remove the {cfg.user} user", user=cfg.user)


@operation()
def remove_account(user: str):
    if host.get_fact(Account, user=user) is not None:
        yield f"userdel {shlex.quote(user)}"


def _sha1(content: str) -> str:
    return hashlib.sha1(content.encode()).hexdigest()
