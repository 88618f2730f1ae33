"""The etcd role offline: PKI (names, key modes, expiry), unit flags, release pins, disk rules."""

from __future__ import annotations

import datetime as dt
import json
import stat
import subprocess

import pytest
from cryptography import x509
from pydantic import ValidationError

from engine.context import host_context
from roles.etcd import pki
from roles.etcd.clusters import MAIN
from roles.etcd.config import EtcdConfig
from roles.etcd.files import (
    PKI,
    RESTART_MEMBER,
    UNIT,
    client_files,
    etcd_flags,
    managed_files,
    restarting_files,
)
from roles.etcd.gate import judge, parse_p99_ms
from roles.etcd.operations import refusal
from roles.etcd.release import CHECKSUMS, ReleaseUnknown, binary_dir, release
from tests.unit.fake_host import commands
from toolkit.spec import HostContext


@pytest.fixture
def loaded(small_cluster, load_small):
    small_cluster["hosts"]["etcd-2"]["etcd"] = {"disk": "/dev/nvme1n1", "member_name": "infra2"}
    return load_small()


def context(loaded, name: str) -> HostContext:
    return host_context(loaded, name)


def sans(cert_pem: str) -> tuple[set[str], set[str]]:
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(ext.get_values_for_type(x509.DNSName)), {
        str(ip) for ip in ext.get_values_for_type(x509.IPAddress)
    }


def test_member_certificates_name_the_host_fqdn_member_and_address(loaded):
    pairs = pki.ensure_pki(loaded)
    dns, ips = sans(pairs["etcd-2/server"].cert_pem)
    assert dns == {"etcd-2", "etcd-2.small.test", "infra2", "localhost"}
    assert ips == {"10.0.0.12", "127.0.0.1"}
    peer_dns, peer_ips = sans(pairs["etcd-2/peer"].cert_pem)
    assert peer_dns == {"etcd-2", "etcd-2.small.test", "infra2"} and peer_ips == {"10.0.0.12"}
    cert = x509.load_pem_x509_certificate(pairs["etcd-2/server"].cert_pem.encode())
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {u._name for u in usages} == {"serverAuth", "clientAuth"}
    client = x509.load_pem_x509_certificate(
        pairs["clients/kube-apiserver-etcd-client"].cert_pem.encode()
    )
    client_usages = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert [u._name for u in client_usages] == ["clientAuth"]


def test_private_keys_are_0600_in_a_0700_folder(loaded):
    pki.ensure_pki(loaded)
    root = pki.pki_dir(loaded)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    keys = list(root.rglob("*.key"))
    assert len(keys) == 1 + 2 * 3 + len(pki.CLIENTS)
    assert all(stat.S_IMODE(k.stat().st_mode) == 0o600 for k in keys)
    assert not list(root.rglob("*.partial"))


def test_certificates_are_kept_until_names_change_or_rotation(loaded, small_cluster, load_small):
    first = pki.ensure_pki(loaded)
    assert pki.ensure_pki(loaded)["etcd-1/server"] == first["etcd-1/server"]
    small_cluster["hosts"]["etcd-1"]["address"] = "10.0.0.99"
    moved = load_small()
    again = pki.ensure_pki(moved)
    assert again["etcd-1/server"] != first["etcd-1/server"]
    assert "10.0.0.99" in sans(again["etcd-1/server"].cert_pem)[1]
    assert again["ca"] == first["ca"]
    rotated = pki.ensure_pki(moved, rotate=True)
    assert rotated["etcd-3/peer"] != again["etcd-3/peer"] and rotated["ca"] == first["ca"]


def test_expiry_report_counts_days_and_flags_expiring(loaded):
    pki.ensure_pki(loaded, cert_days=20)
    report = pki.expiry_report(loaded)
    leaves = [e for e in report if e.name != "ca"]
    assert {e.days_left for e in leaves} == {19}
    assert {e.status for e in leaves} == {"expiring"}
    ca = next(e for e in report if e.name == "ca")
    assert ca.status == "ok" and ca.days_left > 3000
    later = pki.expiry_report(loaded, now=dt.datetime.now(dt.UTC) + dt.timedelta(days=40))
    assert {e.status for e in later if e.name != "ca"} == {"expired"}


def test_unit_flags_require_client_and_peer_certificates(loaded):
    flags = etcd_flags(context(loaded, "etcd-2"))
    assert "--name=infra2" in flags
    assert "--client-cert-auth=true" in flags and "--peer-client-cert-auth=true" in flags
    # A small cluster: etcd's 2 GiB default, the derived quota's floor (inventory/sizing.py).
    assert "--quota-backend-bytes=2147483648" in flags
    assert "--listen-metrics-urls=http://10.0.0.12:2381,http://127.0.0.1:2381" in flags
    assert (
        "--initial-cluster=etcd-1=https://10.0.0.11:2380,infra2=https://10.0.0.12:2380,"
        "etcd-3=https://10.0.0.13:2380" in flags
    )
    assert not any(f.startswith("--listen-client-urls=http:") for f in flags)


def test_settings_reach_the_unit_and_the_disk_is_checked_before_start(small_cluster, load_small):
    small_cluster["hosts"]["etcd-1"]["etcd"] = {"disk": "/dev/vdb"}
    small_cluster["group_vars"] = {
        "etcd": {"etcd": {"quota_backend_bytes": 4294967296, "heartbeat_interval_ms": 100,
                          "election_timeout_ms": 1000, "source": "distribution"}}
    }  # fmt: skip
    loaded = load_small()
    files = {f.path: f for f in managed_files(context(loaded, "etcd-1"))}
    unit = files["/etc/systemd/system/etcd.service"].content
    assert "ExecStart=/usr/bin/etcd \\" in unit
    assert "--quota-backend-bytes=4294967296" in unit and "--heartbeat-interval=100" in unit
    assert "Requires=etcd-data.service" in unit
    data_unit = files["/etc/systemd/system/etcd-data.service"].content
    assert (
        "blkid /dev/vdb >/dev/null; mount /var/lib/etcd; }; mountpoint -q /var/lib/etcd"
        in data_unit
    )
    plain = {f.path: f for f in managed_files(context(loaded, "etcd-2"))}
    assert "mountpoint" not in plain["/etc/systemd/system/etcd-data.service"].content
    assert [f.path for f in plain.values()] == list(files), "same files, same operations"
    keys = [f for f in files.values() if f.path.endswith(".key")]
    assert keys and all(k.secret and k.mode == "0600" for k in keys)
    assert files["/etc/etcd/pki/server.key"].user == "etcd"


def test_only_files_etcd_reads_restart_a_member(loaded):
    """The rolling restart follows the unit and the member's certificates; the operator's
    tools (etcdctl settings, scripts, backup units, operator certificate) restart nothing."""
    paths = {f.path for f in managed_files(context(loaded, "etcd-1"))}
    restarting = restarting_files(MAIN)
    assert restarting <= paths
    assert {UNIT, f"{PKI}/ca.crt", f"{PKI}/server.key", f"{PKI}/peer.crt"} <= restarting
    assert not any(p.startswith("/usr/local/sbin/") for p in restarting)
    quiet = paths - restarting
    assert {f"{PKI}/operator.key", MAIN.etcdctl_env, MAIN.backup_timer, RESTART_MEMBER} <= quiet


def test_restart_script_moves_leadership_then_waits_for_health(loaded):
    script = next(f for f in managed_files(context(loaded, "etcd-1")) if f.path == RESTART_MEMBER)
    body = script.content
    assert script.mode == "0755"
    moved, restarted, waited = (
        body.index("move-leader"),
        body.index("systemctl restart etcd"),
        body.index("/usr/local/sbin/etcd-wait-healthy"),
    )
    assert moved < restarted < waited
    assert "logger -t gpuinfra-etcd" in body


# `etcdctl endpoint status -w table` of each supported line, as the lab's members print it
# (3.6.16 built here, 3.5.16 Debian's): 3.6 has STORAGE VERSION and three more columns before
# IS LEADER.
STATUS_TABLES = {
    "3.6": (
        "| ENDPOINT | ID | VERSION | STORAGE VERSION | DB SIZE | IN USE | PERCENTAGE NOT IN USE "
        "| QUOTA | IS LEADER | IS LEARNER | RAFT TERM | RAFT INDEX | RAFT APPLIED INDEX | ERRORS "
        "| DOWNGRADE TARGET VERSION | DOWNGRADE ENABLED |\n"
        "| https://127.0.0.1:2379 | 330fe6215598ad79 | 3.6.16 | 3.6.0 | 1.7 MB | 1.7 MB | 0% "
        "| 2.1 GB | {leader} | false | 2 | 1311 | 1311 | | | false |\n"
    ),
    "3.5": (
        "| ENDPOINT | ID | VERSION | DB SIZE | IS LEADER | IS LEARNER | RAFT TERM | RAFT INDEX "
        "| RAFT APPLIED INDEX | ERRORS |\n"
        "| https://127.0.0.1:2379 | 330fe6215598ad79 | 3.5.16 | 20 kB | {leader} | false | 2 "
        "| 8 | 8 | |\n"
    ),
}
MEMBER_LIST = (
    "330fe6215598ad79, started, etcd-1, https://10.0.0.11:2380, https://10.0.0.11:2379, false\n"
    "6af5e8bf3ae2d81c, started, etcd-2, https://10.0.0.12:2380, https://10.0.0.12:2379, false\n"
)


@pytest.mark.parametrize("line", sorted(STATUS_TABLES))
@pytest.mark.parametrize("leads", [True, False])
def test_the_restart_script_reads_the_leader_on_both_etcd_lines(loaded, tmp_path, line, leads):
    """The rendered script run with stand-ins for etcdctl, systemctl and logger: a leader hands
    leadership to the next started voter before it restarts, on either line's table (3.6's
    moved IS LEADER: the leader restarted as leader on the lab); a follower moves nothing."""
    script = next(f for f in managed_files(context(loaded, "etcd-1")) if f.path == RESTART_MEMBER)
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    table, simple = tmp_path / "table", tmp_path / "simple"
    table.write_text(STATUS_TABLES[line].format(leader=str(leads).lower()))
    row = table.read_text().splitlines()[1]
    simple.write_text(", ".join(cell.strip() for cell in row.split("|")[1:-1]) + "\n")
    (tmp_path / "members").write_text(MEMBER_LIST)
    (tmp_path / "etcdctl.env").write_text("")
    stand_ins = {
        "etcdctl": (
            f'echo "etcdctl $*" >>{calls}\n'
            f'case "$*" in *"endpoint status -w table"*) cat {table};; '
            f'*"endpoint status -w simple"*) cat {simple};; '
            f'*"member list"*) cat {tmp_path / "members"};; esac'
        ),
        "systemctl": f'echo "systemctl $*" >>{calls}',
        "logger": f'echo "logger $*" >>{calls}',
        "wait-healthy": f'echo "wait $*" >>{calls}',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    body = script.content.replace(MAIN.etcdctl_env, str(tmp_path / "etcdctl.env"))
    body = body.replace(MAIN.wait_healthy, str(bin_dir / "wait-healthy"))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    subprocess.run(["sh", "-c", body, "restart", "30"], env=env, check=True, timeout=30)
    said = calls.read_text()
    moved = "move-leader 6af5e8bf3ae2d81c" in said
    assert moved is leads, said
    assert ("member 330fe6215598ad79: leadership moved to 6af5e8bf3ae2d81c" in said) is leads
    assert "member 330fe6215598ad79: restart begins" in said
    assert said.index("systemctl restart etcd") < said.index("wait 30")


def test_api_servers_get_the_ca_and_their_client_certificate(loaded):
    files = {f.path: f for f in client_files(context(loaded, "cp-1"))}
    assert set(files) == {
        "/etc/kubernetes/pki/etcd/ca.crt",
        "/etc/kubernetes/pki/apiserver-etcd-client.crt",
        "/etc/kubernetes/pki/apiserver-etcd-client.key",
    }
    assert files["/etc/kubernetes/pki/apiserver-etcd-client.key"].secret


def test_config_errors_name_the_key():
    with pytest.raises(ValidationError, match="mirror_url"):
        EtcdConfig(source="mirror")
    with pytest.raises(ValidationError, match="quota_backend_bytes"):
        EtcdConfig(quota_backend_bytes=16 * 2**30)
    with pytest.raises(ValidationError, match="election_timeout_ms"):
        EtcdConfig(heartbeat_interval_ms=500, election_timeout_ms=1000)
    with pytest.raises(ValidationError, match="disk_gate"):
        EtcdConfig(disk_gate=True)


def test_inventory_rejects_unknown_etcd_settings(small_cluster, load_small):
    from inventory.errors import InventoryInvalid

    small_cluster["group_vars"] = {"etcd": {"etcd": {"quota_bytes": 1}}}
    with pytest.raises(InventoryInvalid, match="quota_bytes"):
        load_small()


def test_upstream_release_is_pinned_by_checksum():
    rel = release(EtcdConfig(), "3.5.12", "x86_64")
    assert rel.url == (
        "https://github.com/etcd-io/etcd/releases/download/v3.5.12/etcd-v3.5.12-linux-amd64.tar.gz"
    )
    assert rel.sha256 == CHECKSUMS[("3.5.12", "amd64")] and rel.folder == "etcd-v3.5.12-linux-amd64"
    mirrored = release(
        EtcdConfig(source="mirror", mirror_url="http://m/etcd/"), "3.5.12", "aarch64"
    )
    assert mirrored.url == "http://m/etcd/etcd-v3.5.12-linux-arm64.tar.gz"
    assert mirrored.sha256 == CHECKSUMS[("3.5.12", "arm64")]
    with pytest.raises(ReleaseUnknown, match="etcd.sha256"):
        release(EtcdConfig(), "3.5.99", "x86_64")
    given = release(EtcdConfig(sha256="ab" * 32), "3.5.99", "x86_64")
    assert given.sha256 == "ab" * 32
    assert binary_dir(EtcdConfig(source="distribution")) == "/usr/bin"
    assert binary_dir(EtcdConfig()) == "/usr/local/bin"


def test_a_device_holding_anything_is_refused_with_what_is_on_it():
    assert refusal("/dev/vdb", {}) is None
    assert refusal("/dev/vdb", {"TYPE": "ext4", "LABEL": "gpuinfra-etcd", "UUID": "u"}) is None
    reason = refusal("/dev/vdb", {"TYPE": "xfs", "LABEL": "data", "UUID": "1234"})
    assert reason == "/dev/vdb already holds a xfs filesystem labelled 'data' (UUID 1234)"
    assert refusal("/dev/sdb", {"PTTYPE": "gpt"}) == "/dev/sdb holds a gpt partition table"


FIO = {"jobs": [{"sync": {"lat_ns": {"percentile": {"99.000000": 2_345_000}}}}]}


def test_disk_gate_reads_fio_p99_and_judges_it():
    output = "fio-3.39 warning\n" + json.dumps(FIO)
    assert parse_p99_ms(output) == pytest.approx(2.345)
    assert judge("e1", "/var/lib/etcd", output, True, 10.0, False).status == "pass"
    failed = judge("e1", "/var/lib/etcd", output, True, 1.0, False)
    assert failed.status == "fail" and "2.345 ms >= 1 ms" in failed.detail
    assert judge("e1", "/d", output, True, 1.0, True).status == "override"
    assert judge("e1", "/d", "fio: not found", False, 10.0, False).status == "error"
    assert judge("e1", "/d", "{}", True, 10.0, False).status == "error"


@pytest.mark.parametrize(
    ("packages", "expected"),
    [
        # the pinned version, as Debian 13 has it
        ({"etcd-server": {"3.5.16-4"}, "etcd-client": {"3.5.16-4"}}, "noop"),
        # another: held back, rolled by the role
        ({"etcd-server": {"3.5.15-1"}, "etcd-client": {"3.5.15-1"}}, "upgrade"),
        # etcdctl removed (the backup and day-2 commands need it), or at another version
        ({"etcd-server": {"3.5.16-4"}}, "install"),
        ({"etcd-server": {"3.5.16-4"}, "etcd-client": {"3.5.15-1"}}, "install"),
        ({}, "install"),  # absent (or removed with its configuration left: not in the list)
    ],
)
def test_distribution_etcd_is_read_from_dpkgs_list(packages, expected):
    """The distribution's etcd is judged from dpkg's list (DebPackages, which every host asks
    already): no dpkg-query of its own, the same decision."""
    from pyinfra.facts.deb import DebPackages

    from roles.etcd.operations import etcd_installed

    yielded, noops = commands(
        etcd_installed,
        {DebPackages: packages},
        cfg=EtcdConfig(source="distribution"),
        version="3.5.16",
    )
    if expected == "noop":
        assert (yielded, noops) == ([], ["etcd 3.5.16-4 installed"])
    else:
        assert len(yielded) == 1 and "etcd-server=3.5.16*" in yielded[0]
        assert ("policy-rc.d" in yielded[0]) is (expected == "upgrade")
