"""The base role, checked on the running host: identity, name resolution, SSH, time, packages."""

from __future__ import annotations

import pytest

from roles.base.config import BaseConfig

# Effective sshd settings (`sshd -T`) that keep password guessing out.
SSHD_EXPECTED = {
    "passwordauthentication": "no",
    "kbdinteractiveauthentication": "no",
    "permitemptypasswords": "no",
}


def test_hostname_is_the_inventory_name(host, ctx) -> None:
    assert host.check_output("hostname") == ctx.name


def test_every_cluster_host_resolves_to_its_address(host, cluster) -> None:
    wrong = {}
    for name, entry in cluster.cluster.hosts.items():
        answer = host.run(f"getent hosts {cluster.cluster.fqdn(name)}")
        found = answer.stdout.split()[0] if answer.rc == 0 and answer.stdout else None
        if found != str(entry.address):
            wrong[name] = found
    assert not wrong, f"names resolving wrongly (name: address seen): {wrong}"


@pytest.mark.parametrize("setting", sorted(SSHD_EXPECTED))
def test_sshd_refuses_password_logins(host, setting: str) -> None:
    effective = dict(
        line.split(" ", 1) for line in host.check_output("sshd -T").splitlines() if " " in line
    )
    assert effective.get(setting) == SSHD_EXPECTED[setting]


def test_sshd_root_login_as_configured(host, ctx) -> None:
    cfg = ctx.config(BaseConfig)
    effective = host.check_output("sshd -T | grep -i '^permitrootlogin '").split()[1]
    # sshd -T prints prohibit-password under its older name.
    aliases = {"prohibit-password": {"prohibit-password", "without-password"}}
    assert effective in aliases.get(cfg.ssh_permit_root_login, {cfg.ssh_permit_root_login})


def test_baseline_packages_are_installed(host, ctx) -> None:
    cfg = ctx.config(BaseConfig)
    missing = [name for name in cfg.packages if not host.package(name).is_installed]
    assert not missing, f"not installed: {missing}"


def test_apt_sources_are_only_the_managed_ones(host) -> None:
    listed = host.check_output("apt-get indextargets --format '$(SITE)' | sort -u").splitlines()
    assert listed, "apt has no package sources"
    sources = host.file("/etc/apt/sources.list.d/gpuinfra.sources")
    assert sources.exists and all(site in sources.content_string for site in listed)


def test_time_sync_runs_where_the_clock_can_be_set(host) -> None:
    container = host.run("systemd-detect-virt --container").stdout.strip()
    chrony = host.service("chrony")
    if container and container != "none":
        # A container cannot set the clock: chrony is left alone (the role reports it), but
        # it must still be enabled so the same host on bare metal syncs at boot.
        assert chrony.is_enabled
    else:
        assert chrony.is_running and chrony.is_enabled


def test_journal_is_capped(host, ctx) -> None:
    cfg = ctx.config(BaseConfig)
    dropin = host.file("/etc/systemd/journald.conf.d/50-gpuinfra.conf")
    assert f"SystemMaxUse={cfg.journald_max_use}" in dropin.content_string
