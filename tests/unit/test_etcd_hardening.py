"""etcd hardening without hosts (issue 13): certificate renewal and CA rotation in the PKI,
the restore's staging/swap/rollback steps run as shell in a temporary data directory, the order
of restore and replace against a recording stand-in for the members, and what `status` says
about a full data disk."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from pydantic import ValidationError
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from day2 import etcd as day2
from day2.etcd import certs, common, replace_commands, restore_commands, restore_flow
from day2.etcd.replace_commands import (
    join_command,
    put_back_command,
    set_aside_command,
    stop_member_command,
)
from day2.etcd.restore_commands import (
    RestorePaths,
    finish_restore_command,
    rollback_restore_command,
    swap_restore_command,
)
from engine.context import host_context
from roles.etcd import pki
from roles.etcd.clusters import EtcdCluster
from roles.etcd.config import EtcdConfig
from roles.etcd.files import PKI, client_files, managed_files
from toolkit.remote import RemoteResult


def cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def bundle(pem: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem.encode())


# ---------------------------------------------------------------- renewal


def test_a_leaf_inside_the_renewal_threshold_is_renewed_and_one_outside_is_kept(loaded):
    first = pki.ensure_pki(loaded, cert_days=365)
    # Positive control: nothing is renewed while every leaf has a year left.
    assert pki.ensure_pki(loaded, renew_days=30) == first
    in_340_days = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    renewed = pki.ensure_pki(loaded, renew_days=30, now=in_340_days)
    leaves = [stem for stem in first if stem != "ca"]
    assert all(renewed[stem] != first[stem] for stem in leaves)
    assert renewed["ca"] == first["ca"]
    new = cert(renewed["etcd-1/server"].cert_pem)
    assert (new.not_valid_after_utc - dt.datetime.now(dt.UTC)).days >= 363


def test_only_the_expiring_certificate_is_renewed(loaded):
    first = pki.ensure_pki(loaded)
    root = pki.pki_dir(loaded)
    spec = pki.member_specs(loaded, "etcd-2")[0]
    ca_cert = cert(first["ca"].cert_pem)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_key = serialization.load_pem_private_key(first["ca"].key_pem.encode(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    pki._write_pair(root, spec.stem, pki._leaf_certificate(spec, key, ca_cert, ca_key, 10), key)
    again = pki.ensure_pki(loaded)
    changed = {stem for stem in first if again[stem] != first[stem]}
    assert changed == {"etcd-2/server"}


def test_renewal_threshold_must_be_shorter_than_the_lifetime():
    assert EtcdConfig().cert_renew_days == 30
    with pytest.raises(ValidationError, match="cert_days must be greater than cert_renew_days"):
        EtcdConfig(cert_days=30, cert_renew_days=30)


# ---------------------------------------------------------------- CA rotation


def signed_by(pem: str, ca: x509.Certificate) -> bool:
    try:
        cert(pem).verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


def test_ca_rotation_trusts_both_then_reissues_then_drops_the_old(loaded):
    first = pki.ensure_pki(loaded)
    old_ca = cert(first["ca"].cert_pem)
    assert pki.ca_rotation_stage(loaded) == "none"
    assert bundle(pki.trusted_cas(loaded)) == [old_ca]

    new_ca = pki.begin_ca_rotation(loaded)
    assert pki.ca_rotation_stage(loaded) == "trusting"
    assert new_ca.subject != old_ca.subject
    assert bundle(pki.trusted_cas(loaded)) == [old_ca, new_ca]
    trusting = pki.ensure_pki(loaded)
    assert trusting == first  # the old CA still signs: no leaf changes in step 1
    assert pki.begin_ca_rotation(loaded) == new_ca  # run again: the same next CA

    pki.promote_next_ca(loaded)
    assert pki.ca_rotation_stage(loaded) == "reissued"
    assert bundle(pki.trusted_cas(loaded)) == [new_ca, old_ca]
    reissued = pki.ensure_pki(loaded)
    assert cert(reissued["ca"].cert_pem) == new_ca
    for stem in reissued:
        if stem != "ca":
            assert signed_by(reissued[stem].cert_pem, new_ca), stem
            assert not signed_by(reissued[stem].cert_pem, old_ca), stem
    with pytest.raises(pki.PkiError, match="not finished"):
        pki.begin_ca_rotation(loaded)

    pki.drop_previous_ca(loaded)
    assert pki.ca_rotation_stage(loaded) == "none"
    assert bundle(pki.trusted_cas(loaded)) == [new_ca]
    assert pki.ensure_pki(loaded) == reissued


def test_members_and_clients_are_given_the_trust_bundle(loaded):
    pki.ensure_pki(loaded)
    pki.begin_ca_rotation(loaded)
    member = {f.path: f.content for f in managed_files(host_context(loaded, "etcd-1"))}
    client = {f.path: f.content for f in client_files(host_context(loaded, "cp-1"))}
    assert len(bundle(member[f"{PKI}/ca.crt"])) == 2
    assert len(bundle(client["/etc/kubernetes/pki/etcd/ca.crt"])) == 2


def test_promote_and_drop_refuse_the_wrong_order(loaded):
    pki.ensure_pki(loaded)
    with pytest.raises(pki.PkiError, match="begin the rotation first"):
        pki.promote_next_ca(loaded)
    pki.begin_ca_rotation(loaded)
    with pytest.raises(pki.PkiError, match="promote it before"):
        pki.drop_previous_ca(loaded)


def test_rotate_ca_resumes_from_the_stage_it_stopped_at(monkeypatch, loaded):
    pki.ensure_pki(loaded)
    pki.begin_ca_rotation(loaded)
    pki.promote_next_ca(loaded)  # a run that stopped after step 2
    ran: list[str] = []

    def roll_out(loaded, step):
        ran.append(step)
        return day2.CaRotationStep(step, {"etcd-1": "changed"}, {}, "healthy", 0.0)

    monkeypatch.setattr(certs, "_roll_out", roll_out)
    result = day2.rotate_ca(loaded)
    assert ran == ["drop-old"] and pki.ca_rotation_stage(loaded) == "none"
    assert result.old_ca_serial != result.new_ca_serial


def test_rotate_ca_stops_at_a_step_that_left_the_cluster_unhealthy(monkeypatch, loaded):
    pki.ensure_pki(loaded)
    monkeypatch.setattr(
        certs,
        "_roll_out",
        lambda loaded, step: day2.CaRotationStep(
            step, {}, {"etcd-2": "restart failed"}, "degraded", 0
        ),
    )
    with pytest.raises(day2.EtcdOperationError, match="stopped after step trust-new"):
        day2.rotate_ca(loaded)
    assert pki.ca_rotation_stage(loaded) == "trusting"  # the next run resumes at reissue


def test_rotate_ca_command_is_documented_in_help():
    result = CliRunner().invoke(app, ["etcd", "rotate-ca", "--help"])
    assert result.exit_code == 0 and "three rolled-out steps" in result.output


# ---------------------------------------------------------------- restore steps, for real


@pytest.fixture
def member_dir(tmp_path, monkeypatch) -> tuple[Path, RestorePaths]:
    """A data directory holding a member, systemctl answering "inactive" (etcd stopped) and an
    install(1) stand-in (stand-ins: there is no systemd or etcd user on this machine)."""
    data = tmp_path / "etcd"
    (data / "member" / "snap").mkdir(parents=True)
    (data / "member" / "snap" / "db").write_text("old")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\nexit 3\n")
    (bin_dir / "systemctl").chmod(0o755)
    # install(1) -o etcd needs an etcd user this machine does not have: make the folder only.
    (bin_dir / "install").write_text('#!/bin/sh\nfor a; do last=$a; done\nmkdir -p "$last"\n')
    (bin_dir / "install").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    # The swap and the join write it: restore's constant, replace's from the cluster.
    monkeypatch.setattr(restore_commands, "INITIAL_STATE_ENV", str(tmp_path / "initial.env"))
    monkeypatch.setattr(
        EtcdCluster, "initial_state_env", property(lambda etcd: str(tmp_path / "initial.env"))
    )
    return data, RestorePaths(str(data), "STAMP")


def sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def stage_by_hand(paths: RestorePaths, content: str = "restored") -> None:
    staged = Path(paths.staging) / "member" / "snap"
    staged.mkdir(parents=True)
    (staged / "db").write_text(content)


def db(data: Path) -> str:
    return (data / "member" / "snap" / "db").read_text()


def test_swap_keeps_the_old_data_and_rollback_puts_it_back(member_dir):
    data, paths = member_dir
    stage_by_hand(paths)
    assert sh(swap_restore_command(paths)).returncode == 0
    assert db(data) == "restored"
    assert (Path(paths.kept) / "snap" / "db").read_text() == "old"
    assert sh(rollback_restore_command(paths)).returncode == 0
    assert db(data) == "old"
    assert sorted(p.name for p in data.iterdir()) == ["member"]
    # Again: nothing more happens.
    assert sh(rollback_restore_command(paths)).returncode == 0 and db(data) == "old"


def test_rollback_leaves_a_member_that_was_never_swapped_alone(member_dir):
    data, paths = member_dir
    stage_by_hand(paths)  # staged, but the swap never ran here
    assert sh(rollback_restore_command(paths)).returncode == 0
    assert db(data) == "old"
    assert sorted(p.name for p in data.iterdir()) == ["member"]


def test_finish_deletes_the_kept_data_only_then(member_dir):
    data, paths = member_dir
    stage_by_hand(paths)
    sh(swap_restore_command(paths))
    assert Path(paths.kept).exists()
    assert sh(finish_restore_command(paths)).returncode == 0
    assert sorted(p.name for p in data.iterdir()) == ["member"] and db(data) == "restored"


def test_swap_refuses_while_etcd_runs(member_dir, tmp_path):
    data, paths = member_dir
    (tmp_path / "bin" / "systemctl").write_text("#!/bin/sh\nexit 0\n")  # "active"
    stage_by_hand(paths)
    swapped = sh(swap_restore_command(paths))
    assert swapped.returncode != 0 and "still running" in swapped.stderr
    assert db(data) == "old"
    assert sh(set_aside_command(str(data), paths.kept)).returncode != 0
    assert db(data) == "old"


# ---------------------------------------------------------------- order, recorded


# fio's JSON as the disk gate reads it: a 1 ms fdatasync p99 (passes the 10 ms limit).
FIO = {"jobs": [{"sync": {"lat_ns": {"percentile": {"99.000000": 1_000_000}}}}]}


def remote(ok: bool, stdout: str, stderr: str) -> RemoteResult:
    """A member's answer: exit 0 or 1, with what it printed."""
    return RemoteResult("", 0 if ok else 1, stdout, stderr)


class Members:
    """A stand-in for the members over SSH: records every command, fails the ones asked."""

    def __init__(self, fail: dict[str, str] | None = None, api_server: str = ""):
        self.commands: list[tuple[str, str]] = []
        self.fail = fail or {}
        self.api_server = api_server  # what the control plane says of kube-apiserver

    def __call__(self, loaded, host, command, **kwargs) -> RemoteResult:
        self.commands.append((host, command))
        for needle, where in self.fail.items():
            if needle in command and where in (host, "*"):
                return remote(False, "", f"injected: {needle}")
        if "member list" in command:
            members = [{"ID": 17, "name": "etcd-2", "peerURLs": ["https://10.0.0.12:2380"]}]
            return remote(True, json.dumps({"members": members}), "")
        if "member add" in command:
            return remote(True, json.dumps({"member": {"ID": 18, "isLearner": True}}), "")
        if "fio" in command:
            return remote(True, json.dumps(FIO), "")
        if command == restore_flow.API_SERVER_STATE:
            return remote(True, self.api_server + "checked\n", "")
        return remote(True, "", "")

    def first(self, needle: str) -> int:
        return next(i for i, (_, c) in enumerate(self.commands) if needle in c)

    def sent(self, needle: str) -> bool:
        return any(needle in c for _, c in self.commands)


@pytest.fixture
def snapshot_file(tmp_path) -> Path:
    path = tmp_path / "snap.db"
    path.write_bytes(b"snapshot")
    return path


def test_restore_stages_everywhere_before_stopping_anything(monkeypatch, loaded, snapshot_file):
    members = Members(fail={"etcdutl snapshot restore": "etcd-2"})
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdOperationError, match="nothing was stopped or changed"):
        day2.restore(loaded, snapshot_file, stamp="S")
    assert not members.sent("systemctl stop") and not members.sent("mv ")
    cleaned = {h for h, c in members.commands if "rm -rf /var/lib/etcd/restore-S" in c}
    assert cleaned == {"etcd-1", "etcd-2", "etcd-3"}


def test_restore_rolls_back_every_member_when_one_does_not_start(
    monkeypatch, loaded, snapshot_file
):
    members = Members(fail={"etcd-wait-healthy": "etcd-3"})
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdOperationError, match="rolled back"):
        day2.restore(loaded, snapshot_file, stamp="S")
    rolled = {h for h, c in members.commands if "member.before-restore-S" in c and "mv " in c}
    assert {"etcd-1", "etcd-2", "etcd-3"} <= rolled
    assert members.first("systemctl stop") > max(
        i for i, (_, c) in enumerate(members.commands) if "etcdutl snapshot restore" in c
    )
    # The kept data is never deleted on a failed restore.
    assert not members.sent("rm -rf /var/lib/etcd/member.before-restore-S")


def test_replace_whose_stop_fails_sends_nothing_that_touches_data(monkeypatch, loaded):
    members = Members(fail={"systemctl stop etcd": "etcd-2"})
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdOperationError, match="could not stop etcd.*nothing was changed"):
        day2.replace(loaded, "etcd-2", stamp="S")
    later = members.commands[members.first("systemctl stop etcd") + 1 :]
    assert later == []


def test_replace_removes_then_adds_a_learner_and_promotes_it_before_deleting(monkeypatch, loaded):
    members = Members()
    monkeypatch.setattr(common, "run_remote", members)
    result = day2.replace(loaded, "etcd-2", stamp="S")
    assert (result.old_id, result.new_id) == ("11", "12")
    order = [
        "systemctl stop etcd",
        "member.before-replace-S",
        "fio",
        "member remove 11",
        "member add etcd-2 --learner",
        "systemctl start etcd",
        "member promote 12",
        "etcd-wait-healthy",
        "rm -rf /var/lib/etcd/member.before-replace-S",
    ]
    positions = [members.first(step) for step in order]
    assert positions == sorted(positions)


def test_replace_puts_the_data_back_when_the_disk_gate_fails(monkeypatch, loaded):
    members = Members(fail={"fio": "etcd-2"})
    monkeypatch.setattr(common, "run_remote", members)
    with pytest.raises(day2.EtcdOperationError, match="back in place"):
        day2.replace(loaded, "etcd-2", stamp="S")
    assert not members.sent("member remove") and not members.sent("rm -rf")


# ---------------------------------------------------------------- status of a full disk


def member_answer(member_id: int, healthy: bool, disk: str, journal: str = "") -> RemoteResult:
    body = {"header": {"member_id": member_id}, "leader": 1, "dbSize": 1, "dbSizeInUse": 1}
    status = [{"Endpoint": "https://127.0.0.1:2379", "Status": body}]
    health = [{"endpoint": "https://127.0.0.1:2379", "health": healthy}]
    return remote(
        True,
        f"== status\n{json.dumps(status)}\n== health\n{json.dumps(health)}\n== metrics\n"
        f"== disk\n{disk}\n== journal\n{journal}\n== end\n",
        "",
    )


def test_status_names_the_member_whose_data_disk_is_full(monkeypatch, loaded):
    answers = {
        "etcd-1": member_answer(1, True, "536870912 400000000"),
        "etcd-2": member_answer(2, True, "536870912 400000000"),
        "etcd-3": member_answer(3, True, "536870912 4096"),
    }

    def run_on(loaded, host, command, **kwargs):
        if "alarm list" in command:
            return remote(True, "memberID:3 alarm:NOSPACE\n", "")
        return answers[host]

    monkeypatch.setattr(common, "run_remote", run_on)
    result = day2.status(loaded)
    states = {m.name: m.state for m in result.members}
    assert states == {"etcd-1": "healthy", "etcd-2": "healthy", "etcd-3": "unhealthy"}
    assert result.health == "degraded"
    assert "data disk full: 0 MiB free of 512 MiB at /var/lib/etcd" in result.members[2].error
    assert result.alarms == ["memberID:3 alarm:NOSPACE (etcd-3)"]


def test_status_says_why_a_member_stopped_answering(monkeypatch, loaded):
    down = remote(
        True,
        "== status\nError: connection refused\n[]\n== health\n== metrics\n"
        "== disk\n536870912 400000000\n== journal\n"
        '{"level":"fatal","msg":"failed to save","error":"write wal: no space left on device"}\n'
        "== end\n",
        "",
    )
    answers = {
        "etcd-1": member_answer(1, True, "536870912 400000000"),
        "etcd-2": member_answer(2, True, "536870912 400000000"),
        "etcd-3": down,
    }
    monkeypatch.setattr(
        common,
        "run_remote",
        lambda loaded, host, command, **kw: answers.get(host, remote(True, "", "")),
    )
    result = day2.status(loaded)
    etcd3 = result.members[2]
    assert etcd3.state == "down"
    assert etcd3.error.startswith("Error: connection refused; ")
    assert "failed to save: write wal: no space left on device" in etcd3.error


def test_status_command_exits_5_for_a_full_disk(monkeypatch, loaded):
    answers = {
        "etcd-1": member_answer(1, True, "536870912 400000000"),
        "etcd-2": member_answer(2, True, "536870912 400000000"),
        "etcd-3": member_answer(3, True, "536870912 0"),
    }
    monkeypatch.setattr(
        common,
        "run_remote",
        lambda loaded, host, command, **kw: answers.get(host, remote(True, "", "")),
    )
    result = CliRunner().invoke(app, ["etcd", "status", str(loaded.source), "--format", "json"])
    assert result.exit_code == ExitCode.DEGRADED
    members = {m["name"]: m for m in json.loads(result.output)["members"]}
    assert "data disk full" in members["etcd-3"]["error"]


def test_discard_deletes_the_old_data_only_with_etcd_stopped(member_dir, tmp_path):
    data, paths = member_dir
    (tmp_path / "bin" / "systemctl").write_text("#!/bin/sh\nexit 0\n")  # "active"
    refused = sh(set_aside_command(str(data), paths.kept, discard=True))
    assert refused.returncode != 0 and db(data) == "old"
    (tmp_path / "bin" / "systemctl").write_text("#!/bin/sh\nexit 3\n")  # stopped
    assert sh(set_aside_command(str(data), paths.kept, discard=True)).returncode == 0
    assert not (data / "member").exists() and not Path(paths.kept).exists()


# ---------------------------------------------------------------- the replace's fence, as shell


@pytest.fixture
def fence(member_dir, tmp_path, monkeypatch) -> Path:
    """The fence drop-in under tmp_path, and a systemctl that logs its calls, says etcd is
    inactive, and fails `stop` when STOP_RC says so."""
    monkeypatch.setattr(replace_commands, "SYSTEMD_DIR", str(tmp_path))
    (tmp_path / "bin" / "systemctl").write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path}/systemctl.log\n'
        'case "$1" in is-active) exit 3;; stop) exit "${STOP_RC:-0}";; *) exit 0;; esac\n'
    )
    return tmp_path / "etcd.service.d" / replace_commands.FENCE_NAME


def test_the_stop_fences_etcd_and_a_failed_stop_lifts_the_fence_again(fence, monkeypatch):
    assert sh(stop_member_command()).returncode == 0
    assert fence.exists() and "AssertPathExists=!" in fence.read_text()
    fence.unlink()
    monkeypatch.setenv("STOP_RC", "1")
    assert sh(stop_member_command()).returncode != 0
    assert not fence.exists()  # etcd may still run: nothing is left that stops its restart


def test_put_back_lifts_the_fence_only_where_the_old_data_is_back(fence, member_dir):
    data, paths = member_dir
    kept = paths.kept.replace("restore", "replace")
    assert sh(stop_member_command()).returncode == 0
    assert sh(set_aside_command(str(data), kept)).returncode == 0
    assert sh(put_back_command(str(data), kept)).returncode == 0
    assert db(data) == "old" and not fence.exists()
    # Discarded: nothing to put back, so the member stays fenced and the command fails.
    assert sh(stop_member_command()).returncode == 0
    assert sh(set_aside_command(str(data), kept, discard=True)).returncode == 0
    assert sh(put_back_command(str(data), kept)).returncode != 0
    assert fence.exists() and not (data / "member").exists()
    # The join lifts it.
    assert sh(join_command()).returncode == 0 and not fence.exists()
