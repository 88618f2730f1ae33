"""The etcd role on the lab's five etcd hosts: mutual TLS, failures, rolling changes, snapshot
and restore, member replacement, certificate rotation and the disk gate.

The lab is its own: five etcd hosts, each with a 1 GiB loop device as /dev/vdb (its data
disk, formatted and mounted by UUID by the role), and cp-1, the API server's stand-in that
holds the etcd client certificate and runs the writer. Its name is `<GPUINFRA_LAB_NAME>-etcd`
(GPUINFRA_ETCD_LAB_NAME overrides); its inventory stays at a fixed path so the PKI beside it
(`.state/`) survives a kept lab. Tests that stop members start them again and wait for a
healthy cluster before they end. The members run the etcd line the sample pins (this machine's
build, `Topology.etcd_build`); test_etcd_hardening.py runs Debian's 3.5 line, so the day-2
commands run on both lines gpuinfra supports.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from cli.exitcodes import ExitCode
from inventory.sizing import cluster_sizing
from lab import lifecycle
from lab.topology import HostSpec, Topology
from tests.helpers import GPUINFRA, gpuinfra
from tests.integration.conftest import KEEP_ENV, LAB_NAME, boot_lab
from tests.integration.etcd_helpers import CLIENT_ENV, endpoints, etcdctl, status, wait_healthy
from toolkit.spec import settings_of

pytestmark = pytest.mark.integration

ETCD_LAB = os.environ.get("GPUINFRA_ETCD_LAB_NAME", f"{LAB_NAME}-etcd")
MEMBERS = [f"etcd-{i}" for i in range(1, 6)]
SAMPLE = Path(__file__).resolve().parents[2] / "inventory/sample/cluster.yml"
RESULTS: dict[str, object] = {}  # measured figures, printed at the end of the module


def etcd_topology() -> Topology:
    hosts = tuple(HostSpec(name, ("etcd",), disk_bytes=2**30) for name in MEMBERS)
    return Topology(hosts + (HostSpec("cp-1", ("control_plane",)),), "etcd", etcd_build=True)


@pytest.fixture(scope="module")
def lab():
    inventory = Path(f"/tmp/gpuinfra-itest-{ETCD_LAB}/cluster.yml")
    cluster = boot_lab(ETCD_LAB, etcd_topology(), inventory)
    yield cluster
    print("\netcd figures:", json.dumps(RESULTS, indent=2))
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(ETCD_LAB)


def bootstrapped(lab) -> bool:
    return lab.ssh("etcd-1", "test -d /var/lib/etcd/member", check=False).returncode == 0


def test_disk_gate_failure_stops_the_etcd_phase(lab, tmp_path):
    """One new member's disk fails the gate (limit 0.001 ms, no override): every member stops
    before etcd is installed, each report naming the failing host and its p99."""
    if bootstrapped(lab):
        pytest.skip("the kept lab's members already hold data: the gate runs on new members only")
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["hosts"]["etcd-5"]["vars"] = {
        "etcd": {"fsync_p99_max_ms": 0.001, "disk_gate_override": False}
    }
    strict = tmp_path / "cluster.yml"
    strict.write_text(yaml.safe_dump(data, sort_keys=False))
    report_path = tmp_path / "report.json"
    result = gpuinfra(
        "apply", str(strict), "--roles", "base,etcd", "--yes", "--report", str(report_path)
    )
    assert result.returncode == ExitCode.ERROR, result.stdout[-2000:]
    report = json.loads(report_path.read_text())
    for member in MEMBERS:
        host = report["hosts"][member]
        assert host["status"] == "failed"
        assert "etcd-5" in host["error"] and "fsync p99" in host["error"], host["error"]
    gate = next(c for c in report["hosts"]["etcd-5"]["checks"] if c["check"] == "etcd disk gate")
    assert gate["status"] == "fail" and gate["p99_ms"] > 0.001
    for member in MEMBERS:
        assert lab.ssh(member, "dpkg -s etcd-server", check=False).returncode != 0


@pytest.fixture(scope="module")
def converged(lab, tmp_path_factory):
    report_path = tmp_path_factory.mktemp("etcd") / "apply.json"
    started = time.monotonic()
    result = gpuinfra(
        "apply", str(lab.inventory_path), "--roles", "base,etcd", "--yes", "--report",
        str(report_path),
    )  # fmt: skip
    RESULTS["apply_seconds"] = round(time.monotonic() - started, 1)
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr[-2000:]
    lab.ssh("cp-1", "DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-client >/dev/null")
    return json.loads(report_path.read_text())


def test_disk_gate_result_per_node_is_in_the_run_report(lab, converged):
    gates = {
        name: next((c for c in host["checks"] if c["check"] == "etcd disk gate"), None)
        for name, host in converged["hosts"].items()
        if name in MEMBERS
    }
    if all(g is None for g in gates.values()):
        pytest.skip("members were bootstrapped by an earlier session: the gate did not run")
    RESULTS["gate_p99_ms"] = {n: round(g["p99_ms"], 3) for n, g in gates.items()}
    for name, gate in gates.items():
        assert gate["p99_ms"] > 0 and gate["limit_ms"] == 10.0, name
        # The lab's loop disks share the machine's disk; its inventory sets the override.
        assert gate["status"] in ("pass", "override"), gate
        if gate["status"] == "override":
            assert "disk_gate_override" in gate["detail"]


def test_plan_after_apply_has_no_changes(lab, converged):
    result = gpuinfra("plan", str(lab.inventory_path), "--roles", "base,etcd", "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    report = json.loads(result.stdout)
    pending = {
        n: [o["name"] for o in h["operations"] if o["changed"]] for n, h in report["hosts"].items()
    }
    assert all(not ops for ops in pending.values()), pending


def test_five_members_healthy_over_mutual_tls(lab, converged):
    data = wait_healthy(lab)
    assert data["healthy_members"] == 5 and data["leader"] in MEMBERS
    assert {m["name"] for m in data["members"]} == set(MEMBERS)
    # The quota the inventory derives from its node count (inventory/sizing.py): 2 GiB here.
    assert data["quota_bytes"] == cluster_sizing(lab.loaded.cluster).etcd_quota_backend_bytes
    assert data["alarms"] == []
    assert all(m["wal_fsync_p99_ms"] is not None for m in data["members"])
    assert etcdctl(lab, "put mtls/probe yes").stdout.strip() == "OK"


def test_the_members_run_the_etcd_line_the_sample_pins(lab, converged):
    """What every test below runs on: the sample's etcd, as each member reports it itself
    (test_etcd_hardening.py holds its lab to Debian's line, the other one)."""
    sample = yaml.safe_load(SAMPLE.read_text())
    data = wait_healthy(lab)
    assert {m["version"] for m in data["members"]} == {sample["versions"]["etcd"]}


def test_a_client_without_a_certificate_is_refused(lab, converged):
    url = f"https://{lab.address('etcd-1')}:2379/health"
    ca = "--cacert /etc/kubernetes/pki/etcd/ca.crt"
    without = lab.ssh("cp-1", f"curl -sS --max-time 5 {ca} {url}", check=False)
    assert without.returncode != 0, without.stdout
    plain = lab.ssh("cp-1", f"curl -sS --max-time 5 http://{lab.address('etcd-1')}:2379/health",
                    check=False)  # fmt: skip
    assert plain.returncode != 0 or "health" not in plain.stdout
    cert = (
        "--cert /etc/kubernetes/pki/apiserver-etcd-client.crt "
        "--key /etc/kubernetes/pki/apiserver-etcd-client.key"
    )
    with_cert = lab.ssh("cp-1", f"curl -sS --max-time 5 {ca} {cert} {url}")
    assert '"health":"true"' in with_cert.stdout


def test_data_dir_is_the_disk_mounted_by_uuid_noatime_0700(lab, converged):
    for member in MEMBERS:
        mount = lab.ssh(member, "findmnt -rn -o SOURCE,OPTIONS --mountpoint /var/lib/etcd").stdout
        source, options = mount.split()
        assert source == "/dev/vdb" and "noatime" in options.split(","), mount
        uuid = lab.ssh(member, "blkid -s UUID -o value /dev/vdb").stdout.strip()
        fstab = lab.ssh(member, "cat /etc/fstab").stdout
        assert f"UUID={uuid} /var/lib/etcd ext4 noatime,nofail 0 2" in fstab
        assert lab.ssh(member, "stat -c '%a %U' /var/lib/etcd").stdout.split() == ["700", "etcd"]


def lab_cmd(lab, action: str, host: str) -> None:
    done = subprocess.run([GPUINFRA, "lab", action, host, "--name", lab.name],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_losing_members_one_two_then_quorum(lab, converged):
    wait_healthy(lab)
    stopped: list[str] = []
    seen: dict[int, tuple[int, str, bool]] = {}
    try:
        for victim in ("etcd-5", "etcd-4", "etcd-3"):
            lab_cmd(lab, "stop", victim)
            stopped.append(victim)
            write = etcdctl(lab, f"put quorum/{len(stopped)} x", check=False, timeout=60)
            code, data = status(lab)
            states = {m["name"]: m["state"] for m in data["members"]}
            seen[len(stopped)] = (code, data["health"], write.returncode == 0)
            assert all(states[s] in ("unreachable", "down") for s in stopped), states
        assert seen[1] == (ExitCode.DEGRADED, "degraded", True), seen
        assert seen[2] == (ExitCode.DEGRADED, "degraded", True), seen
        assert seen[3] == (ExitCode.UNHEALTHY, "lost", False), seen
    finally:
        for victim in stopped:
            lab_cmd(lab, "start", victim)
    started = time.monotonic()
    wait_healthy(lab)
    RESULTS["recovery_after_restart_seconds"] = round(time.monotonic() - started, 1)
    assert etcdctl(lab, "get quorum/2 --print-value-only").stdout.strip() == "x"


# A client as a real one behaves (the API server retries): each write is one etcdctl call, and a
# failed call is retried once after a second. "retry" lines say what the first attempt got;
# "fail" means the cluster refused the same write twice, a second apart.
WRITER = """\
put() {{ {env} etcdctl --endpoints={eps} --command-timeout=5s put roll/$1 $1 >/dev/null; }}
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


def rolling_apply(lab, snapshot_count: int) -> tuple[subprocess.CompletedProcess, dict]:
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["group_vars"]["etcd"]["etcd"]["snapshot_count"] = snapshot_count
    lab.inventory_path.write_text(yaml.safe_dump(data, sort_keys=False))
    script = WRITER.format(env=CLIENT_ENV, eps=endpoints(lab))
    lab.ssh("cp-1", f"rm -f /tmp/writer.stop; cat > /tmp/writer.sh <<'EOF'\n{script}EOF")
    lab.ssh("cp-1", "nohup sh /tmp/writer.sh > /tmp/writer.log 2>&1 &")
    time.sleep(3)
    started = time.monotonic()
    result = gpuinfra("apply", str(lab.inventory_path), "--roles", "etcd", "--yes", "--format",
                      "json")  # fmt: skip
    seconds = time.monotonic() - started
    time.sleep(3)
    lab.ssh("cp-1", "touch /tmp/writer.stop; sleep 12")
    log = lab.ssh("cp-1", "cat /tmp/writer.log").stdout.splitlines()
    counts = {
        "writes_ok": sum(1 for line in log if line == "ok"),
        "writes_retried": sum(1 for line in log if line.startswith("retry")),
        "writes_failed": sum(1 for line in log if line.startswith("fail")),
        "apply_seconds": round(seconds, 1),
        "first_attempt_errors": [line for line in log if line.startswith("retry")][:5],
    }
    return result, counts


def restart_journal(lab, since: int) -> dict[str, list[tuple[int, str]]]:
    """Each member's gpuinfra-etcd journal lines since a time: (microseconds since the epoch,
    message). The hosts share this machine's clock, so the times compare across members."""
    lines: dict[str, list[tuple[int, str]]] = {}
    for member in MEMBERS:
        out = lab.ssh(member, f"journalctl -t gpuinfra-etcd --since @{since} -o json").stdout
        entries = [json.loads(line) for line in out.splitlines() if line.strip()]
        lines[member] = [(int(e["__REALTIME_TIMESTAMP"]), e["MESSAGE"]) for e in entries]
    return lines


def test_a_config_change_rolls_through_members_while_a_writer_writes(lab, converged):
    wait_healthy(lab)
    original = yaml.safe_load(lab.inventory_path.read_text())
    since = int(time.time()) - 1
    try:
        result, counts = rolling_apply(lab, 20000)
        RESULTS["rolling_change"] = counts
        assert result.returncode == ExitCode.OK, result.stdout[-3000:]
        report = json.loads(result.stdout)
        restart = "Etcd | Restart etcd, one member at a time, each waiting for a healthy cluster"
        for member in MEMBERS:
            changed = {o["name"] for o in report["hosts"][member]["operations"] if o["changed"]}
            assert restart in changed, changed
        assert "--snapshot-count=20000" in lab.ssh("etcd-1", "ps -o args= -C etcd").stdout
        # One member at a time, from the restart script's own journal lines: every member's
        # restart began after the previous member's restart ended with a healthy cluster.
        # With the Events cluster on the same hosts, each host has a member of each (its own
        # id in the lines), and the Events cluster rolls after the main one.
        journal = restart_journal(lab, since)
        clusters = 2 if settings_of(lab.loaded, MEMBERS[0], "etcd").events.enabled else 1
        spans = []
        for member, lines in journal.items():
            ids = {m.split(":")[0] for _, m in lines if m.endswith("restart begins")}
            assert len(ids) == clusters, (member, lines)
            for ident in ids:
                mine = [(t, m) for t, m in lines if m.startswith(f"{ident}:")]
                begins = [t for t, m in mine if m.endswith("restart begins")]
                done = "restart done, member and cluster healthy"
                dones = [t for t, m in mine if m.endswith(done)]
                assert len(begins) == 1 and len(dones) == 1, (member, lines)
                spans.append((begins[0], dones[0], f"{member} {ident}"))
        spans.sort()
        for (_, done, before), (begin, _, after) in zip(spans, spans[1:], strict=False):
            assert begin > done, f"{after} began restarting before {before} was healthy: {spans}"
        # The leader at the start handed leadership on before it restarted.
        moves = [m for lines in journal.values() for _, m in lines if "leadership" in m]
        RESULTS["leadership_moves"] = moves
        assert any("leadership moved to" in m for m in moves), journal
        assert counts["writes_ok"] > 20
        # No write lost: restarting members together instead loses quorum for seconds, and the
        # retry a second later fails too.
        assert counts["writes_failed"] == 0, counts
    finally:
        lab.ssh("cp-1", "touch /tmp/writer.stop", check=False)
        lab.inventory_path.write_text(yaml.safe_dump(original, sort_keys=False))
        restored = gpuinfra("apply", str(lab.inventory_path), "--roles", "etcd", "--yes")
        assert restored.returncode == ExitCode.OK, restored.stdout[-2000:]


def test_snapshot_wipe_restore_brings_every_key_back(lab, converged, tmp_path):
    wait_healthy(lab)
    lab.ssh(
        "cp-1",
        f"for i in $(seq 1 200); do {CLIENT_ENV} etcdctl --endpoints={endpoints(lab)} "
        "put snap/key$i value$i >/dev/null || exit 1; done",
        timeout=300,
    )
    snapshot = tmp_path / "snap.db"
    taken = gpuinfra("etcd", "snapshot", str(lab.inventory_path), "--out", str(snapshot),
                     "--format", "json")  # fmt: skip
    assert taken.returncode == ExitCode.OK, taken.stderr
    info = json.loads(taken.stdout)
    assert info["size"] > 0 and oct(snapshot.stat().st_mode & 0o777) == "0o600"
    etcdctl(lab, "put after/snapshot x")
    # The disaster: every member's data is gone.
    for member in MEMBERS:
        lab.ssh(member, "systemctl stop etcd && rm -rf /var/lib/etcd/member")
    started = time.monotonic()
    restored = gpuinfra("etcd", "restore", str(lab.inventory_path), str(snapshot), "--yes",
                        "--format", "json")  # fmt: skip
    RESULTS["restore_seconds"] = round(time.monotonic() - started, 1)
    assert restored.returncode == ExitCode.OK, restored.stdout + restored.stderr
    values = etcdctl(lab, "get snap/ --prefix --print-value-only").stdout.split()
    assert sorted(values) == sorted(f"value{i}" for i in range(1, 201))
    assert etcdctl(lab, "get after/snapshot --print-value-only").stdout.strip() == ""
    wait_healthy(lab)


EVENTS_LOCAL = "set -a; . /etc/etcd/etcdctl-events.env; etcdctl --endpoints=https://127.0.0.1:2383"


def test_replace_a_failed_member(lab, converged):
    """A host whose members lost their data: its main member replaced, then (etcd.events, as
    the sample runs) its Events member, each caught up with what its cluster held before."""
    events = settings_of(lab.loaded, "etcd-3", "etcd").events.enabled
    wait_healthy(lab)
    etcdctl(lab, "put replace/before yes")
    wipe = "systemctl stop etcd && rm -rf /var/lib/etcd/member"
    if events:
        lab.ssh("etcd-1", f"{EVENTS_LOCAL} put replace/events yes")
        wipe = (
            "systemctl stop etcd-events etcd && "
            "rm -rf /var/lib/etcd/member /var/lib/etcd/events/member"
        )
    lab.ssh("etcd-3", wipe)
    result = gpuinfra("etcd", "replace", str(lab.inventory_path), "etcd-3", "--yes", "--format",
                      "json")  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    replaced = json.loads(result.stdout)
    RESULTS["replace_seconds"] = round(replaced["seconds"], 1)
    assert replaced["old_id"] and replaced["new_id"] and replaced["old_id"] != replaced["new_id"]
    data = wait_healthy(lab)
    assert data["healthy_members"] == 5
    local = lab.ssh(
        "etcd-3",
        "set -a; . /etc/etcd/etcdctl.env; etcdctl --endpoints=https://127.0.0.1:2379 "
        "get replace/before --print-value-only --consistency=s",
    )
    assert local.stdout.strip() == "yes"
    if not events:
        return
    # Negative control: the main replace left the Events member down, its data gone.
    down = gpuinfra("etcd", "status", str(lab.inventory_path), "--events", "--format", "json")
    assert json.loads(down.stdout)["healthy_members"] == 4, down.stdout
    result = gpuinfra("etcd", "replace", str(lab.inventory_path), "etcd-3", "--events", "--yes",
                      "--format", "json")  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    replaced = json.loads(result.stdout)
    RESULTS["replace_events_seconds"] = round(replaced["seconds"], 1)
    assert replaced["old_id"] and replaced["new_id"] and replaced["old_id"] != replaced["new_id"]
    up = gpuinfra("etcd", "status", str(lab.inventory_path), "--events", "--format", "json")
    assert up.returncode == ExitCode.OK and json.loads(up.stdout)["healthy_members"] == 5, up.stdout
    local = lab.ssh(
        "etcd-3", f"{EVENTS_LOCAL} get replace/events --print-value-only --consistency=s"
    )
    assert local.stdout.strip() == "yes"
    assert wait_healthy(lab)["healthy_members"] == 5  # the main cluster untouched by it


SERVED_SERIAL = (
    'python3 -c "import socket, ssl; c = ssl.create_default_context('
    "cafile='/etc/kubernetes/pki/etcd/ca.crt'); c.check_hostname = False; "
    "c.load_cert_chain('/etc/kubernetes/pki/apiserver-etcd-client.crt', "
    "'/etc/kubernetes/pki/apiserver-etcd-client.key'); "
    "s = c.wrap_socket(socket.create_connection(('{address}', 2379), 5)); "
    "print(s.getpeercert()['serialNumber'])\""
)


def served_serial(lab, member: str) -> str:
    """The serial of the certificate a member serves, read over TLS from cp-1."""
    return lab.ssh("cp-1", SERVED_SERIAL.format(address=lab.address(member))).stdout.strip()


def test_rotate_certs_one_member_at_a_time(lab, converged):
    wait_healthy(lab)
    before = {m: served_serial(lab, m) for m in MEMBERS}
    result = gpuinfra("etcd", "rotate-certs", str(lab.inventory_path), "--yes", "--format", "json")
    assert result.returncode == ExitCode.OK, result.stdout[-3000:] + result.stderr
    rotated = json.loads(result.stdout)
    RESULTS["rotate_seconds"] = round(rotated["seconds"], 1)
    old = {e["name"]: e["serial"] for e in rotated["before"]}
    new = {e["name"]: e["serial"] for e in rotated["after"]}
    assert old["ca"] == new["ca"]
    assert all(new[name] != old[name] for name in new if name != "ca")
    for member in MEMBERS:
        served = served_serial(lab, member)
        assert served and served != before[member], member
        assert int(served, 16) == int(new[f"{member}/server"], 16), member
    assert rotated["health"] == "healthy"
    assert etcdctl(lab, "put rotate/after yes").stdout.strip() == "OK"


def test_check_disk_reports_p99_per_member_and_fails_past_the_limit(lab, converged):
    result = gpuinfra("etcd", "check-disk", str(lab.inventory_path), "--format", "json")
    results = json.loads(result.stdout)
    assert {r["host"] for r in results} == set(MEMBERS)
    assert all(r["p99_ms"] and r["p99_ms"] > 0 for r in results)
    RESULTS["check_disk_p99_ms"] = {r["host"]: round(r["p99_ms"], 3) for r in results}
    expected = ExitCode.OK if all(r["status"] == "pass" for r in results) else ExitCode.UNHEALTHY
    assert result.returncode == expected
    strict = gpuinfra("etcd", "check-disk", str(lab.inventory_path), "--max-ms", "0.001",
                      "--format", "json")  # fmt: skip
    assert strict.returncode == ExitCode.UNHEALTHY
    assert {r["status"] for r in json.loads(strict.stdout)} == {"fail"}
