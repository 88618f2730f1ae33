"""The drift fast path on the lab: after an apply, each converged host is checked in one round
trip and reported exactly as the operation-by-operation check reports it; a host that differs,
or whose inventory changed, is checked operation by operation; drift writes nothing."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli.exitcodes import ExitCode
from engine import fingerprint
from engine.context import load
from tests.helpers import GPUINFRA, gpuinfra
from toolkit.facts import HeldPackages
from toolkit.ssh import ssh_argv

pytestmark = pytest.mark.integration
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # the gpu_health role's default


def drift(inventory: Path, *flags: str) -> tuple[int, dict]:
    result = gpuinfra("drift", str(inventory), "--format", "json", *flags)
    assert result.returncode in (0, 3), result.stdout[-3000:] + result.stderr[-3000:]
    return result.returncode, json.loads(result.stdout)


def answer(report: dict) -> dict:
    """What a drift says of each host, without timings."""
    return {
        name: {
            "status": host["status"],
            "operations": [(op["phase"], op["name"], op["changed"]) for op in host["operations"]],
            "reboot_required": host["reboot_required"],
            "notes": host["notes"],
        }
        for name, host in report["hosts"].items()
    }


def test_a_converged_fleet_is_checked_in_one_round_trip_per_host_with_the_same_answer(converged):
    # The GPU health writer puts its textfile into node exporter's directory every few minutes:
    # a new entry moves the directory's times and size, which are not what the apply set.
    converged.ssh("gpu-1", f"echo '# a test' > {TEXTFILE_DIR}/gpuinfra-test.prom")
    try:
        fleet_matches_its_records(converged)
    finally:
        converged.ssh("gpu-1", f"rm -f {TEXTFILE_DIR}/gpuinfra-test.prom")


def fleet_matches_its_records(converged) -> None:
    code, fast = drift(converged.inventory_path)
    assert code == ExitCode.OK
    total = len(converged.hosts)
    notes = " ".join(fast["notes"])
    assert f"{total} of {total} hosts matched their converged record" in notes
    # The command line sent every probe before it imported the rest, and answered without
    # loading the inventory: the cluster file and the code are the ones the apply validated.
    assert "the inventory unchanged since the last apply: not loaded again" in notes
    # The command's time counts from the first probe, sent before the command's body began.
    assert fast["seconds"] >= fast["phase_seconds"]["fast check"]
    assert "prepare:base" not in fast["phase_seconds"]  # no host went through pyinfra
    code, exact = drift(converged.inventory_path, "--exact")
    assert code == ExitCode.OK
    assert "fast check" not in exact["phase_seconds"]
    assert answer(fast) == answer(exact)
    # The command's own path (an option other than --format, --report and --junit): it loads
    # the inventory and sends the probes itself, and answers the same.
    code, loaded = drift(converged.inventory_path, "--parallel", "100")
    assert code == ExitCode.OK
    assert "not loaded again" not in " ".join(loaded["notes"])
    assert answer(loaded) == answer(fast)


def imported(*args: str) -> set[str]:
    """The modules a gpuinfra command imports (Python's -X importtime, on stderr)."""
    argv = [sys.executable, "-X", "importtime", GPUINFRA, *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    lines = [line.split("|")[-1] for line in result.stderr.splitlines() if "|" in line]
    return {line.strip() for line in lines if line.startswith(" ")}


def test_a_clean_fleets_drift_renders_nothing_and_imports_no_engine(converged):
    """The converged hosts' inputs stand for their files (toolkit/clock.py): no Jinja, no
    certificate parsing, no pyinfra or paramiko. The exact check of the same fleet imports
    them (the control: the probe sees those imports when they happen)."""
    engines = {"jinja2", "cryptography", "pyinfra", "paramiko"}
    fast = imported("drift", str(converged.inventory_path), "--format", "json")
    assert "engine.fingerprint" in fast and not engines & fast
    exact = imported("drift", str(converged.inventory_path), "--format", "json", "--exact")
    assert engines <= exact
    # Answered without the inventory: neither its loader nor the command line's parser.
    loaders = {"pydantic", "yaml", "typer", "inventory.model"}
    assert not loaders & fast
    loading = imported("drift", str(converged.inventory_path), "-f", "json", "--parallel", "99")
    assert loaders <= loading and not engines & loading  # the control: the same check, loaded


def test_each_batched_answer_is_what_its_command_prints_alone(converged):
    """The grouped file and unit facts and the commands run without their own `sh -c`
    (engine/fingerprint/) against each command run on its own as the SSH channel runs it, on
    hosts of every kind the lab has: control for the batching itself."""
    loaded = load(converged.inventory_path)
    for host in ("etcd-1", "lb-1", "gpu-1"):
        record = fingerprint.load_record(loaded.state_dir, host)
        assert record is not None, host
        commands = [command for command, _, _ in record.commands]
        grouped = [i for i, c in enumerate(commands) if fingerprint.grouped(c) is not None]
        assert len(grouped) > len(commands) / 2, (host, len(grouped), len(commands))
        script = fingerprint.probe_script(commands, "m-test")
        argv = [*ssh_argv(loaded, host), "sh", "-s"]
        probe = subprocess.run(argv, input=script.encode(), capture_output=True, check=True)
        answers = fingerprint.read_probe(probe.stdout, "m-test", commands)
        # Every command on its own (its own `sh -c`, as the SSH channel runs it), in one ssh.
        script = fingerprint.probe_script(commands, "m-alone", batched=False)
        alone = subprocess.run(argv, input=script.encode(), capture_output=True, check=True)
        expected = fingerprint.read_probe(alone.stdout, "m-alone")
        for index in range(len(commands)):  # grouped, and unwrapped from their `sh -c`
            assert answers.get(index) == expected[index], (host, commands[index])


def test_held_packages_are_what_apt_mark_shows_on_every_kind_of_host(converged):
    """toolkit.facts.HeldPackages reads dpkg's database where apt-mark reads apt's cache: the same
    names on each host, the GPU host's held NVIDIA packages among them (the control that
    there is something to compare)."""
    loaded = load(converged.inventory_path)
    fact = HeldPackages()
    for host in ("etcd-1", "gpu-1"):
        argv = ssh_argv(loaded, host)
        ours = subprocess.run([*argv, fact.command()], capture_output=True, text=True, check=True)
        apt = subprocess.run([*argv, "apt-mark showhold"], capture_output=True, text=True)
        assert apt.returncode == 0, apt.stderr
        held = fact.process(ours.stdout.splitlines())
        assert held == sorted(apt.stdout.split()), host
        assert bool(held) == (host == "gpu-1"), (host, held)


def test_a_host_that_differs_is_checked_operation_by_operation_and_shown(converged, tmp_path):
    lab = converged
    edited, chmodded = "cpu-1", "dns-1"
    lab.ssh(edited, "echo '10.9.9.9 rogue' >> /etc/hosts")
    lab.ssh(chmodded, "chmod 0600 /etc/hostname")
    try:
        code, fast = drift(lab.inventory_path)
        assert code == ExitCode.DRIFT
        drifted = {n for n, h in fast["hosts"].items() if h["status"] == "drift"}
        assert drifted == {edited, chmodded}
        notes = " ".join(fast["notes"])
        assert f"{len(lab.hosts) - 2} of {len(lab.hosts)} hosts matched" in notes
        assert "2 differs from its record" in notes
        # Not settled: the command loaded the inventory and kept the probes it had sent.
        assert f"{len(lab.hosts)} sent before the inventory was loaded" in notes
        diffs = [op["diff"] or "" for op in fast["hosts"][edited]["operations"] if op["changed"]]
        assert any("-10.9.9.9 rogue" in d for d in diffs)
        # The exact check of the two and of a clean host (the control) says the same; the
        # converged fleet's test compares all of them.
        compared = sorted([edited, chmodded, "etcd-1"])
        _, exact = drift(lab.inventory_path, "--exact", "--limit", ",".join(compared))
        assert answer(exact) == {host: answer(fast)[host] for host in compared}
    finally:
        fixed = gpuinfra(
            "apply", str(lab.inventory_path), "--limit", f"{edited},{chmodded}", "--yes"
        )
        assert fixed.returncode == ExitCode.OK, fixed.stdout[-2000:]
    code, after = drift(lab.inventory_path)
    assert code == ExitCode.OK
    assert f"{len(lab.hosts)} of {len(lab.hosts)} hosts matched" in " ".join(after["notes"])


def state_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_drift_writes_nothing_and_an_inventory_change_means_the_exact_check(converged, tmp_path):
    state = converged.inventory_path.parent / ".state"
    before = state_digest(state)
    drift(converged.inventory_path)
    assert state_digest(state) == before

    # The same cluster with one setting changed (journald's cap), and the same records.
    copy = tmp_path / "changed"
    copy.mkdir()
    shutil.copytree(state, copy / ".state")
    data = yaml.safe_load(converged.inventory_path.read_text())  # key paths are absolute
    data["group_vars"]["all"]["base"]["journald_max_use"] = "123M"
    (copy / "cluster.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    # Three hosts of three kinds: the exact check of all 16 is the converged fleet's test's.
    chosen = ["cpu-1", "dns-1", "etcd-1"]
    code, report = drift(copy, "--limit", ",".join(chosen))
    assert code == ExitCode.DRIFT
    assert sorted(report["hosts"]) == chosen
    notes = " ".join(report["notes"])
    assert f"0 of {len(chosen)} hosts matched" in notes
    assert "code, inventory or state changed since its record" in notes
    changed = {
        op["name"]
        for host in report["hosts"].values()
        for op in host["operations"]
        if op["changed"]
    }
    assert any("journald" in name for name in changed), changed


# HAProxy's runtime API on its socket (the lab's hosts have python3, not socat).
HAPROXY_ADMIN = (
    "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/haproxy/admin.sock'); "
    "s.sendall(b'{}\\n'); print(s.recv(4096).decode())"
)


def haproxy_admin(command: str) -> str:
    return f"python3 -c {shlex.quote(HAPROXY_ADMIN.format(command))}"


# etcdctl as the operator, through every member (the role's own settings file).
ETCDCTL = (
    'set -a && . /etc/etcd/etcdctl.env && set +a && etcdctl --endpoints="$GPUINFRA_ETCD_ENDPOINTS"'
)


# A public key nobody declared (its private half was never kept).
INTRUDER = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIgvH+bzcMiFa9PEKUVML/+rswuCKuWSS13VJJeYvye5 intruder@site"
)


# Changes that alter what a host does while leaving gpuinfra's own files alone (issue #30's
# classes), each made on a converged host: (host, change, undo, the operation that must show
# it, a text its finding must hold or None for an operation that repairs it).
OVERRIDES = [
    ("cpu-1", "printf 'PasswordAuthentication yes\\n' > /etc/ssh/sshd_config.d/01-site.conf",
     "rm -f /etc/ssh/sshd_config.d/01-site.conf",
     "Base | Check that no sshd setting overrides ours", "01-site.conf"),
    # Read after ours, but inside a Match block that reaches every address: sshd -T -C sees it.
    ("dns-1", "printf 'Match Address *\\n    PasswordAuthentication yes\\n' > "
     "/etc/ssh/sshd_config.d/90-match.conf",
     "rm -f /etc/ssh/sshd_config.d/90-match.conf",
     "Base | Check that no sshd setting overrides ours", "root from 203.0.113.1"),
    # A Match block for a user who is neither root nor the SSH user, named only by the block.
    ("mon-1", "printf 'Match User deploy\\n    PasswordAuthentication yes\\n' > "
     "/etc/ssh/sshd_config.d/90-deploy.conf",
     "rm -f /etc/ssh/sshd_config.d/90-deploy.conf",
     "Base | Check that no sshd setting overrides ours", "deploy from 203.0.113.1"),
    ("cpu-1", "nft add table inet block && nft add chain inet block in "
     "'{ type filter hook input priority -10; policy accept; }' && "
     "nft add rule inet block in tcp dport 9100 drop",
     "nft delete table inet block",
     "Firewall | Check that no other table filters input", "table inet block"),
    ("cpu-1", "echo 'deb http://deb.debian.org/debian trixie-backports main' "
     "> /etc/apt/sources.list.d/backports.list",
     "rm -f /etc/apt/sources.list.d/backports.list",
     "Base | Check that apt reads only gpuinfra's sources and pins", "backports.list"),
    ("dns-1", "systemctl disable --quiet ssh && systemctl enable --quiet --runtime ssh",
     "true",  # the apply below enables it for every boot
     "Base | Start sshd at boot", None),
    ("etcd-2", "mkdir -p /etc/systemd/system/etcd.service.d && printf "
     "'[Service]\\nEnvironment=ETCD_QUOTA_BACKEND_BYTES=1\\n' > "
     "/etc/systemd/system/etcd.service.d/override.conf && systemctl daemon-reload",
     "rm -f /etc/systemd/system/etcd.service.d/override.conf && systemctl daemon-reload",
     "Etcd | Check the drop-ins of etcd", "etcd.service.d/override.conf"),
    ("cpu-1", "echo 'vm.swappiness = 60' > /etc/sysctl.d/99-site.conf",
     "rm -f /etc/sysctl.d/99-site.conf",
     "Kernel | Check that no sysctl file overrides ours at boot", "99-site.conf"),
    ("dns-1", "mkdir -p /etc/systemd/system.conf.d && printf "
     "'[Manager]\\nDefaultLimitNOFILE=1024\\n' > /etc/systemd/system.conf.d/99-site.conf",
     "rm -f /etc/systemd/system.conf.d/99-site.conf",
     "Kernel | Check that no systemd setting overrides our limits", "99-site.conf"),
    ("lb-1", haproxy_admin("disable server kube-apiserver/cp-2"),
     haproxy_admin("enable server kube-apiserver/cp-2"),
     "Load balancer | Check that no API server is held out of rotation", "kube-apiserver/cp-2"),
    ("etcd-1", f"{ETCDCTL} member add spare --learner --peer-urls=https://198.18.3.250:2380",
     f"{ETCDCTL} member list | awk -F', ' '$4 ~ /198.18.3.250/ {{print $1}}' > /tmp/spare && "
     'etcdctl --endpoints="$GPUINFRA_ETCD_ENDPOINTS" member remove "$(cat /tmp/spare)"',
     "Etcd | Check that etcd has no member the inventory lacks", "198.18.3.250"),
    ("etcd-2", "usermod -aG disk etcd", "gpasswd -d etcd disk >/dev/null",
     "Etcd | Check that the etcd user is in no other group", "disk"),
    ("cpu-1", "echo 'server 192.0.2.1 iburst' > /etc/chrony/sources.d/site.sources",
     "rm -f /etc/chrony/sources.d/site.sources",
     "Base | Check that chrony reads only gpuinfra's sources", "site.sources"),
    # A foreign file that copies our marker into its first line is still foreign: drift
    # compares paths with the files gpuinfra writes, not markers.
    ("stor-1", "printf '# Managed by gpuinfra\\nserver 192.0.2.1 iburst\\n' > "
     "/etc/chrony/sources.d/copied.sources",
     "rm -f /etc/chrony/sources.d/copied.sources",
     "Base | Check that chrony reads only gpuinfra's sources", "copied.sources"),
    # Who can log in: a key the inventory does not declare, named by its comment.
    ("etcd-4", f"echo '{INTRUDER}' >> /root/.ssh/authorized_keys",
     "sed -i '/ intruder@site$/d' /root/.ssh/authorized_keys",
     "Base | Check that only the declared keys log in", "intruder@site"),
    ("cpu-1", "mkdir -p /etc/containerd/conf.d && "
     "echo 'version = 2' > /etc/containerd/conf.d/site.toml",
     "rm -f /etc/containerd/conf.d/site.toml",
     "Container runtime | Check that containerd imports only gpuinfra's files", "site.toml"),
    ("lb-1", "printf '* hard memlock 64\\n' > /etc/security/limits.d/99-site.conf",
     "rm -f /etc/security/limits.d/99-site.conf",
     "Kernel | Check that no limits.d file overrides ours", "99-site.conf"),
    # The lab's hosts have no kmod, so no modprobe.d: the change makes it, the undo removes it.
    ("cpu-1", "mkdir -p /etc/modprobe.d && "
     "echo 'blacklist br_netfilter' > /etc/modprobe.d/99-site.conf",
     "rm -f /etc/modprobe.d/99-site.conf && rmdir --ignore-fail-on-non-empty /etc/modprobe.d",
     "Kernel | Check that no modprobe.d file stops our modules", "99-site.conf"),
    ("mon-1", "mkdir -p /etc/systemd/journald.conf.d && printf '[Journal]\\nSystemMaxUse=8G\\n' "
     "> /etc/systemd/journald.conf.d/99-site.conf",
     "rm -f /etc/systemd/journald.conf.d/99-site.conf",
     "Base | Check that no journald setting overrides ours", "99-site.conf"),
    ("stor-1", "printf 'APT::Install-Recommends \"true\";\\n' > /etc/apt/apt.conf.d/99site",
     "rm -f /etc/apt/apt.conf.d/99site",
     "Base | Check that no apt setting overrides ours", "99site"),
    ("etcd-4", "printf 'GRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\\n' > /etc/default/grub.d/99-site.cfg",
     "rm -f /etc/default/grub.d/99-site.cfg",
     "Kernel | Check that no grub.d file drops our kernel arguments", "99-site.cfg"),
    ("etcd-3", "apt-get remove -y -q etcd-client >/dev/null",
     "true",  # the apply below installs it again
     "Etcd | Install etcd", None),
]  # fmt: skip


def test_what_overrides_the_hosts_settings_is_drift_with_its_file_named(converged):
    """Each class drifts (exit 3) on its host, named with the file or table behind it, the
    fast path and `--exact` agreeing; an apply stops where removing the file is the operator's
    call; undone, the fleet is clean again. The converged fleet's clean drift (the first test
    of this module, and the end of this one) is the control."""
    lab = converged
    hosts = sorted({host for host, *_ in OVERRIDES})
    # The learner is found by etcd-1, the member that asks the cluster (the others do not).
    drifting = set(hosts)
    try:
        for host, change, *_ in OVERRIDES:
            lab.ssh(host, change)
        code, fast = drift(lab.inventory_path)
        assert code == ExitCode.DRIFT
        assert {n for n, h in fast["hosts"].items() if h["status"] != "ok"} == drifting
        for host, _, _, operation, named in OVERRIDES:
            changed = {op["name"]: op["diff"] for op in fast["hosts"][host]["operations"]}
            assert operation in changed, (host, sorted(changed))
            assert named is None or named in (changed[operation] or ""), changed[operation]
        _, exact = drift(lab.inventory_path, "--exact", "--limit", ",".join(sorted(drifting)))
        for host in drifting:
            assert answer(exact)[host] == answer(fast)[host], host
        stopped = gpuinfra("apply", str(lab.inventory_path), "--limit", "cpu-1", "--roles",
                           "base", "--yes", "--format", "json")  # fmt: skip
        assert stopped.returncode != ExitCode.OK
        error = json.loads(stopped.stdout)["hosts"]["cpu-1"]["error"]
        assert "01-site.conf" in error, error  # the first check that fails stops the host
    finally:
        for host, _, undo, *_ in OVERRIDES:
            lab.ssh(host, undo, check=False)
    # The apply repairs the two it can: sshd enabled for every boot, etcd-client installed again.
    fixed = gpuinfra(
        "apply", str(lab.inventory_path), "--limit", ",".join(sorted(drifting)), "--yes"
    )
    assert fixed.returncode == ExitCode.OK, fixed.stdout[-2000:]
    assert lab.ssh("dns-1", "systemctl is-enabled ssh").stdout.strip() == "enabled"
    lab.ssh("etcd-3", "etcdctl version")
    code, after = drift(lab.inventory_path)
    assert code == ExitCode.OK, answer(after)
    assert f"{len(lab.hosts)} of {len(lab.hosts)} hosts matched" in " ".join(after["notes"])
