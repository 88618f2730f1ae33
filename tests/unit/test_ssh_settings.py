"""One place builds the SSH settings of every SSH user (pyinfra, ssh command lines, paramiko),
and the bastion gets an ssh_config entry of its own, checked against the inventory's
known_hosts. OpenSSH's own parser (`ssh -G`, which connects nowhere) reads what we write."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from engine import fingerprint, runner
from engine.context import host_context, load, topology_of
from inventory.errors import InventoryInvalid
from toolkit import ssh
from toolkit.ssh import BASTION_ALIAS, Bastion, SSHSettings, ssh_settings


@pytest.fixture
def bastion_cluster(small_cluster, write_cluster):
    small_cluster["ssh"] = {
        "user": "admin",
        "key": "keys/id_ed25519",
        "known_hosts": "keys/known_hosts",
        "port": 2222,
        "bastion": "jump@10.0.0.11:2200",
    }
    path = write_cluster(small_cluster)
    keys = path.parent / "keys"
    keys.mkdir()
    (keys / "id_ed25519").write_text("not a real key\n")
    (keys / "id_ed25519").chmod(0o600)
    (keys / "known_hosts").write_text("")
    return load(path)


def ssh_g(*args: str) -> dict[str, str]:
    """OpenSSH's resolved configuration for a destination (`ssh -G` connects nowhere)."""
    done = subprocess.run(["ssh", "-G", *args], capture_output=True, text=True, check=True)
    resolved: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        resolved.setdefault(key, value)
    return resolved


def test_settings_resolve_key_known_hosts_and_bastion(bastion_cluster) -> None:
    settings = SSHSettings.from_cluster(bastion_cluster)
    base = bastion_cluster.base_dir
    assert settings.key == base / "keys" / "id_ed25519"
    assert settings.known_hosts == base / "keys" / "known_hosts"
    assert (settings.user, settings.port) == ("admin", 2222)
    assert settings.bastion == Bastion(host="10.0.0.11", port=2200, user="jump")
    assert Bastion.parse("bastion.example", "root") == Bastion("bastion.example", 22, "root")


def test_one_loaded_cluster_builds_its_settings_once_per_timeout(bastion_cluster, monkeypatch):
    built: list[int] = []
    original = SSHSettings.from_cluster.__func__

    def counting(cls, loaded, connect_timeout=ssh.CONNECT_TIMEOUT_S):
        built.append(connect_timeout)
        return original(cls, loaded, connect_timeout)

    monkeypatch.setattr(SSHSettings, "from_cluster", classmethod(counting))
    first = ssh_settings(bastion_cluster)
    assert ssh_settings(bastion_cluster) is first
    assert ssh.ssh_argv(bastion_cluster, "cp-1") == first.argv("10.0.0.21")
    assert ssh_settings(bastion_cluster, 7).connect_timeout == 7
    assert ssh_settings(bastion_cluster, 7) is not first
    assert first == SSHSettings.from_cluster(bastion_cluster)
    assert built == [ssh.CONNECT_TIMEOUT_S, 7, ssh.CONNECT_TIMEOUT_S]


def test_the_settings_go_with_their_cluster(bastion_cluster):
    copy = bastion_cluster.model_copy()
    ssh_settings(copy)
    assert id(copy) in ssh._BUILT
    key = id(copy)
    del copy
    assert key not in ssh._BUILT


def test_bad_bastion_is_an_inventory_error(small_cluster, load_small) -> None:
    small_cluster["ssh"] = {"bastion": "jump@host:notaport"}
    with pytest.raises(InventoryInvalid) as raised:
        load_small()
    assert "ssh.bastion" in str(raised.value)


def test_pyinfra_data_checks_host_keys_with_the_inventory_file(bastion_cluster) -> None:
    settings = SSHSettings.from_cluster(bastion_cluster, connect_timeout=7)
    data = settings.pyinfra_data(Path("/tmp/cfg"))
    assert data["ssh_strict_host_key_checking"] == "yes"
    assert data["ssh_known_hosts_file"] == str(settings.known_hosts)
    assert data["ssh_key"] == str(settings.key)
    assert (data["ssh_user"], data["ssh_port"], data["ssh_config_file"]) == (
        "admin",
        2222,
        "/tmp/cfg",
    )
    assert data["ssh_paramiko_connect_kwargs"] == {"timeout": 7, "banner_timeout": 7}


def runner_ssh_config(loaded) -> Path:
    inventory = runner._pyinfra_inventory(loaded, list(loaded.cluster.hosts), 10)
    return Path(inventory.get_host("cpu-1").data.ssh_config_file)


def test_bastion_has_its_own_entry_and_never_jumps_through_itself(bastion_cluster) -> None:
    """The runner's ssh_config as OpenSSH reads it: the jump host (here also a cluster host,
    etcd-1) is reached directly, with the inventory's known_hosts and strict checking; every
    node jumps through it. `Host *` + ProxyJump made the jump host jump through itself."""
    config = runner_ssh_config(bastion_cluster)
    known_hosts = str(SSHSettings.from_cluster(bastion_cluster).known_hosts)
    hop = ssh_g("-F", str(config), BASTION_ALIAS)
    assert (hop["hostname"], hop["port"], hop["user"]) == ("10.0.0.11", "2200", "jump")
    assert hop.get("proxyjump", "none") == "none"
    assert hop["stricthostkeychecking"] == "true"
    assert hop["userknownhostsfile"] == known_hosts
    for address in ("10.0.0.11", "10.0.0.71"):
        node = ssh_g("-F", str(config), address)
        assert node["proxyjump"] == f"{BASTION_ALIAS}:2200"
        assert (node["port"], node["user"]) == ("2222", "admin")
        assert node["userknownhostsfile"] == known_hosts
    # Written 0600 from creation, in a private folder: a read-only command writes no state.
    assert config.stat().st_mode & 0o777 == 0o600
    assert not bastion_cluster.state_dir.exists()


def test_apply_keeps_the_bastion_config_under_state(bastion_cluster) -> None:
    inventory = runner._pyinfra_inventory(bastion_cluster, ["cpu-1"], 10, persist=True)
    path = Path(inventory.get_host("cpu-1").data.ssh_config_file)
    assert path == bastion_cluster.state_dir / "ssh_config"
    assert path.stat().st_mode & 0o777 == 0o600
    assert "Host *" not in path.read_text()


def test_ssh_argv_checks_the_bastion_key_too(bastion_cluster) -> None:
    """The command line's hop (a ProxyCommand) checks the bastion's key strictly against the
    inventory's known_hosts, with the inventory's key; `-J` used the default known_hosts."""
    settings = SSHSettings.from_cluster(bastion_cluster)
    argv = settings.argv("10.0.0.71")
    resolved = ssh_g(*argv[1:])
    assert resolved["stricthostkeychecking"] == "true"
    assert resolved["userknownhostsfile"] == str(settings.known_hosts)
    hop = shlex.split(resolved["proxycommand"])
    assert hop[0] == "ssh" and hop[-3:] == ["-W", "%h:%p", "10.0.0.11"]
    assert hop[hop.index("-o") + 1] == "StrictHostKeyChecking=yes"
    assert f"UserKnownHostsFile={settings.known_hosts}" in hop
    assert hop[hop.index("-p") + 1] == "2200" and hop[hop.index("-l") + 1] == "jump"
    assert hop[hop.index("-i") + 1] == str(settings.key)


# A user's ssh_config that would send a command elsewhere. ssh finds ~/.ssh/config through the
# password database, not $HOME, so the tests hand it to ssh with an earlier -F: the last -F is
# the one ssh reads, as a -F in our command line replaces ~/.ssh/config.
HOSTILE_CONFIG = """\
Host 10.0.0.71 10.0.0.11
    HostName elsewhere.example
    User mallory
    Port 2022
    ProxyJump mallory@evil.example
"""


@pytest.fixture
def hostile_config(tmp_path) -> Path:
    path = tmp_path / "user_ssh_config"
    path.write_text(HOSTILE_CONFIG)
    # The control: read by ssh, this file does send the host elsewhere.
    resolved = ssh_g("-F", str(path), "10.0.0.71")
    assert (resolved["hostname"], resolved["user"]) == ("elsewhere.example", "mallory")
    assert resolved["proxyjump"] == "mallory@evil.example"
    return path


def test_the_probe_ignores_the_users_ssh_config(small_cluster, load_small, hostile_config):
    """The drift probe goes where pyinfra's connection goes (paramiko reads no ssh_config)."""
    small_cluster["ssh"] = {"user": "admin", "port": 2222}
    settings = SSHSettings.from_cluster(load_small())
    argv = fingerprint.check.probe_argv(settings, "10.0.0.71")
    assert argv[-2:] == ["sh", "-s"]
    resolved = ssh_g("-F", str(hostile_config), *argv[1:-2])
    assert (resolved["hostname"], resolved["user"], resolved["port"]) == (
        "10.0.0.71",
        "admin",
        "2222",
    )
    assert resolved.get("proxyjump", "none") == "none"
    assert resolved.get("proxycommand", "none") == "none"


def test_the_bastion_hop_ignores_the_users_ssh_config(bastion_cluster, hostile_config):
    """Through the bastion, the node and the hop to the bastion both ignore it."""
    settings = SSHSettings.from_cluster(bastion_cluster)
    argv = fingerprint.check.probe_argv(settings, "10.0.0.71")
    node = ssh_g("-F", str(hostile_config), *argv[1:-2])
    assert (node["hostname"], node["user"], node["port"]) == ("10.0.0.71", "admin", "2222")
    assert node.get("proxyjump", "none") == "none"
    hop = shlex.split(node["proxycommand"])
    assert hop[-3:] == ["-W", "%h:%p", "10.0.0.11"]
    bastion = ssh_g("-F", str(hostile_config), *hop[1:-3], "10.0.0.11")
    assert (bastion["hostname"], bastion["user"], bastion["port"]) == ("10.0.0.11", "jump", "2200")
    assert bastion.get("proxyjump", "none") == "none"


def test_firewall_admits_ssh_on_the_inventory_port_and_from_the_bastion(
    small_cluster, load_small
) -> None:
    """ssh.port 2222: the SSH rule must open 2222, not 22, or the drop policy locks the
    controller out mid-run; the bastion (outside the node network here) must be admitted."""
    small_cluster["ssh"] = {"port": 2222, "bastion": "jump@203.0.113.7"}
    loaded = load_small()
    rules = topology_of(loaded).firewall["all"]
    ssh = [rule for rule in rules if rule.description.startswith("SSH")]
    assert [rule.port for rule in ssh] == [2222]
    assert "203.0.113.7" in ssh[0].sources and "10.0.0.0/24" in ssh[0].sources


def test_sshd_drop_in_listens_on_the_inventory_port(small_cluster, load_small) -> None:
    from roles.base.files import managed_files

    small_cluster["ssh"] = {"port": 2222}
    loaded = load_small()
    ctx = host_context(loaded, "cpu-1", topology_of(loaded))
    drop_in = {f.path: f for f in managed_files(ctx)}["/etc/ssh/sshd_config.d/50-gpuinfra.conf"]
    assert "\nPort 2222\n" in drop_in.content
