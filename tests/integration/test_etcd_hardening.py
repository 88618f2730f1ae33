"""etcd hardening on lab hosts (issue 13): restore that stages before it swaps and rolls back,
replace that never loses data, certificate renewal on apply, CA rotation with a client
writing throughout, and one member's data disk full.

The lab is its own and small: three etcd members (etcd-3 with a 512 MiB loop disk as its data
disk, so it can be filled) and cp-1, the API server's stand-in holding the etcd client
certificate and running the writer. Its name is `etcdh` (GPUINFRA_ETCDH_LAB_NAME overrides).
Tests that break a member leave the cluster healthy again before they end.

Part of `make test` (about 6 minutes here, beside the other modules; `pytest -m etcdfaults`
selects it alone): every test injects a fault, and five of them are the positive proofs of
etcd's day-2 commands (CA rotation, certificate renewal on apply, replace, restore).
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cli.exitcodes import ExitCode
from lab import lifecycle
from lab.inventory import DEBIAN_ETCD
from lab.topology import HostSpec, Topology
from roles.etcd import pki
from roles.etcd.clusters import cluster_settings, clusters
from tests.integration.conftest import KEEP_ENV, boot_lab
from tests.integration.etcd_helpers import CLIENT_ENV, endpoints, etcdctl, status, wait_healthy
from tests.integration.roles_helpers import gpuinfra

pytestmark = [pytest.mark.integration, pytest.mark.etcdfaults]

LAB = os.environ.get("GPUINFRA_ETCDH_LAB_NAME", "etcdh")
MEMBERS = ["etcd-1", "etcd-2", "etcd-3"]
# Small enough to fill in seconds; large enough for a restore's staged copy beside the live
# data (each holds two preallocated 64 MiB WAL segments: 256 MiB was seen to fail staging).
SMALL_DISK = 512 * 2**20
RESULTS: dict[str, object] = {}  # measured figures, printed at the end of the module


def topology() -> Topology:
    hosts = (
        HostSpec("etcd-1", ("etcd",)),
        HostSpec("etcd-2", ("etcd",)),
        HostSpec("etcd-3", ("etcd",), disk_bytes=SMALL_DISK),
        HostSpec("cp-1", ("control_plane",)),
    )
    return Topology(hosts, "etcdh")


@pytest.fixture(scope="module")
def lab():
    inventory = Path(f"/tmp/gpuinfra-itest-{LAB}/cluster.yml")
    cluster = boot_lab(LAB, topology(), inventory)
    yield cluster
    print("\netcd hardening figures:", json.dumps(RESULTS, indent=2))
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(LAB)


@pytest.fixture(scope="module")
def converged(lab):
    started = time.monotonic()
    result = gpuinfra("apply", str(lab.inventory_path), "--roles", "base,etcd", "--yes")
    RESULTS["apply_seconds"] = round(time.monotonic() - started, 1)
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    lab.ssh("cp-1", "DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-client >/dev/null")
    return lab


def test_cluster_converges(converged):
    data = wait_healthy(converged)
    assert data["healthy_members"] == 3
    # Debian's etcd line, the second one gpuinfra supports (test_role_etcd.py runs the
    # sample's): the day-2 commands below run on it.
    assert {m["version"] for m in data["members"]} == {DEBIAN_ETCD}
    assert etcdctl(converged, "put hardening/probe yes").stdout.strip() == "OK"


SERVED = (
    'python3 -c "import json, socket, ssl; c = ssl.create_default_context('
    "cafile='/etc/kubernetes/pki/etcd/ca.crt'); c.check_hostname = False; "
    "c.load_cert_chain('/etc/kubernetes/pki/apiserver-etcd-client.crt', "
    "'/etc/kubernetes/pki/apiserver-etcd-client.key'); "
    "s = c.wrap_socket(socket.create_connection(('{address}', 2379), 5)); "
    "p = s.getpeercert(); print(json.dumps([p['serialNumber'], p['notAfter']]))\""
)


def served(lab, member: str) -> tuple[int, datetime]:
    """The serial and expiry of the certificate a member serves, read over TLS from cp-1."""
    serial, not_after = json.loads(
        lab.ssh("cp-1", SERVED.format(address=lab.address(member))).stdout
    )
    expiry = datetime.strptime(not_after, "%b %d %H:%M:%S %Y %Z").replace(tzinfo=UTC)
    return int(serial, 16), expiry


def state_cert(lab, stem: str) -> x509.Certificate:
    path = lab.loaded.state_dir / "etcd-pki" / f"{stem}.crt"
    return x509.load_pem_x509_certificate(path.read_bytes())


def apply_etcd(lab) -> dict:
    result = gpuinfra("apply", str(lab.inventory_path), "--roles", "etcd", "--yes", "--format",
                      "json")  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    return json.loads(result.stdout)


RESTART = "Etcd | Restart etcd, one member at a time, each waiting for a healthy cluster"


def restarted(report: dict) -> set[str]:
    return {
        member
        for member in MEMBERS
        if any(o["name"] == RESTART and o["changed"] for o in report["hosts"][member]["operations"])
    }


def test_apply_renews_a_member_certificate_inside_the_threshold(converged):
    """etcd-2's server certificate in the PKI has 10 days left (under the 30-day default):
    apply issues a new one, pushes it and restarts etcd-2 alone; the member then serves a
    certificate valid for about a year. Today's main pushed the 10-day certificate as it was."""
    lab = converged
    wait_healthy(lab)
    before_serial, _ = served(lab, "etcd-2")
    root = lab.loaded.state_dir / "etcd-pki"
    ca_key = serialization.load_pem_private_key((root / "ca.key").read_bytes(), None)
    spec = pki.member_specs(lab.loaded, "etcd-2")[0]
    key = ec.generate_private_key(ec.SECP256R1())
    short = pki._leaf_certificate(spec, key, state_cert(lab, "ca"), ca_key, 10)
    pki._write_pair(root, spec.stem, short, key)
    # Positive control: the PKI now holds the short certificate the apply must replace.
    assert state_cert(lab, "etcd-2/server").serial_number == short.serial_number

    report = apply_etcd(lab)
    assert restarted(report) == {"etcd-2"}, restarted(report)
    renewed = state_cert(lab, "etcd-2/server")
    assert renewed.serial_number not in (short.serial_number, before_serial)
    serial, expiry = served(lab, "etcd-2")
    assert serial == renewed.serial_number
    days_left = (expiry - datetime.now(UTC)).days
    RESULTS["renewed_days_left"] = days_left
    assert days_left > 300, expiry
    assert wait_healthy(lab)["healthy_members"] == 3


# A client as a real one behaves (the API server retries): each write is one etcdctl call, and a
# failed call is retried once after a second. "retry" lines say what the first attempt got;
# "fail" means the cluster refused the same write twice, a second apart.
WRITER = """\
put() {{ {env} etcdctl --endpoints={eps} --command-timeout=5s put ca/$1 $1 >/dev/null; }}
said() {{ tr '\\n' ' ' < /tmp/writer.err | tail -c 300; }}
i=0
while [ ! -e /tmp/writer.stop ]; do
    i=$((i+1))
    if put $i 2>/tmp/writer.err; then
        echo ok
    else
        echo "retry $i $(date +%s.%N) $(said)"
        sleep 1
        if put $i 2>/tmp/writer.err; then echo ok; else echo "fail $i $(date +%s.%N) $(said)"; fi
    fi
done
"""


def test_rotate_ca_keeps_a_client_writing_and_ends_on_the_new_ca(converged):
    """`etcd rotate-ca` while a writer on cp-1 writes through every step: no write refused
    twice, every served certificate and every certificate in the PKI chains to the new CA, the
    members and the client trust only the new CA, and a client certificate of the old CA is
    refused while the new one is accepted."""
    lab = converged
    wait_healthy(lab)
    old_ca = state_cert(lab, "ca")
    client = "/etc/kubernetes/pki/apiserver-etcd-client"
    lab.ssh("cp-1", f"cp {client}.crt /root/old-client.crt && cp {client}.key /root/old-client.key")
    script = WRITER.format(env=CLIENT_ENV, eps=endpoints(lab))
    lab.ssh("cp-1", f"rm -f /tmp/writer.stop; cat > /tmp/writer.sh <<'EOF'\n{script}EOF")
    lab.ssh("cp-1", "nohup sh /tmp/writer.sh > /tmp/writer.log 2>&1 &")
    try:
        result = gpuinfra("etcd", "rotate-ca", str(lab.inventory_path), "--yes", "--format", "json")
    finally:
        lab.ssh("cp-1", "touch /tmp/writer.stop; sleep 12")
    log = lab.ssh("cp-1", "cat /tmp/writer.log").stdout.splitlines()
    counts = {
        "writes_ok": sum(1 for line in log if line == "ok"),
        "writes_retried": sum(1 for line in log if line.startswith("retry")),
        "writes_failed": sum(1 for line in log if line.startswith("fail")),
        "first_attempt_errors": [line for line in log if line.startswith("retry")][:5],
    }
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    rotation = json.loads(result.stdout)
    RESULTS["rotate_ca"] = counts | {
        "seconds": round(rotation["seconds"], 1),
        "steps": {s["step"]: round(s["seconds"], 1) for s in rotation["steps"]},
    }
    assert [s["step"] for s in rotation["steps"]] == ["trust-new", "reissue", "drop-old"]
    assert all(s["health"] == "healthy" and not s["apply_errors"] for s in rotation["steps"])
    assert counts["writes_ok"] > 20 and counts["writes_failed"] == 0, counts

    new_ca = state_cert(lab, "ca")
    assert new_ca.serial_number != old_ca.serial_number
    assert int(rotation["new_ca_serial"], 16) == new_ca.serial_number
    for stem in [f"{m}/{kind}" for m in MEMBERS for kind in ("server", "peer")] + [
        "clients/operator",
        "clients/kube-apiserver-etcd-client",
    ]:
        state_cert(lab, stem).verify_directly_issued_by(new_ca)
    for member in MEMBERS:
        assert served(lab, member)[0] == state_cert(lab, f"{member}/server").serial_number
        trusted = lab.ssh(member, "cat /etc/etcd/pki/ca.crt").stdout
        assert x509.load_pem_x509_certificates(trusted.encode()) == [new_ca], member
    client_trust = lab.ssh("cp-1", "cat /etc/kubernetes/pki/etcd/ca.crt").stdout
    assert x509.load_pem_x509_certificates(client_trust.encode()) == [new_ca]
    old_client = lab.ssh(
        "cp-1",
        "ETCDCTL_CACERT=/etc/kubernetes/pki/etcd/ca.crt ETCDCTL_CERT=/root/old-client.crt "
        f"ETCDCTL_KEY=/root/old-client.key etcdctl --endpoints={endpoints(lab)} "
        "--command-timeout=5s put ca/old-client x",
        check=False,
    )
    assert old_client.returncode != 0, old_client.stdout
    assert etcdctl(lab, "put ca/new-client x").stdout.strip() == "OK"
    assert not (lab.loaded.state_dir / "etcd-pki" / "ca-previous.crt").exists()


def local_get(lab, member: str, key: str) -> str:
    """A key as one member holds it (serializable read from its own data)."""
    return lab.ssh(
        member,
        "set -a; . /etc/etcd/etcdctl.env; etcdctl --endpoints=https://127.0.0.1:2379 "
        f"get {key} --print-value-only --consistency=s",
    ).stdout.strip()


def db_inode(lab, member: str) -> str:
    return lab.ssh(member, "stat -c %i /var/lib/etcd/member/snap/db").stdout.strip()


def leftovers(lab, member: str) -> list[str]:
    """Names in the data directory besides etcd's own (and ext4's lost+found, and the Events
    cluster's data below it where etcd.events is on, as in the sample), and a snapshot copy
    left in /var/tmp."""
    listing = "ls -A /var/lib/etcd; ls /var/tmp/gpuinfra-etcd-snapshot.db 2>/dev/null"
    names = lab.ssh(member, listing, check=False).stdout.split()
    subdirs = {c.subdir for c in clusters(cluster_settings(lab.loaded)) if c.subdir}
    own = {"member", "lost+found"} | subdirs
    return [n for n in names if n not in own]


def take_snapshot(lab, path: Path) -> None:
    taken = gpuinfra("etcd", "snapshot", str(lab.inventory_path), "--out", str(path))
    assert taken.returncode == ExitCode.OK, taken.stderr


BROKEN_ETCDUTL = "#!/bin/sh\necho injected: etcdutl broken on this member >&2\nexit 1\n"


def stand_in(lab, host: str, command: str, script: str) -> None:
    """A failing stand-in for one command on one host, first on root's PATH (/usr/local/bin)."""
    path = f"/usr/local/bin/{command}"
    lab.ssh(host, f"cat > {path} <<'EOF'\n{script}EOF\nchmod 0755 {path}")


def test_restore_that_cannot_stage_on_one_member_changes_nothing(converged, tmp_path):
    """etcdutl fails on etcd-2 (a failing stand-in put first on its PATH, /usr/local/bin): the
    restore stops before any member is stopped, every member keeps its own data (the same
    database file, the key written after the snapshot still there), no staged copy is left and
    the cluster serves. Today's main stopped every member and wiped the others' data first."""
    lab = converged
    wait_healthy(lab)
    etcdctl(lab, "put restore/before-snapshot x")
    snapshot = tmp_path / "snap.db"
    take_snapshot(lab, snapshot)
    etcdctl(lab, "put restore/after-snapshot kept")
    inodes = {m: db_inode(lab, m) for m in MEMBERS}
    stand_in(lab, "etcd-2", "etcdutl", BROKEN_ETCDUTL)
    try:
        result = gpuinfra("etcd", "restore", str(lab.inventory_path), str(snapshot), "--yes")
    finally:
        lab.ssh("etcd-2", "rm -f /usr/local/bin/etcdutl")
    assert result.returncode == ExitCode.ERROR, result.stdout + result.stderr
    assert "etcd-2" in result.stderr and "injected" in result.stderr, result.stderr
    assert "nothing was stopped or changed" in result.stderr, result.stderr
    for member in MEMBERS:
        assert db_inode(lab, member) == inodes[member], member
        assert local_get(lab, member, "restore/after-snapshot") == "kept", member
        assert leftovers(lab, member) == [], member
    wait_healthy(lab)
    assert etcdctl(lab, "put restore/serves yes").stdout.strip() == "OK"
    assert etcdctl(lab, "get restore/serves --print-value-only").stdout.strip() == "yes"


# A runtime drop-in: merged into the unit from /etc/systemd/system (`systemctl mask --runtime`
# is not: /etc outranks /run for the unit file itself, so the mask was ignored).
DROP_IN_DIR = "/run/systemd/system/etcd.service.d"


def test_restore_rolls_back_when_a_member_does_not_start(converged, tmp_path):
    """Every member stages and swaps, but etcd-2 cannot start (a runtime drop-in whose
    ExecStartPre fails, put there for the test):
    the restored cluster never becomes healthy, so the restore puts every member's old data
    back and starts them. Once etcd-2 may start again, every member holds its old data (the
    key written after the snapshot), nothing is left over, and the cluster serves."""
    lab = converged
    wait_healthy(lab)
    original = lab.inventory_path.read_text()
    data = yaml.safe_load(original)
    data["group_vars"]["etcd"]["etcd"]["health_timeout_s"] = 20  # the failed start waits this
    lab.inventory_path.write_text(yaml.safe_dump(data, sort_keys=False))
    snapshot = tmp_path / "snap.db"
    try:
        take_snapshot(lab, snapshot)
        etcdctl(lab, "put rollback/after-snapshot kept")
        lab.ssh("etcd-2", f"mkdir -p {DROP_IN_DIR} && cat > {DROP_IN_DIR}/fail.conf <<'EOF'\n"
                "[Service]\nExecStartPre=/bin/false\nEOF\nsystemctl daemon-reload")  # fmt: skip
        started = time.monotonic()
        result = gpuinfra("etcd", "restore", str(lab.inventory_path), str(snapshot), "--yes")
        RESULTS["restore_rollback_seconds"] = round(time.monotonic() - started, 1)
    finally:
        lab.inventory_path.write_text(original)
        lab.ssh("etcd-2", f"rm -rf {DROP_IN_DIR}; systemctl daemon-reload; "
                "systemctl reset-failed etcd; systemctl start etcd", check=False)  # fmt: skip
    assert result.returncode == ExitCode.ERROR, result.stdout + result.stderr
    assert "did not become healthy" in result.stderr and "rolled back" in result.stderr
    assert "etcd-2" in result.stderr, result.stderr
    wait_healthy(lab)
    for member in MEMBERS:
        assert local_get(lab, member, "rollback/after-snapshot") == "kept", member
        assert leftovers(lab, member) == [], member
    assert etcdctl(lab, "put rollback/serves yes").stdout.strip() == "OK"


def test_a_full_restore_still_rebuilds_the_cluster(converged, tmp_path):
    """Positive control for the two tests above: the same restore without a fault replaces
    every member's data (the key written after the snapshot is gone) and leaves nothing."""
    lab = converged
    wait_healthy(lab)
    etcdctl(lab, "put full/before x")
    snapshot = tmp_path / "snap.db"
    take_snapshot(lab, snapshot)
    etcdctl(lab, "put full/after-snapshot gone")
    started = time.monotonic()
    result = gpuinfra("etcd", "restore", str(lab.inventory_path), str(snapshot), "--yes")
    RESULTS["restore_seconds"] = round(time.monotonic() - started, 1)
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    wait_healthy(lab)
    for member in MEMBERS:
        assert local_get(lab, member, "full/before") == "x", member
        assert local_get(lab, member, "full/after-snapshot") == "", member
        assert leftovers(lab, member) == [], member


def test_the_backup_snapshots_a_running_member_and_never_starts_a_stopped_one(converged):
    """The hourly backup (etcd-backup.service, what its timer starts) writes a snapshot while
    etcd runs (positive control). On a member whose etcd was stopped (as `etcd restore` and
    `etcd replace` stop it), the same start writes nothing and etcd stays stopped: with the
    unit's former Requires=etcd.service it started etcd again, and a backup that fired during a
    stop cancelled it (seen in CI: "could not stop etcd on etcd-1: Job for etcd.service
    canceled")."""
    lab = converged
    wait_healthy(lab)
    count = "ls /var/backups/etcd/etcd-*.db 2>/dev/null | wc -l"
    before = int(lab.ssh("etcd-1", count).stdout)
    lab.ssh("etcd-1", "systemctl start etcd-backup.service")
    assert int(lab.ssh("etcd-1", count).stdout) == before + 1
    try:
        lab.ssh("etcd-1", "systemctl stop etcd")
        lab.ssh("etcd-1", "systemctl start etcd-backup.service")
        state = lab.ssh("etcd-1", "systemctl is-active etcd", check=False).stdout.strip()
        assert state == "inactive"
        assert int(lab.ssh("etcd-1", count).stdout) == before + 1
        skipped = lab.ssh("etcd-1", "systemctl show -p ConditionResult --value etcd-backup")
        assert skipped.stdout.strip() == "no"
    finally:
        lab.ssh("etcd-1", "systemctl start etcd", check=False)
    wait_healthy(lab)


FAILING_STOP = """#!/bin/sh
if [ "$1" = stop ] && [ "$2" = etcd ]; then
    echo "injected: Failed to stop etcd.service" >&2
    exit 1
fi
exec /usr/bin/systemctl "$@"
"""


def test_replace_whose_stop_fails_touches_no_data(converged):
    """`systemctl stop etcd` fails on etcd-2 (a stand-in first on its PATH that refuses that one
    call): replace stops there, etcd-2 keeps its data and its membership. Today's main went on
    to delete the data directory after the failed stop."""
    lab = converged
    wait_healthy(lab)
    ids = {m["name"]: m["member_id"] for m in status(lab)[1]["members"]}
    inode = db_inode(lab, "etcd-2")
    stand_in(lab, "etcd-2", "systemctl", FAILING_STOP)
    try:
        result = gpuinfra("etcd", "replace", str(lab.inventory_path), "etcd-2", "--yes")
    finally:
        lab.ssh("etcd-2", "rm -f /usr/local/bin/systemctl")
    assert result.returncode == ExitCode.ERROR, result.stdout + result.stderr
    assert "could not stop etcd" in result.stderr and "injected" in result.stderr
    assert db_inode(lab, "etcd-2") == inode
    data = wait_healthy(lab)
    assert {m["name"]: m["member_id"] for m in data["members"]} == ids


def test_replace_joins_as_a_learner_then_deletes_the_old_data(converged):
    """The positive path: etcd-2 is replaced by a new member (new ID) that joined as a learner
    and was promoted; it holds the cluster's data and its old data directory is gone."""
    lab = converged
    wait_healthy(lab)
    etcdctl(lab, "put replace/before yes")
    old_ids = {m["name"]: m["member_id"] for m in status(lab)[1]["members"]}
    result = gpuinfra("etcd", "replace", str(lab.inventory_path), "etcd-2", "--yes", "--format",
                      "json")  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    replaced = json.loads(result.stdout)
    RESULTS["replace_seconds"] = round(replaced["seconds"], 1)
    assert replaced["old_id"] == old_ids["etcd-2"] and replaced["new_id"] != replaced["old_id"]
    data = wait_healthy(lab)
    ids = {m["name"]: m["member_id"] for m in data["members"]}
    assert ids["etcd-2"] == replaced["new_id"]
    assert {k: v for k, v in ids.items() if k != "etcd-2"} == {
        k: v for k, v in old_ids.items() if k != "etcd-2"
    }
    listed = lab.ssh("etcd-1", "set -a; . /etc/etcd/etcdctl.env; etcdctl "
                     "--endpoints=https://127.0.0.1:2379 member list -w json").stdout  # fmt: skip
    assert not any(m.get("isLearner") for m in json.loads(listed)["members"])
    assert local_get(lab, "etcd-2", "replace/before") == "yes"
    assert leftovers(lab, "etcd-2") == []


def shrink(lab, members: list[str]) -> None:
    """Compact the history and defragment the members named: the database back to its live
    keys, so a member that rejoins fetches a small snapshot."""
    eps = ",".join(f"https://{lab.address(m)}:2379" for m in members)
    revision = json.loads(etcdctl(lab, "get shrink -w json").stdout)["header"]["revision"]
    etcdctl(lab, f"compact {revision}", check=False)  # "already compacted" is fine
    lab.ssh("cp-1", f"{CLIENT_ENV} etcdctl --endpoints={eps} --command-timeout=60s defrag")


def test_one_member_with_a_full_data_disk(converged):
    """Fault suite: etcd-3's data disk (512 MiB) filled to the last block, then 80 MiB written
    through the cluster so every member needs new space. Writes go on (two of three members
    hold the quorum; a request caught on etcd-3 as it crashes is tried again) and `etcd
    status` names etcd-3 and why (exit 5, degraded). Before the fault, the same status reports
    etcd-3 healthy (positive control). Recovery, as documented: `etcd replace etcd-3
    --discard-old-data` (etcd's own repair leaves its disk full)."""
    lab = converged
    wait_healthy(lab)
    shrink(lab, MEMBERS)
    data = wait_healthy(lab)
    member = next(m for m in data["members"] if m["name"] == "etcd-3")
    assert member["state"] == "healthy" and member["data_dir_free_bytes"] > 64 * 2**20
    lab.ssh("etcd-3", "mountpoint -q /var/lib/etcd")  # its own disk, not the shared root
    try:
        fill = "dd if=/dev/zero of=/var/lib/etcd/filler bs=1M 2>/dev/null"
        free = "df -B1 --output=avail /var/lib/etcd | tail -n 1"
        lab.ssh("etcd-3", f'{fill}; test "$({free})" -lt 1048576')
        # A request caught on etcd-3 as it dies of ENOSPC fails; the client tries it again,
        # as the API server's etcd client does (etcdctl itself does not). Every write must
        # land within three tries.
        put = (
            f"{CLIENT_ENV} etcdctl --endpoints={endpoints(lab)} --command-timeout=10s "
            "put fault/big$i < /tmp/big >/dev/null 2>&1"
        )
        writes = lab.ssh(
            "cp-1",
            "head -c 1000000 /dev/zero | tr '\\0' x > /tmp/big; ok=0; retried=0; "
            f"for i in $(seq 1 80); do for try in 1 2 3; do if {put}; then ok=$((ok+1)); break; "
            "fi; retried=$((retried+1)); done; done; echo $ok $retried",
            timeout=900,
        )
        big_ok, retried = map(int, writes.stdout.split())
        after = etcdctl(lab, "put fault/after-full ok", check=False)
        code, data = status(lab)
        full = next(m for m in data["members"] if m["name"] == "etcd-3")
        RESULTS["disk_full"] = {
            "big_writes_ok": big_ok,
            "tries_repeated": retried,
            "write_after": after.returncode == 0,
            "status_exit": code,
            "health": data["health"],
            "etcd-3": {k: full[k] for k in ("state", "data_dir_free_bytes", "error")},
            "others": {m["name"]: m["state"] for m in data["members"] if m["name"] != "etcd-3"},
            "alarms": data["alarms"],
        }
        assert big_ok == 80 and after.returncode == 0, RESULTS["disk_full"]
        assert code == ExitCode.DEGRADED and data["health"] == "degraded", data
        assert full["state"] != "healthy" and "data disk full" in full["error"], full
        assert all(m["state"] == "healthy" for m in data["members"] if m["name"] != "etcd-3")
    finally:
        lab.ssh("etcd-3", "rm -f /var/lib/etcd/filler")
        etcdctl(lab, "del fault/ --prefix", check=False)
        shrink(lab, ["etcd-1", "etcd-2"])
    left = lab.ssh("etcd-3", "df -B1 --output=avail /var/lib/etcd | tail -n 1").stdout.strip()
    RESULTS["disk_full"]["free_after_filler_removed"] = int(left)
    started = time.monotonic()
    replaced = gpuinfra("etcd", "replace", str(lab.inventory_path), "etcd-3", "--discard-old-data",
                        "--yes")  # fmt: skip
    RESULTS["disk_full"]["replace_seconds"] = round(time.monotonic() - started, 1)
    assert replaced.returncode == ExitCode.OK, replaced.stdout + replaced.stderr
    wait_healthy(lab)
    assert local_get(lab, "etcd-3", "fault/after-full") == ""  # deleted above, and replicated
    assert etcdctl(lab, "put fault/recovered yes").stdout.strip() == "OK"
