"""The base role's deploy: declare hostname, hosts, apt, packages, time, journald and sshd."""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import apt, files, server

from roles.base.config import BaseConfig
from roles.base.effective import (
    APT_FILES,
    SSH_UNITS,
    SSHD_DROPINS,
    AptConfig,
    AuthorizedKeys,
    SshdSettings,
    apt_conf_findings,
    apt_conf_settings,
    apt_findings,
    declared_keys,
    match_addresses,
    match_connections,
    ssh_off_at_boot,
    sshd_findings,
    sshd_settings,
    unknown_keys,
)
from roles.base.files import APT_CONF_FILE, JOURNALD_CONF_DIRS, JOURNALD_FILE, managed_files
from toolkit.effective import (
    FilesMatching,
    declared_files,
    nothing_overrides,
    only_ours,
    ours_or_declared,
    overridden_later,
    unit_dropins,
)
from toolkit.facts import UnitState
from toolkit.operations import (
    live_hostname,
    put_file,
    reload_sshd,
    restart_if_running,
    service_running,
)
from toolkit.spec import HostContext

SSHD_FILE = f"{SSHD_DROPINS}/50-gpuinfra.conf"

# The distribution's own source lists duplicate ours; apt warns about every duplicate entry.
DISTRIBUTION_SOURCES = ("/etc/apt/sources.list.d/debian.sources",
                        "/etc/apt/sources.list.d/ubuntu.sources")  # fmt: skip


@deploy("Base")
def apply(ctx: HostContext) -> None:
    cfg = ctx.config(BaseConfig)
    written = {f.path: put_file(f) for f in managed_files(ctx)}
    sources_list = files.put(
        name="Point sources.list at the managed sources",
        src=StringIO("# Managed by gpuinfra: sources are in sources.list.d/gpuinfra.sources\n"),
        dest="/etc/apt/sources.list",
        mode="0644",
    )
    for path in DISTRIBUTION_SOURCES:
        files.file(name=f"Remove {path}", path=path, present=False)
    live_hostname(name="Set the running hostname", hostname=ctx.name)
    sources = written["/etc/apt/sources.list.d/gpuinfra.sources"]
    # Refresh package lists only when the sources change: a time-based refresh would show up
    # as a pending change in every plan and drift check.
    apt.update(
        name="Refresh package lists for new sources",
        _if=lambda: sources.did_change() or sources_list.did_change(),
    )
    apt.packages(name="Install baseline packages", packages=cfg.packages, no_recommends=True)
    service_running(name="Run chrony", unit="chrony", container_skips=True)
    restart_if_running(
        name="Restart chrony for new sources",
        unit="chrony",
        _if=written["/etc/chrony/sources.d/gpuinfra.sources"].did_change,
    )
    restart_if_running(
        name="Restart journald for new limits",
        unit="systemd-journald",
        _if=written[JOURNALD_FILE].did_change,
    )
    sshd_changed = written[SSHD_FILE].did_change
    server.shell(name="Check sshd configuration", commands=["sshd -t"], _if=sshd_changed)
    reload_sshd(name="Reload sshd", _if=sshd_changed)
    effective(ctx, cfg, {f.path: f.content for f in managed_files(ctx)})


def effective(ctx: HostContext, cfg: BaseConfig, contents: dict[str, str]) -> None:
    """What sshd, apt and journald will do: nothing gpuinfra did not write overrides its
    settings."""
    sshd_text = contents[SSHD_FILE]
    declared = declared_files(cfg)
    ours = sshd_settings(sshd_text)
    connections = match_connections(ctx.name, ctx.address, ("root", ctx.cluster.ssh.user))
    others = (ctx.name, match_addresses(ctx.address))  # every other user who may log in
    found = host.get_fact(
        SshdSettings, keys=tuple(sorted(ours)), connections=connections, others=others
    )
    sshd = sshd_findings(found, SSHD_FILE, sshd_text, declared)
    nothing_overrides("Check that no sshd setting overrides ours", sshd)
    allowed = ours_or_declared(ctx)
    apt = apt_findings(
        host.get_fact(FilesMatching, pattern=APT_FILES), DISTRIBUTION_SOURCES, allowed
    )
    nothing_overrides("Check that apt reads only gpuinfra's sources and pins", apt)
    apt_conf = contents[APT_CONF_FILE]
    found = host.get_fact(AptConfig, keys=tuple(sorted(apt_conf_settings(apt_conf))))
    nothing_overrides(
        "Check that no apt setting overrides ours",
        apt_conf_findings(found, APT_CONF_FILE, apt_conf, declared),
    )
    overridden_later(
        "Check that no journald setting overrides ours",
        JOURNALD_CONF_DIRS,
        JOURNALD_FILE,
        contents[JOURNALD_FILE],
        declared,
        "journald",
    )
    only_ours(
        "Check that chrony reads only gpuinfra's sources",
        "/etc/chrony/sources.d/*.sources",
        allowed,
        "chrony uses its servers beside the inventory's",
    )
    nothing_overrides("Check that only the declared keys log in", login_keys(ctx, cfg))
    states = {unit: host.get_fact(UnitState, unit=unit) for unit in SSH_UNITS}
    ssh_at_boot(name="Start sshd at boot", states=states)
    units = ("ssh", "chrony", "systemd-journald")
    unit_dropins("Check the drop-ins of sshd, chrony and journald", units, allowed)


def login_keys(ctx: HostContext, cfg: BaseConfig) -> list[str]:
    """The keys of the ssh user and root that the inventory does not declare. With nothing
    declared (no ssh.key, only an agent's, and no base.authorized_keys) there is nothing to
    judge against: no finding, rather than every key of every host."""
    ssh = ctx.cluster.ssh
    key = ctx.loaded.resolve(ssh.key) if ssh.key is not None else None
    declared = declared_keys(cfg.authorized_keys, key)
    users = tuple(dict.fromkeys((ssh.user, "root")))
    found = host.get_fact(AuthorizedKeys, users=users) or []
    return unknown_keys(found, declared) if declared else []


@operation()
def ssh_at_boot(states: dict):
    """sshd starts at every boot, by its service or its socket; if neither is enabled (or only
    for this boot), the service is enabled."""
    if not ssh_off_at_boot(states):
        host.noop("sshd starts at boot")
        return
    yield "systemctl enable ssh.service"
