"""The etcd role's Events cluster (etcd.events): its members' units and certificates, its ports,
the rolling restart of each cluster on its own, and the API servers' flag derived from it."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from cryptography import x509
from pyinfra.context import ctx_host

from day2 import etcd as day2
from day2.etcd import common
from engine.context import host_context, load, topology_of
from inventory.errors import InventoryInvalid
from inventory.model import StateAccess
from roles.etcd import deploy as etcd_deploy
from roles.etcd import pki
from roles.etcd.clusters import EVENTS, MAIN
from roles.etcd.facts import Members
from roles.etcd.files import etcd_flags, managed_files, restarting_files
from roles.kubernetes.kubeadm import INIT_CONFIG
from tests.helpers import files_of
from tests.unit.conftest import SAMPLE
from tests.unit.test_etcd_hardening import Members as SshMembers
from tests.unit.test_etcd_hardening import remote
from toolkit.facts import SupplementaryGroups, UnitState

EVENTS_ON = {"etcd": {"etcd": {"events": {"enabled": True}}}}


@pytest.fixture
def loaded(small_cluster, load_small):
    small_cluster["hosts"]["etcd-2"]["etcd"] = {"member_name": "infra2"}
    small_cluster["group_vars"] = EVENTS_ON
    return load_small()


def api_server_args(loaded, host: str = "cp-1") -> dict[str, str]:
    documents = list(yaml.safe_load_all(files_of(loaded, host)[INIT_CONFIG]))
    config = next(d for d in documents if d["kind"] == "ClusterConfiguration")
    return {arg["name"]: arg["value"] for arg in config["apiServer"]["extraArgs"]}


def rules(loaded, group: str = "etcd") -> dict[int, set[str]]:
    return {
        rule.port: set(rule.sources)
        for rule in topology_of(loaded).rules_for([group])
        if rule.port is not None and 2379 <= rule.port <= 2384
    }


def test_off_by_default_nothing_of_it_is_rendered(load_small):
    plain = load_small()
    paths = set(files_of(plain, "etcd-1"))
    assert MAIN.unit_file in paths
    assert not {p for p in paths if "events" in p}
    assert set(rules(plain)) == {2379, 2380, 2381}
    assert "etcd-servers-overrides" not in api_server_args(plain)


def test_events_members_have_their_own_ports_names_data_and_certificates(loaded):
    flags = etcd_flags(host_context(loaded, "etcd-2"), EVENTS)
    assert "--name=infra2-events" in flags
    assert "--data-dir=/var/lib/etcd/events" in flags
    assert "--listen-client-urls=https://10.0.0.12:2383,https://127.0.0.1:2383" in flags
    assert "--advertise-client-urls=https://10.0.0.12:2383" in flags
    assert "--listen-peer-urls=https://10.0.0.12:2382" in flags
    assert "--listen-metrics-urls=http://10.0.0.12:2384,http://127.0.0.1:2384" in flags
    assert (
        "--initial-cluster=etcd-1-events=https://10.0.0.11:2382,infra2-events="
        "https://10.0.0.12:2382,etcd-3-events=https://10.0.0.13:2382" in flags
    )
    assert "--initial-cluster-token=small-etcd-events" in flags
    assert "--cert-file=/etc/etcd/pki/events-server.crt" in flags
    assert "--peer-key-file=/etc/etcd/pki/events-peer.key" in flags
    # The one CA bundle the API server's --etcd-cafile names and its client certificate
    # chains to: the same for both clusters.
    assert "--trusted-ca-file=/etc/etcd/pki/ca.crt" in flags
    assert "--client-cert-auth=true" in flags and "--peer-client-cert-auth=true" in flags
    main = etcd_flags(host_context(loaded, "etcd-2"), MAIN)
    assert "--name=infra2" in main and "--data-dir=/var/lib/etcd" in main
    assert "--initial-cluster-token=small-etcd" in main


def test_events_files_are_a_second_set_beside_the_main_ones(loaded):
    files = {f.path: f for f in managed_files(host_context(loaded, "etcd-1"))}
    for etcd in (MAIN, EVENTS):
        assert {etcd.unit_file, etcd.etcdctl_env, etcd.backup, etcd.backup_timer} <= set(files)
    unit = files["/etc/systemd/system/etcd-events.service"].content
    assert "Requires=etcd-data.service" in unit
    assert "EnvironmentFile=-/etc/etcd/initial-cluster-state-events.env" in unit
    assert "--data-dir=/var/lib/etcd/events" in unit
    env = files["/etc/etcd/etcdctl-events.env"].content
    assert (
        "GPUINFRA_ETCD_ENDPOINTS=https://10.0.0.11:2383,https://10.0.0.12:2383,"
        "https://10.0.0.13:2383" in env
    )
    restart = files["/usr/local/sbin/etcd-events-restart-member"].content
    assert "systemctl restart etcd-events\n" in restart
    assert "--endpoints=https://127.0.0.1:2383 " in restart and ":2379" not in restart
    assert "/usr/local/sbin/etcd-events-wait-healthy" in restart
    wait = files["/usr/local/sbin/etcd-events-wait-healthy"].content
    assert ". /etc/etcd/etcdctl-events.env;" in wait and ":2379" not in wait
    keys = [f for p, f in files.items() if p.startswith("/etc/etcd/pki/events-")]
    assert len(keys) == 4 and all(f.secret for f in keys if f.path.endswith(".key"))


def test_events_snapshots_go_to_their_own_folder_with_their_own_timer(loaded):
    files = {f.path: f.content for f in managed_files(host_context(loaded, "etcd-1"))}
    backup = files["/usr/local/sbin/etcd-events-backup"]
    assert "--endpoints=https://127.0.0.1:2383 " in backup
    # Its own folder: the main script's pruning (etcd-*.db in backup_dir) never reaches it.
    assert 'name="/var/backups/etcd/events/etcd-etcd-1-events-' in backup
    assert "ls -1t /var/backups/etcd/events/etcd-*.db" in backup
    assert "ls -1t /var/backups/etcd/etcd-*.db" in files["/usr/local/sbin/etcd-backup"]
    service = files["/etc/systemd/system/etcd-events-backup.service"]
    assert "ExecCondition=systemctl is-active --quiet etcd-events.service" in service
    assert "ExecStart=/usr/local/sbin/etcd-events-backup" in service


def test_events_certificates_name_the_member_and_chain_to_the_etcd_ca(loaded):
    pairs = pki.ensure_pki(loaded, events=True)
    ca = x509.load_pem_x509_certificate(pairs["ca"].cert_pem.encode())
    server = x509.load_pem_x509_certificate(pairs["etcd-2/events-server"].cert_pem.encode())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {
        "etcd-2",
        "etcd-2.small.test",
        "infra2-events",
        "localhost",
    }
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {
        "10.0.0.12",
        "127.0.0.1",
    }
    cn = server.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    assert cn == "infra2-events"
    peer = x509.load_pem_x509_certificate(pairs["etcd-2/events-peer"].cert_pem.encode())
    peer.verify_directly_issued_by(ca)
    assert pairs["etcd-2/events-server"] != pairs["etcd-2/server"]
    # The API server's client certificate is signed by the same CA the Events members trust.
    client = pairs["clients/kube-apiserver-etcd-client"].cert_pem.encode()
    x509.load_pem_x509_certificate(client).verify_directly_issued_by(ca)
    assert "etcd-2/events-server" not in pki.ensure_pki(loaded)


def test_each_member_is_given_its_own_events_certificate(loaded):
    rendered = files_of(loaded, "etcd-1")
    pairs = pki.ensure_pki(loaded, events=True)
    assert rendered["/etc/etcd/pki/events-server.crt"] == pairs["etcd-1/events-server"].cert_pem
    assert rendered["/etc/etcd/pki/events-peer.key"] == pairs["etcd-1/events-peer"].key_pem
    assert rendered["/etc/etcd/pki/server.crt"] == pairs["etcd-1/server"].cert_pem


def test_events_ports_open_to_their_own_peers_and_clients_only(loaded):
    members = {"10.0.0.11", "10.0.0.12", "10.0.0.13"}
    on_members = rules(loaded)
    assert on_members[2382] == members
    assert on_members[2383] == members | {"10.0.0.21", "10.0.0.22"}
    assert on_members[2384] == {"10.0.0.51"}
    assert on_members[2380] == members and on_members[2379] == on_members[2383]
    assert not {2382, 2383, 2384} & set(rules(loaded, "control_plane"))


def test_the_api_servers_keep_events_in_the_events_cluster(loaded):
    assert api_server_args(loaded)["etcd-servers-overrides"] == (
        "/events#https://10.0.0.11:2383;https://10.0.0.12:2383;https://10.0.0.13:2383"
    )


def test_an_explicit_events_etcd_wins_over_the_events_cluster(small_cluster, load_small):
    small_cluster["group_vars"] = {
        **EVENTS_ON,
        "control_plane": {"kubernetes": {"events_etcd_endpoints": ["https://10.9.0.1:2379"]}},
    }
    external = load_small()
    assert api_server_args(external)["etcd-servers-overrides"] == "/events#https://10.9.0.1:2379"


def test_members_must_agree_on_the_events_cluster(small_cluster, load_small):
    small_cluster["hosts"]["etcd-3"]["vars"] = {"etcd": {"events": {"enabled": True}}}
    with pytest.raises(InventoryInvalid) as excinfo:
        load_small()
    assert "one value for every etcd member (on only for etcd-3)" in str(excinfo.value)


def test_monitoring_scrapes_the_events_members(loaded):
    prometheus = yaml.safe_load(files_of(loaded, "mon-1")["/etc/prometheus/prometheus.yml"])
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    targets = {t for c in jobs["etcd-events"]["static_configs"] for t in c["targets"]}
    assert targets == {f"etcd-{i}.small.test:2384" for i in (1, 2, 3)}


def test_the_sample_runs_the_events_cluster():
    # Placeholders, as `gpuinfra render` shows them: no PKI written beside the sample.
    sample = load(SAMPLE).with_state_access(StateAccess.placeholder)
    endpoints = [f"https://10.40.1.1{i}:2383" for i in range(1, 6)]
    assert api_server_args(sample)["etcd-servers-overrides"] == "/events#" + ";".join(endpoints)
    assert "/etc/systemd/system/etcd-events.service" in files_of(sample, "etcd-1")


class _Facts:
    def __init__(self, facts: dict):
        self.facts = facts

    def get_fact(self, fact, **arguments):
        return self.facts.get((fact, tuple(sorted(arguments.items()))))

    def noop(self, message):
        pass


def _apply(loaded, changed: set[str], monkeypatch) -> list[tuple[str, dict[str, Any]]]:
    """The etcd deploy on etcd-1 with both units running and `changed` files changed: the
    operations it declares, in order, as (name, arguments)."""
    calls: list[tuple[str, dict[str, Any]]] = []

    class Meta:
        def __init__(self, changed: bool):
            self.changed = changed

        def did_change(self) -> bool:
            return self.changed

    def record(kind: str):
        def call(*args: Any, **kwargs: Any) -> Meta:
            calls.append((kwargs.get("name", kind), {**kwargs, "args": args}))
            return Meta(False)

        return call

    stub = SimpleNamespace(
        data_disk=record("disk"),
        disk_gate=record("gate"),
        disk_gate_barrier=record("barrier"),
        etcd_installed=record("install"),
        unit_running=record("unit"),
    )
    monkeypatch.setattr(etcd_deploy, "etcd_ops", stub)
    monkeypatch.setattr(etcd_deploy, "system_account", record("account"))
    monkeypatch.setattr(etcd_deploy, "apt", SimpleNamespace(packages=record("apt")))
    monkeypatch.setattr(etcd_deploy, "files", SimpleNamespace(directory=record("directory")))
    monkeypatch.setattr(etcd_deploy, "systemd", SimpleNamespace(daemon_reload=record("reload")))
    monkeypatch.setattr(etcd_deploy, "server", SimpleNamespace(shell=record("shell")))
    monkeypatch.setattr(etcd_deploy, "put_file", lambda f: Meta(f.path in changed))
    monkeypatch.setattr(etcd_deploy, "unit_dropins", record("dropins"))
    monkeypatch.setattr(
        etcd_deploy, "nothing_overrides", lambda name, found: calls.append((name, {}))
    )
    running = {"ActiveState": "active", "UnitFileState": "enabled"}
    facts = {
        (UnitState, (("unit", "etcd"),)): running,
        (UnitState, (("unit", "etcd-events"),)): running,
        (Members, (("env_file", MAIN.etcdctl_env),)): [],
        (Members, (("env_file", EVENTS.etcdctl_env),)): [],
        (SupplementaryGroups, (("user", "etcd"),)): [],
    }
    with ctx_host.use(_Facts(facts)):
        etcd_deploy.apply.__wrapped__(host_context(loaded, "etcd-1"))
    return calls


def _restarts(calls) -> dict[str, bool]:
    return {
        name: arguments["_if"]()
        for name, arguments in calls
        if name.startswith("Restart ") and arguments.get("_serial")
    }


def test_each_cluster_rolls_on_its_own_the_main_one_first(loaded, monkeypatch):
    calls = _apply(loaded, {"/etc/etcd/pki/events-server.crt"}, monkeypatch)
    names = [name for name, _ in calls]
    main = "Restart etcd, one member at a time, each waiting for a healthy cluster"
    events = "Restart etcd Events, one member at a time, each waiting for a healthy cluster"
    # Two serial operations, one after the other: the main roll is over on every member
    # before an Events member restarts, so each cluster loses one member at a time at most.
    assert names.index(main) < names.index(events)
    assert _restarts(calls) == {main: False, events: True}
    directory = dict(calls)["Own the etcd Events data directory (0700)"]
    assert (directory["path"], directory["mode"], directory["user"]) == (
        "/var/lib/etcd/events",
        "0700",
        "etcd",
    )
    assert "Check that etcd Events has no member the inventory lacks" in names
    dropins = dict(calls)["dropins"]["args"]
    assert set(dropins[1]) == {
        "etcd",
        "etcd-backup.timer",
        "etcd-events",
        "etcd-events-backup.timer",
    }


def test_a_change_both_clusters_read_rolls_both(loaded, monkeypatch):
    assert set(_restarts(_apply(loaded, {"/etc/etcd/pki/ca.crt"}, monkeypatch)).values()) == {True}
    assert not any(_restarts(_apply(loaded, {EVENTS.backup_timer}, monkeypatch)).values())
    assert restarting_files(EVENTS) & restarting_files(MAIN) == {
        "/etc/etcd/pki/ca.crt",
        "/etc/systemd/system/etcd-data.service",
    }


def test_status_asks_the_events_members_on_their_own_port(monkeypatch, loaded):
    from day2.etcd import common, status
    from tests.unit.test_etcd_day2 import status_output
    from tests.unit.test_etcd_hardening import remote

    asked: list[str] = []

    def run_on(loaded, host, command, **kwargs):
        asked.append(command)
        healthy = status_output(int(host[-1]), 1, True)
        return remote(True, "" if "alarm list" in command else healthy, "")

    monkeypatch.setattr(common, "run_remote", run_on)
    result = status(loaded, EVENTS)
    assert result.health == "healthy"
    assert [m.name for m in result.members] == ["etcd-1-events", "infra2-events", "etcd-3-events"]
    script = asked[0]
    assert ". /etc/etcd/etcdctl-events.env;" in script
    assert "--endpoints=https://127.0.0.1:2383 " in script and "127.0.0.1:2379" not in script
    assert "http://127.0.0.1:2384/metrics" in script and "journalctl -u etcd-events " in script
    assert "df -B1 --output=size,avail /var/lib/etcd/events " in script
    assert "https://127.0.0.1:2383" in asked[-1] and "alarm list" in asked[-1]


def test_events_commands_refuse_a_cluster_without_it(load_small):
    from day2.etcd import EtcdOperationError, status

    with pytest.raises(EtcdOperationError, match="etcd.events is off"):
        status(load_small(), EVENTS)


def test_a_snapshot_of_the_events_cluster_is_taken_from_its_own_port(monkeypatch, loaded, tmp_path):
    from day2.etcd import common, snapshot
    from tests.unit.test_etcd_hardening import remote

    asked: list[str] = []

    def run_on(loaded, host, command, stdout=None, **kwargs):
        asked.append(command)
        if stdout is not None:
            stdout.write(b"snapshot")
        return remote(True, '{"revision": 7, "totalKey": 3}', "")

    monkeypatch.setattr(common, "run_remote", run_on)
    snapshot(loaded, tmp_path / "events.db", EVENTS)
    assert "etcdctl --endpoints=https://127.0.0.1:2383 --command-timeout=3s" in asked[0]
    assert (
        "etcdctl --endpoints=https://127.0.0.1:2383 --command-timeout=15m snapshot save"
        in (asked[1])
    )
    assert (tmp_path / "events.db").read_bytes() == b"snapshot"


class EventsMembers(SshMembers):
    """The members over SSH, answering each cluster's member list from its own port."""

    def __call__(self, loaded, host, command, **kwargs):
        if "member list" in command and "127.0.0.1:2383" in command:
            self.commands.append((host, command))
            member = {"ID": 23, "name": "infra2-events", "peerURLs": ["https://10.0.0.12:2382"]}
            return remote(True, json.dumps({"members": [member]}), "")
        return super().__call__(loaded, host, command, **kwargs)


def test_replace_with_events_replaces_the_events_member_and_leaves_the_main_one(
    monkeypatch, loaded
):
    members = EventsMembers()
    monkeypatch.setattr(common, "run_remote", members)
    day2.replace(loaded, "etcd-2", stamp="S", etcd=EVENTS)
    commands = [c for _, c in members.commands]
    etcdctl = [c for c in commands if "etcdctl " in c]
    assert etcdctl and all(
        "/etc/etcd/etcdctl-events.env" in c and "127.0.0.1:2383" in c for c in etcdctl
    )
    main_unit = re.compile(r"systemctl (stop|start) etcd(?!-events)")
    assert not any(main_unit.search(c) for c in commands), commands
    assert "/etc/systemd/system/etcd-events.service.d/" in commands[members.first("systemctl stop")]
    assert members.sent("mv /var/lib/etcd/events/member /var/lib/etcd/events/member.before-")
    assert members.sent("member remove 17")  # 23, as etcdctl writes member ids: hex
    added = commands[members.first("member add")]
    assert "member add infra2-events --learner --peer-urls=https://10.0.0.12:2382" in added
    joined = commands[members.first("systemctl start etcd-events")]
    assert "/etc/etcd/initial-cluster-state-events.env" in joined
    assert members.sent("/usr/local/sbin/etcd-events-wait-healthy")
    # Control: the main cluster's replace on the same host touches only the main member.
    main = EventsMembers()
    monkeypatch.setattr(common, "run_remote", main)
    day2.replace(loaded, "etcd-2", stamp="S")
    assert main.sent("systemctl stop etcd &&") and not main.sent("etcd-events")
    assert not main.sent("127.0.0.1:2383") and main.sent("member add infra2 --learner")


def test_replace_with_events_is_refused_where_the_events_cluster_is_off(monkeypatch, load_small):
    members = EventsMembers()
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdOperationError, match="etcd.events is off"):
        day2.replace(load_small(), "etcd-2", etcd=EVENTS)
    assert members.commands == []
