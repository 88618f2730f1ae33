"""Effective-state checks (toolkit/effective.py and the roles' own): the facts read as the
hosts print them, and the judges find what overrides gpuinfra's settings and nothing else."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from engine.context import load
from roles.base.effective import (
    SshdSettings,
    apt_findings,
    apt_reads,
    match_addresses,
    match_connections,
    ssh_off_at_boot,
    sshd_findings,
)
from roles.firewall.config import FirewallConfig
from roles.firewall.deploy import other_tables
from roles.firewall.facts import BaseChains
from tests.helpers import files_of
from toolkit.dropins import MARKER
from toolkit.effective import FilesMatching, UnitDropIns, foreign_dropins, foreign_files

REPO = Path(__file__).resolve().parents[2]
OURS = "/etc/ssh/sshd_config.d/50-gpuinfra.conf"
OURS_TEXT = "PasswordAuthentication no\nPort 22\nPermitRootLogin prohibit-password\n"
# What SshdSettings' command prints on a Debian 13 host: sshd -T's lines for our keywords,
# then each file and its setting lines (the main file includes the drop-ins first).
DEBIAN_MAIN = [
    "file /etc/ssh/sshd_config",
    "line Include /etc/ssh/sshd_config.d/*.conf",
    "line PasswordAuthentication yes",  # after the Include: ours, read first, wins
]


def sshd(*extra: str, effective: tuple[str, ...] = (), ours: bool = True) -> dict:
    output = [f"effective {line}" for line in effective] + DEBIAN_MAIN + list(extra)
    if ours:
        output += [f"file {OURS}", "line PasswordAuthentication no", "line Port 22",
                   "line PermitRootLogin prohibit-password"]  # fmt: skip
    return SshdSettings().process(output)


def test_a_converged_sshd_has_no_finding():
    found = sshd(
        effective=("passwordauthentication no", "port 22", "permitrootlogin without-password")
    )
    assert sshd_findings(found, OURS, OURS_TEXT) == []


def test_an_sshd_drop_in_read_before_ours_is_named():
    found = sshd(
        "file /etc/ssh/sshd_config.d/01-site.conf",
        "line PasswordAuthentication yes",
        effective=("passwordauthentication yes", "port 22", "permitrootlogin without-password"),
    )
    assert sshd_findings(found, OURS, OURS_TEXT) == [
        "sshd: passwordauthentication yes set in /etc/ssh/sshd_config.d/01-site.conf wins over "
        "gpuinfra's no (remove it, or declare it in base.site_files)"
    ]


def test_an_sshd_file_the_site_declared_is_its_choice():
    found = sshd(
        "file /etc/ssh/sshd_config.d/01-site.conf",
        "line PasswordAuthentication yes",
        effective=("passwordauthentication yes", "port 22", "permitrootlogin without-password"),
    )
    declared = ("/etc/ssh/sshd_config.d/01-site.conf",)
    assert sshd_findings(found, OURS, OURS_TEXT, declared) == []


def test_a_drop_in_after_ours_or_inside_match_changes_nothing():
    found = sshd(
        "file /etc/ssh/sshd_config.d/60-later.conf",
        "line PasswordAuthentication yes",
        "file /etc/ssh/sshd_config.d/10-match.conf",
        "line Match User backup",
        "line PasswordAuthentication yes",
        effective=("passwordauthentication no", "port 22", "permitrootlogin without-password"),
    )
    assert sshd_findings(found, OURS, OURS_TEXT) == []


def test_a_match_block_that_opens_a_judged_connection_is_named():
    """`Match Address *` turning passwords on, or `Match User root` allowing root's password:
    sshd -T -C for root and the SSH user, from outside and from the host's network, sees it;
    the control is the same files without the block; a file the site declared is its choice."""
    connections = match_connections("gpu-1", "10.0.0.71", ("root", "ops"))
    assert connections == (
        "user=root,host=gpu-1,addr=203.0.113.1",
        "user=root,host=gpu-1,addr=10.0.0.71",
        "user=ops,host=gpu-1,addr=203.0.113.1",
        "user=ops,host=gpu-1,addr=10.0.0.71",
    )
    command = SshdSettings().command(("passwordauthentication",), connections)
    assert command.count("sshd -T -C ") == 4
    converged = ("passwordauthentication no", "port 22", "permitrootlogin without-password")

    def found(matched: dict[str, str], *files: str) -> dict:
        """sshd -T -C's lines: the converged values, but `matched`'s line for its connection."""
        lines = []
        for spec in connections:
            for line in converged:
                if spec in matched and matched[spec].split()[0] == line.split()[0]:
                    line = matched[spec]
                lines.append(f"match {spec} {line}")
        return sshd(*files, *lines, effective=converged)

    assert sshd_findings(found({}), OURS, OURS_TEXT) == []
    opened = found(
        {connections[0]: "passwordauthentication yes"},
        "file /etc/ssh/sshd_config.d/10-match.conf",
        "line Match Address *",
        "line PasswordAuthentication yes",
    )
    assert sshd_findings(opened, OURS, OURS_TEXT) == [
        "sshd: a Match block gives root from 203.0.113.1 passwordauthentication yes, "
        "gpuinfra's is no (remove it, or declare its file in base.site_files)"
    ]
    declared = ("/etc/ssh/sshd_config.d/10-match.conf",)
    assert sshd_findings(opened, OURS, OURS_TEXT, declared) == []


FAKE_SSHD = """#!/bin/sh
# sshd -T (-C spec): what a Match User deploy block turning passwords on gives each connection.
case "$*" in
    *user=deploy,*) echo "passwordauthentication yes" ;;
    *) echo "passwordauthentication no" ;;
esac
"""


def test_every_user_who_may_log_in_has_its_match_blocks_judged(tmp_path, monkeypatch):
    """The fact's real command on files under tmp_path, with an sshd that answers as one with
    `Match User deploy` would: deploy (named only by the block), alice (a login shell) and the
    fixed connections are asked about; daemon, sync and a `bob*` pattern are not. Only deploy's
    answer differs from ours, so only deploy is named; the control is alice, judged, unnamed."""
    import roles.base.effective as effective

    dropins = tmp_path / "sshd_config.d"
    dropins.mkdir()
    main = tmp_path / "sshd_config"
    main.write_text(f"Include {dropins}/*.conf\n")
    ours = dropins / "50-gpuinfra.conf"
    ours.write_text("PasswordAuthentication no\n")
    (dropins / "90-site.conf").write_text(
        "Match User deploy,bob*\n    PasswordAuthentication yes\n"
    )
    passwd = tmp_path / "passwd"
    passwd.write_text(
        "root:x:0:0:root:/root:/bin/bash\n"
        "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
        "sync:x:4:65534:sync:/bin:/bin/sync\n"
        "alice:x:1000:1000::/home/alice:/bin/bash\n"
        "ops:x:1001:1001::/home/ops:/bin/bash\n"
    )
    monkeypatch.setattr(effective, "SSHD_CONFIG", str(main))
    monkeypatch.setattr(effective, "SSHD_DROPINS", str(dropins))
    monkeypatch.setattr(effective, "PASSWD", str(passwd))
    users = subprocess.run(
        ["sh", "-c", effective.login_users_command()], capture_output=True, text=True, check=True
    ).stdout.split()
    assert users == ["alice", "deploy", "ops", "root"]

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sshd").write_text(FAKE_SSHD)
    (bin_dir / "sshd").chmod(0o755)
    connections = match_connections("gpu-1", "10.0.0.71", ("root", "ops"))
    command = SshdSettings().command(
        ("passwordauthentication",), connections, ("gpu-1", match_addresses("10.0.0.71"))
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    output = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, check=True, env=env
    ).stdout.splitlines()
    found = SshdSettings().process(output)
    judged = {spec.split(",")[0] for spec in found["matched"]}
    assert judged == {"user=root", "user=ops", "user=alice", "user=deploy"}
    # Each connection once: root and ops are not asked about a second time by the loop.
    assert all(v == ["no"] or v == ["yes"] for m in found["matched"].values() for v in m.values())
    text = ours.read_text()
    assert sshd_findings(found, str(ours), text) == [
        f"sshd: a Match block gives deploy from {address} passwordauthentication yes, "
        "gpuinfra's is no (remove it, or declare its file in base.site_files)"
        for address in match_addresses("10.0.0.71")
    ]
    assert sshd_findings(found, str(ours), text, (str(dropins / "90-site.conf"),)) == []


def test_before_the_first_apply_only_files_that_would_win_count():
    """Our file is not written yet: the main file's values after the Include lose to it."""
    found = sshd(effective=("passwordauthentication yes", "port 22"), ours=False)
    assert sshd_findings(found, OURS, OURS_TEXT) == []
    cloud = sshd("file /etc/ssh/sshd_config.d/50-cloud-init.conf",
                 "line PasswordAuthentication yes", ours=False)  # fmt: skip
    assert "50-cloud-init.conf" in sshd_findings(cloud, OURS, OURS_TEXT)[0]


def test_every_port_counts_and_sshd_t_must_agree():
    extra_port = sshd("file /etc/ssh/sshd_config.d/70-port.conf", "line Port 2222")
    assert sshd_findings(extra_port, OURS, OURS_TEXT) == [
        "sshd: port 2222 set in /etc/ssh/sshd_config.d/70-port.conf wins over gpuinfra's 22 "
        "(remove it, or declare it in base.site_files)"
    ]
    # sshd -T disagrees and no file says why (an Include elsewhere): still a finding.
    found = sshd(effective=("passwordauthentication yes", "port 22"))
    assert sshd_findings(found, OURS, OURS_TEXT) == [
        "sshd: sshd -T says passwordauthentication yes, gpuinfra's is no"
    ]


def test_a_port_our_apply_is_about_to_change_is_no_finding():
    """Ours still says Port 22 and sshd -T agrees; the inventory moved to 2222: the apply
    rewrites ours, so sshd -T's answer is not judged until ours says 2222."""
    found = sshd(effective=("passwordauthentication no", "port 22"))
    moving = OURS_TEXT.replace("Port 22", "Port 2222")
    assert sshd_findings(found, OURS, moving) == []


def test_a_main_file_without_the_include_is_a_finding():
    found = SshdSettings().process(["file /etc/ssh/sshd_config", "line Port 22"])
    assert "does not include" in sshd_findings(found, OURS, OURS_TEXT)[0]


def test_apt_sources_and_pins_that_are_not_ours():
    found = FilesMatching().process([
        "/etc/apt/sources.list.d/site.list",
        "/etc/apt/sources.list.d/site.list.save",  # apt does not read it
        "/etc/apt/sources.list.d/debian.sources",  # the base role removes it
        "/etc/apt/preferences.d/hold-kernel",
        "/etc/apt/sources.list.d/mirror.sources",
    ])  # fmt: skip
    removed = ("/etc/apt/sources.list.d/debian.sources",)
    declared = ("/etc/apt/sources.list.d/mirror.sources",)
    assert apt_findings(found, removed, declared) == [
        "apt: /etc/apt/sources.list.d/site.list is not gpuinfra's (remove it, or declare it in "
        "base.site_files)",
        "apt: /etc/apt/preferences.d/hold-kernel is not gpuinfra's (remove it, or declare it in "
        "base.site_files)",
    ]
    assert apt_reads("/etc/apt/preferences.d/pin.pref")
    assert not apt_reads("/etc/apt/preferences.d/pin.dpkg-old")


def test_unit_drop_ins_of_others():
    found = UnitDropIns().process([
        "unit etcd.service", "load loaded",
        "other /etc/systemd/system/etcd.service.d/override.conf",
        "ours /etc/systemd/system/etcd.service.d/50-gpuinfra.conf",
        "other /usr/lib/systemd/system/service.d/10-timeout-abort.conf",  # a package's own
        "unit nftables.service", "load loaded",
        "other /run/systemd/system.control/nftables.service.d/50-CPUQuota.conf",
        "unit nothing.service", "load not-found",
    ])  # fmt: skip
    assert set(found) == {"etcd.service", "nftables.service"}
    rendered = ("/etc/systemd/system/etcd.service.d/50-gpuinfra.conf",)
    assert foreign_dropins(found, rendered) == [
        "etcd.service: drop-in /etc/systemd/system/etcd.service.d/override.conf is not "
        "gpuinfra's and changes the unit (remove it, or declare it in base.site_files)",
        "nftables.service: drop-in /run/systemd/system.control/nftables.service.d/"
        "50-CPUQuota.conf is not gpuinfra's and changes the unit (remove it, or declare it in "
        "base.site_files)",
    ]
    declared = ("/etc/systemd/system/etcd.service.d/override.conf",)
    assert len(foreign_dropins(found, (*rendered, *declared))) == 1


def test_a_drop_in_that_copies_our_marker_is_judged_by_its_path():
    """A foreign drop-in with "Managed by gpuinfra" in its first lines is still foreign: only
    the paths gpuinfra renders are its own."""
    found = UnitDropIns().process([
        "unit kubelet.service", "load loaded",
        "ours /etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
        "ours /etc/systemd/system/kubelet.service.d/99-copied-marker.conf",
    ])  # fmt: skip
    rendered = ("/etc/systemd/system/kubelet.service.d/10-kubeadm.conf",)
    assert foreign_dropins(found, rendered) == [
        "kubelet.service: drop-in /etc/systemd/system/kubelet.service.d/99-copied-marker.conf "
        "is not gpuinfra's and changes the unit (remove it, or declare it in base.site_files)"
    ]


def test_a_file_that_copies_our_marker_where_a_service_reads_every_file(tmp_path):
    """containerd's conf.d, chrony's sources.d, apt's folders: every file is listed (by this
    machine's sh), the marker in one proves nothing, and only the rendered paths are ours."""
    import subprocess

    ours, copied = tmp_path / "90-nvidia.toml", tmp_path / "99-site.toml"
    ours.write_text(f"# {MARKER}\n")
    copied.write_text(f"# {MARKER} (copied)\n[plugins]\n")
    (tmp_path / "notes.txt").write_text("not read by the service\n")
    command = FilesMatching().command(pattern=f"{tmp_path}/*.toml")
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = FilesMatching().process(output.stdout.splitlines())
    assert found == [str(ours), str(copied)]
    assert foreign_files(found, (str(ours),), "containerd imports it") == [
        f"{copied} is not gpuinfra's: containerd imports it (remove it, or declare it in "
        "base.site_files)"
    ]
    empty = FilesMatching().command(pattern=f"{tmp_path}/none/*.toml")
    assert subprocess.run(["sh", "-c", empty], capture_output=True, text=True).stdout == ""
    apt = ["/etc/apt/sources.list.d/gpuinfra.sources", "/etc/apt/sources.list.d/copied.sources"]
    assert apt_findings(apt, (), ("/etc/apt/sources.list.d/gpuinfra.sources",)) == [
        "apt: /etc/apt/sources.list.d/copied.sources is not gpuinfra's (remove it, or declare "
        "it in base.site_files)"
    ]


def test_every_rendered_path_of_a_host_is_its_own():
    """What the checks take as gpuinfra's on a host is exactly what its roles render there
    (every role's, as nvidia's containerd file sits in container_runtime's folder)."""
    from engine.context import host_context
    from toolkit.effective import ours_or_declared

    loaded = load(REPO / "inventory" / "sample" / "cluster.yml")
    one_per_groups = {tuple(host.groups): name for name, host in loaded.cluster.hosts.items()}
    for name in one_per_groups.values():
        ctx = host_context(loaded, name)
        assert ctx.rendered_paths() == set(files_of(loaded, name)), name
        assert set(ours_or_declared(ctx)) >= ctx.rendered_paths()


def test_rendered_paths_need_no_state_and_make_none(load_small):
    """`plan` and `drift` read state, never make it, and may run before any apply: a
    control-plane node's paths (the etcd client certificate among them) come without the etcd
    CA, and asking for them writes nothing."""
    from engine.context import host_context
    from inventory.model import StateAccess

    loaded = load_small().with_state_access(StateAccess.existing)
    paths = host_context(loaded, "cp-1").rendered_paths()
    assert any(path.startswith("/etc/kubernetes/pki/") for path in paths), sorted(paths)
    assert not loaded.state_dir.exists()


# `nft list chains` on a host with gpuinfra's table, iptables-nft's and a site's own.
NFT_CHAINS = """\
table inet gpuinfra {
\tchain input {
\t\ttype filter hook input priority filter; policy drop;
\t}
}
table ip filter {
\tchain INPUT {
\t\ttype filter hook input priority filter; policy accept;
\t}
\tchain KUBE-FIREWALL {
\t}
}
table inet block {
\tchain in {
\t\ttype filter hook input priority -10; policy accept;
\t}
\tchain out {
\t\ttype filter hook output priority 0; policy accept;
\t}
}
"""


def test_another_table_on_the_input_hook_is_named():
    chains = BaseChains().process(NFT_CHAINS.splitlines())
    assert ("inet gpuinfra", "input", "input", "drop") in chains
    assert other_tables(chains, FirewallConfig()) == [
        "nftables: table inet block filters input (chain in, policy accept) beside gpuinfra's "
        "(remove it, or declare it in firewall.foreign_tables)"
    ]
    declared = FirewallConfig(foreign_tables=[*FirewallConfig().foreign_tables, "inet block"])
    assert other_tables(chains, declared) == []
    # With no default allowance, iptables' table counts too (the control for the default).
    assert len(other_tables(chains, FirewallConfig(foreign_tables=[]))) == 2


def test_the_portmap_plugins_hostport_table_is_expected_by_default():
    """The routes CNI chain's portmap (nftables backend) DNATs pods' hostPorts in its own
    `cni_hostport` tables, on the prerouting hook: expected, as kube-proxy's."""
    chains = [
        ("ip cni_hostport", "prerouting", "prerouting", "accept"),
        ("ip6 cni_hostport", "prerouting", "prerouting", "accept"),
    ]
    assert other_tables(chains, FirewallConfig()) == []
    assert len(other_tables(chains, FirewallConfig(foreign_tables=[]))) == 2  # the control


@pytest.mark.parametrize(
    ("service", "socket", "off"),
    [
        ("enabled", "disabled", False),
        ("disabled", "enabled", False),  # Ubuntu 24.04: sshd started by its socket
        ("enabled-runtime", "disabled", True),  # for this boot only
        ("disabled", None, True),
    ],
)
def test_sshd_at_boot(service, socket, off):
    states = {
        "ssh.service": {"UnitFileState": service},
        "ssh.socket": None if socket is None else {"UnitFileState": socket},
    }
    assert ssh_off_at_boot(states) is off


def test_every_file_gpuinfra_writes_where_others_write_carries_the_marker():
    """The checks tell gpuinfra's files from others' by the marker in their first lines."""
    loaded = load(REPO / "inventory" / "sample" / "cluster.yml")
    checked = ("/etc/apt/sources.list.d/", "/etc/apt/preferences.d/", ".service.d/")
    seen = 0
    for name in loaded.cluster.hosts:
        for path, text in files_of(loaded, name).items():
            if any(part in path for part in checked):
                seen += 1
                assert MARKER in "".join(text.splitlines(True)[:3]), path
    assert seen > 0


def test_a_sysctl_file_read_after_ours_wins_at_boot():
    from toolkit.effective import ConfDirSettings, assignments, later_file_wins

    ours = assignments("# Managed by gpuinfra\nnet.core.somaxconn = 4096\nvm.swappiness = 0\n")
    found = ConfDirSettings().process([
        "/etc/sysctl.d/99-site.conf:net/core/somaxconn=128",
        "/etc/sysctl.d/10-early.conf:vm.swappiness = 60",  # read before ours: ours wins
        "/usr/lib/sysctl.d/50-default.conf:net.core.somaxconn = 4096",
        "/usr/lib/sysctl.d/99-same.conf:vm.swappiness =  0",  # the same value
    ])  # fmt: skip
    path = "/etc/sysctl.d/90-gpuinfra.conf"
    assert later_file_wins(found, path, ours, "sysctl") == [
        "sysctl: net.core.somaxconn = 128 set in /etc/sysctl.d/99-site.conf wins over "
        "gpuinfra's 4096 at the next boot"
    ]
    assert later_file_wins(found[1:], path, ours, "sysctl") == []


def test_a_limits_file_read_after_ours_wins_at_the_next_login(tmp_path):
    """The fact's command run by sh on files like a host's (the folder moved under tmp_path),
    then judged: a later file setting one of our limits to another value is named; the same
    value, an earlier file, another domain, a comment and a declared file are not."""
    from toolkit.effective import LIMITS_DIR, LimitsSettings, limits_overridden

    ours = "# Managed by gpuinfra\n* soft memlock unlimited\n* hard memlock unlimited\n"
    folder = tmp_path / LIMITS_DIR.lstrip("/")
    folder.mkdir(parents=True)
    (folder / "10-early.conf").write_text("* hard memlock 64\n")  # read before ours
    (folder / "90-gpuinfra.conf").write_text(ours)
    (folder / "91-same.conf").write_text("*\tsoft   memlock unlimited\n")
    (folder / "95-user.conf").write_text("alice - memlock 64\n# * - memlock 1\n")
    (folder / "99-site.conf").write_text("*  -  memlock  8192\n*  hard  nofile 10\n")
    command = LimitsSettings().command(("memlock",)).replace(LIMITS_DIR, str(folder))
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = LimitsSettings().process(output.stdout.splitlines())
    site = str(folder / "99-site.conf")
    assert [(Path(p).name, d, k, i, v) for p, d, k, i, v in found] == [
        ("10-early.conf", "*", "hard", "memlock", "64"),
        ("90-gpuinfra.conf", "*", "soft", "memlock", "unlimited"),
        ("90-gpuinfra.conf", "*", "hard", "memlock", "unlimited"),
        ("91-same.conf", "*", "soft", "memlock", "unlimited"),
        ("95-user.conf", "alice", "soft", "memlock", "64"),
        ("95-user.conf", "alice", "hard", "memlock", "64"),
        ("99-site.conf", "*", "soft", "memlock", "8192"),
        ("99-site.conf", "*", "hard", "memlock", "8192"),
    ]
    ours_path = str(folder / "90-gpuinfra.conf")
    assert limits_overridden(found, ours_path, ours, ()) == [
        f"limits: * {kind} memlock 8192 set in {site} wins over gpuinfra's unlimited at the "
        "next login (remove it, or declare it in base.site_files)"
        for kind in ("soft", "hard")
    ]
    assert limits_overridden(found, ours_path, ours, (site,)) == []
    assert limits_overridden([e for e in found if e[0] != site], ours_path, ours, ()) == []


def test_a_modprobe_line_that_stops_one_of_our_modules_is_named(tmp_path, monkeypatch):
    """The fact's command run by sh on folders like a host's (moved under tmp_path): a
    blacklist of either spelling of a module name and an install command that never loads it
    are named; an install that still runs modprobe, another module, a comment, an options line
    and a declared file are not. Without any of these files the command prints nothing."""
    from toolkit import effective

    folders = [tmp_path / folder.lstrip("/") for folder in effective.MODPROBE_CONF_DIRS]
    monkeypatch.setattr(effective, "MODPROBE_CONF_DIRS", tuple(map(str, folders)))
    fact = effective.ModprobeBlocks()
    modules = ("overlay", "br_netfilter", "nvidia-peermem")

    def found() -> list[tuple[str, str]]:
        command = fact.command(modules)
        output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        return fact.process(output.stdout.splitlines())

    assert found() == []
    for folder in folders:
        folder.mkdir(parents=True)
    site, vendor, declared = (
        folders[0] / "99-site.conf",
        folders[4] / "v.conf",
        folders[0] / "d.conf",
    )
    site.write_text(
        "blacklist br-netfilter\n# blacklist overlay\noptions overlay metacopy=on\n"
        "blacklist overlayfs\ninstall nvidia_peermem /bin/true\n"
    )
    vendor.write_text("install overlay /sbin/modprobe --ignore-install overlay && true\n")
    declared.write_text("blacklist overlay\n")
    lines = found()
    assert sorted((Path(p).name, line) for p, line in lines) == [
        ("99-site.conf", "blacklist br-netfilter"),
        ("99-site.conf", "install nvidia_peermem /bin/true"),
        ("d.conf", "blacklist overlay"),
        ("v.conf", "install overlay /sbin/modprobe --ignore-install overlay && true"),
    ]
    assert effective.modules_blocked(lines, (str(declared),)) == [
        f"modprobe: '{line}' in {site} keeps {name} from loading at boot (remove it, or "
        "declare it in base.site_files)"
        for line, name in (
            ("blacklist br-netfilter", "br-netfilter"),
            ("install nvidia_peermem /bin/true", "nvidia_peermem"),
        )
    ]


def test_an_apt_setting_read_after_ours_is_named_once_ours_is_in_place(tmp_path):
    """The fact's command run by sh on this machine's apt-config (its files moved under
    tmp_path), then judged: a later file turning recommends back on is named; before ours is
    written apt's default is no finding; a declared file is the site's choice."""
    from roles.base.effective import AptConfig, apt_conf_findings

    ours = (
        '// Managed by gpuinfra.\nAPT::Install-Recommends "false";\nAPT::Get::Assume-Yes "true";\n'
    )
    folder = tmp_path / "apt.conf.d"
    folder.mkdir()
    (folder / "90gpuinfra").write_text(ours)
    (folder / "99site").write_text('APT::Install-Recommends "true";\n')
    keys = ("apt::get::assume-yes", "apt::install-recommends")
    command = AptConfig().command(keys).replace("/etc/apt/apt.conf.d", str(folder))
    # apt-config reads the files apt reads: point it at the folder (APT_CONFIG names a file).
    (tmp_path / "apt.conf").write_text(f'Dir::Etc::parts "{folder}";\n')
    env = {**os.environ, "APT_CONFIG": str(tmp_path / "apt.conf")}
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    assert output.stderr == ""
    found = AptConfig().process(output.stdout.splitlines())
    assert found["effective"] == {"apt::get::assume-yes": "true", "apt::install-recommends": "true"}
    site, path = str(folder / "99site"), str(folder / "90gpuinfra")
    assert apt_conf_findings(found, path, ours, ()) == [
        f"apt: apt::install-recommends is true for apt, gpuinfra's is false: set in {site} "
        "(remove it, or declare it in base.site_files)"
    ]
    assert apt_conf_findings(found, path, ours, (site,)) == []
    unwritten = {**found, "lines": [line for line in found["lines"] if line[0] != path]}
    assert apt_conf_findings(unwritten, path, ours, ()) == []
    (folder / "99site").unlink()
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    found = AptConfig().process(output.stdout.splitlines())
    assert found["effective"]["apt::install-recommends"] == "false"
    assert apt_conf_findings(found, path, ours, ()) == []


def test_a_grub_file_read_after_ours_that_drops_our_arguments_is_named(tmp_path):
    """The fact's command run by sh on grub.d files (the folder moved under tmp_path): a later
    file that sets the command line afresh is named; one that keeps `$NAME` (either spelling),
    an earlier one and a declared one are not."""
    from toolkit.effective import GRUB_DIR, GrubAssignments, grub_assignments, grub_overridden

    ours = '# gpuinfra\nGRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"\n'
    folder = tmp_path / "grub.d"
    folder.mkdir()
    (folder / "10-early.cfg").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    (folder / "90-gpuinfra.cfg").write_text(ours)
    (folder / "95-keeps.cfg").write_text(
        'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} splash"\nGRUB_TIMEOUT=1\n'
    )
    (folder / "99-site.cfg").write_text('export GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    names = tuple(grub_assignments(ours))
    command = GrubAssignments().command(names).replace(GRUB_DIR, str(folder))
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = GrubAssignments().process(output.stdout.splitlines())
    assert [Path(path).name for path, *_ in found] == [
        "10-early.cfg",
        "90-gpuinfra.cfg",
        "95-keeps.cfg",
        "99-site.cfg",
    ]
    site, ours_path = str(folder / "99-site.cfg"), str(folder / "90-gpuinfra.cfg")
    assert grub_overridden(found, ours_path, ()) == [
        f"grub: GRUB_CMDLINE_LINUX_DEFAULT set in {site} drops gpuinfra's arguments at the next "
        "update-grub (keep $GRUB_CMDLINE_LINUX_DEFAULT in it, remove it, or declare it in "
        "base.site_files)"
    ]
    assert grub_overridden(found, ours_path, (site,)) == []


def test_servers_held_out_of_rotation_are_read_from_the_stats_csv():
    from roles.loadbalancer.facts import ServersHeldDown

    assert ServersHeldDown().process(["kube-apiserver/cp-1 MAINT", ""]) == [
        "kube-apiserver/cp-1 MAINT"
    ]
    assert "$18" in ServersHeldDown().command(port=8404)


def test_an_etcd_member_or_learner_the_inventory_lacks():
    from roles.etcd.deploy import foreign_members
    from roles.etcd.facts import Members

    initial = "etcd-1=https://10.0.0.1:2380,etcd-2=https://10.0.0.2:2380"
    members = Members().process([
        " etcd-1, https://10.0.0.1:2380, false",
        " etcd-2, https://10.0.0.2:2380, false",
        " , https://10.0.0.9:2380, true",
    ])  # fmt: skip
    assert foreign_members(members[:2], initial) == []
    assert foreign_members(members, initial) == [
        "etcd: member (not started) at https://10.0.0.9:2380 is not in the inventory"
    ]
    learner = [("etcd-2", "https://10.0.0.2:2380", True)]
    assert foreign_members(learner, initial) == [
        "etcd: member etcd-2 is a learner (promote it or remove it)"
    ]


def test_supplementary_groups_leave_the_primary_out():
    from toolkit.facts import SupplementaryGroups

    assert SupplementaryGroups().process(["etcd docker", "etcd"]) == ["docker"]
    assert SupplementaryGroups().process(["etcd", "etcd"]) == []
    assert SupplementaryGroups().process([]) is None


def test_every_file_where_a_service_reads_every_file():
    fact = FilesMatching()
    assert "/etc/containerd/conf.d/*.toml" in fact.command(pattern="/etc/containerd/conf.d/*.toml")
    assert fact.process(["/etc/containerd/conf.d/site.toml", ""]) == [
        "/etc/containerd/conf.d/site.toml"
    ]
    assert fact.default() == []


# What AuthorizedKeys' command prints: user, file, then the file's line (options and all).
LAB_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHnTbvVZ6nUT4nM1ziCvlf1pMGLTJ5u8jp7zF3OGE5qg"
OTHER_KEY = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7"


def test_a_login_key_the_inventory_does_not_declare_is_named_by_its_fingerprint(tmp_path):
    from roles.base.effective import AuthorizedKeys, declared_keys, fingerprint, unknown_keys

    found = AuthorizedKeys().process([
        f"root /root/.ssh/authorized_keys {LAB_KEY} gpuinfra-lab",
        "root /root/.ssh/authorized_keys2 "
        f'restrict,from="10.0.0.1 10.0.0.2" {OTHER_KEY} backdoor@somewhere',
        f"admin /home/admin/.ssh/authorized_keys {OTHER_KEY}",
    ])  # fmt: skip
    assert [entry[:3] for entry in found] == [
        ("root", "/root/.ssh/authorized_keys", "ssh-ed25519"),
        ("root", "/root/.ssh/authorized_keys2", "ssh-rsa"),
        ("admin", "/home/admin/.ssh/authorized_keys", "ssh-rsa"),
    ]
    key = tmp_path / "id_ed25519"
    key.write_text("not read: the .pub beside it is")
    (tmp_path / "id_ed25519.pub").write_text(f"{LAB_KEY} gpuinfra-lab\n")
    declared = declared_keys([], key)
    other = fingerprint(OTHER_KEY.split()[1])
    findings = unknown_keys(found, declared)
    assert findings == [
        "ssh: /root/.ssh/authorized_keys2 lets root log in with a key the inventory does not "
        f"declare: ssh-rsa {other} (backdoor@somewhere) (remove it, or declare it in "
        "base.authorized_keys)",
        "ssh: /home/admin/.ssh/authorized_keys lets admin log in with a key the inventory does "
        f"not declare: ssh-rsa {other} (remove it, or declare it in base.authorized_keys)",
    ]
    assert all(OTHER_KEY.split()[1] not in finding for finding in findings)  # never the key
    # This machine's sh runs the command: a user with no keys file, and none at all, add nothing.
    import subprocess

    command = AuthorizedKeys().command(users=("nobody", "no-such-user"))
    ran = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (0, "")
    assert unknown_keys(found, declared_keys([f"{OTHER_KEY} ops"], key)) == []


def test_the_declared_keys_and_the_fingerprint_ssh_keygen_prints(tmp_path):
    import subprocess

    from roles.base.effective import declared_keys, fingerprint, key_blob
    from toolkit.sshkeys import new_ed25519, public_key

    private = tmp_path / "key"
    private.write_text(new_ed25519())
    public = public_key(private.read_text())
    assert declared_keys([], private) == {public.split()[1]}  # no .pub: read from the key
    assert declared_keys([], None) == set()
    assert declared_keys(["# a comment", f"{LAB_KEY} lab"], None) == {LAB_KEY.split()[1]}
    (tmp_path / "key.pub").write_text(public + " me\n")
    keygen = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(tmp_path / "key.pub")], capture_output=True, text=True
    )
    if keygen.returncode == 0:  # ssh-keygen present: the same fingerprint
        assert fingerprint(public.split()[1]) == keygen.stdout.split()[1]
    assert key_blob("no key here") is None


def test_a_static_pod_or_a_kubeadm_patch_that_is_not_ours_is_named():
    from roles.kubernetes import deploy as kube_deploy
    from roles.kubernetes.kubeadm import KUBELET_PATCH, PATCHES_DIR, kubeadms_static_pods

    dropped = "/etc/kubernetes/manifests/miner.yaml"
    apiserver = "/etc/kubernetes/manifests/kube-apiserver.yaml"
    found = [apiserver, dropped]
    why = "kubelet runs it as a static pod"
    assert foreign_files(found, kubeadms_static_pods(control_plane=True), why) == [
        f"{dropped} is not gpuinfra's: {why} (remove it, or declare it in base.site_files)"
    ]
    # A worker runs no control-plane pod: kubeadm's file there was put there by someone else.
    assert len(foreign_files(found, kubeadms_static_pods(control_plane=False), why)) == 2
    patch = f"{PATCHES_DIR}/kube-apiserver+json.json"
    assert foreign_files([KUBELET_PATCH, patch], (KUBELET_PATCH,), "kubeadm applies it") == [
        f"{patch} is not gpuinfra's: kubeadm applies it (remove it, or declare it in "
        "base.site_files)"
    ]
    # The role's drift lists both folders (the checks run as operations of its deploy).
    source = Path(kube_deploy.__file__).read_text()
    assert 'f"{STATIC_PODS_DIR}/*"' in source and 'f"{PATCHES_DIR}/*"' in source
