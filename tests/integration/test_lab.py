"""The lab itself: real Debian 13 hosts that boot, answer SSH, reach the mirror, fail on demand."""

from __future__ import annotations

import json
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lab import addressing, lifecycle, network, processes
from lab.host import mounted_paths
from lab.naming import LABS_DIR
from lab.rootfs import machine_mirror
from lab.topology import generic_topology
from tests.integration.conftest import LabCluster, boot_lab

pytestmark = pytest.mark.integration


def boot_id(lab: LabCluster, host: str) -> str:
    return lab.ssh(host, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def wait_for(predicate, timeout_s: float = 120, interval_s: float = 1.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval_s)
    return False


def reachable(lab: LabCluster, source: str, target: str) -> bool:
    """Whether source opens a TCP connection to target's sshd (minbase has no ping)."""
    probe = f"timeout 3 bash -c '</dev/tcp/{lab.address(target)}/22'"
    return lab.ssh(source, probe, check=False).returncode == 0


def test_every_host_answers_ssh_with_strict_host_key_checking(lab: LabCluster) -> None:
    assert len(lab.hosts) == 16
    with ThreadPoolExecutor(16) as pool:
        names = list(pool.map(lambda host: lab.ssh(host, "hostname").stdout.strip(), lab.hosts))
    assert names == lab.hosts
    assert "StrictHostKeyChecking=yes" in lifecycle.ssh_argv(lab.name, "etcd-1", [])


def test_host_keys_are_checked_not_trusted(lab: LabCluster, tmp_path: Path) -> None:
    # The same ssh with an empty known_hosts must refuse: checking really is on.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    argv = lifecycle.ssh_argv(lab.name, "etcd-1", ["true"])
    argv = [f"UserKnownHostsFile={empty}" if arg.startswith("UserKnownHostsFile=") else arg
            for arg in argv]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "Host key verification failed" in result.stderr
    # And every host has its own key.
    keys = Path(str(lab.loaded.cluster.ssh.known_hosts)).read_text().splitlines()
    assert len({line.split()[2] for line in keys}) == len(lab.hosts)


def test_hostname_addresses_and_routes(lab: LabCluster) -> None:
    subnet = lab.loaded.cluster.networks.node
    for host in ("etcd-1", "gpu-1"):
        output = lab.ssh(
            host, "hostname -f; ip -4 -o addr show dev eth0; ip route show default; cat /etc/hosts"
        ).stdout
        assert output.splitlines()[0] == f"{host}.{lab.loaded.cluster.domain}"
        assert f"{lab.address(host)}/{subnet.prefixlen}" in output
        assert f"default via {addressing.gateway(subnet)}" in output
        # Other integration tests may have rewritten /etc/hosts since: check meaning, not bytes.
        assert re.search(r"^127\.0\.0\.1\s+localhost\b", output, re.MULTILINE)


def test_hosts_reach_each_other(lab: LabCluster) -> None:
    assert reachable(lab, "etcd-1", "etcd-2")
    assert reachable(lab, "gpu-1", "cp-1")


def test_apt_reaches_the_mirror_with_non_free(lab: LabCluster) -> None:
    result = lab.ssh("cpu-1", "apt-get update 2>&1", timeout=300)
    assert machine_mirror().archive in result.stdout  # the machine's own mirror, reached
    policy = lab.ssh("cpu-1", "apt-cache policy nvidia-smi").stdout
    assert "Candidate: (none)" not in policy and "trixie/non-free" in policy


def test_stop_and_start(lab: LabCluster) -> None:
    before = boot_id(lab, "dns-1")
    assert lifecycle.stop_host(lab.name, "dns-1")
    status = {host.name: host for host in lifecycle.status(lab.name).hosts}
    assert not status["dns-1"].running
    assert lab.ssh("dns-1", "true", check=False).returncode != 0
    assert not lifecycle.start_host(lab.name, "dns-1")
    assert boot_id(lab, "dns-1") != before


def test_partition_and_heal(lab: LabCluster) -> None:
    assert reachable(lab, "etcd-1", "etcd-3")
    lifecycle.partition(lab.name, "etcd-3")
    try:
        assert not reachable(lab, "etcd-1", "etcd-3")
        status = {host.name: host for host in lifecycle.status(lab.name).hosts}
        assert status["etcd-3"].partitioned and status["etcd-3"].running
    finally:
        lifecycle.partition(lab.name, "etcd-3", partitioned=False)
    assert wait_for(lambda: reachable(lab, "etcd-1", "etcd-3"), timeout_s=30)


def test_reboot_comes_back(lab: LabCluster) -> None:
    before = boot_id(lab, "mon-1")
    lab.ssh("mon-1", "systemctl reboot", check=False)  # the connection may drop mid-command

    def rebooted() -> bool:
        result = lab.ssh("mon-1", "cat /proc/sys/kernel/random/boot_id", check=False)
        return result.returncode == 0 and result.stdout.strip() not in ("", before)

    assert wait_for(rebooted, timeout_s=120)
    running = lab.ssh("mon-1", "systemctl is-system-running --wait", check=False).stdout
    assert running.strip() in ("running", "degraded")


def test_up_again_changes_nothing(lab: LabCluster) -> None:
    inventory = lab.inventory_path.read_text()
    again = lifecycle.up(lab.name, inventory_path=lab.inventory_path)
    assert again.started == []
    assert sorted(again.already_running) == sorted(lab.hosts)
    assert lab.inventory_path.read_text() == inventory


def test_status_reports_memory_per_host(lab: LabCluster) -> None:
    status = lifecycle.status(lab.name)
    assert [host.name for host in status.hosts] == lab.hosts
    for host in status.hosts:
        assert host.running and host.ssh and not host.partitioned
        assert host.memory_bytes is not None and 2**20 < host.memory_bytes < 2**30


def lab_traces(name: str) -> dict[str, list]:
    """Everything on the machine that belongs to a lab, found by its naming scheme."""
    state_dir = LABS_DIR / name
    loops = json.loads(
        subprocess.run(
            ["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"],
            capture_output=True, text=True, check=True,
        ).stdout or '{"loopdevices": []}'
    )["loopdevices"]  # fmt: skip
    return {
        "netns": network.lab_netns(name),
        "links": network.lab_links(name),
        "nft": [name] if network.nft_table_exists(name) else [],
        "mounts": [point for point in mounted_paths() if point.startswith(f"{state_dir}/")],
        "processes": list(processes.with_cmdline_under(state_dir))
        + processes.with_root_under(state_dir),
        "loops": [
            loop for loop in loops if (loop.get("back-file") or "").startswith(f"{state_dir}/")
        ],
        "state": [state_dir] if state_dir.exists() else [],
    }


def test_second_lab_with_a_disk_then_down_leaves_no_trace(lab: LabCluster, tmp_path: Path) -> None:
    name = f"{lab.name}-small"
    topology = generic_topology(2).with_disks({"host-001": 256 * 2**20})
    small = boot_lab(name, topology, tmp_path / "cluster.yml")
    try:
        # Its own subnet and bridge: the two labs do not collide.
        assert not small.loaded.cluster.networks.node.overlaps(lab.loaded.cluster.networks.node)
        assert any(link["ifname"].startswith("glab") for link in network.lab_links(name))
        # The loop disk takes a filesystem and mounts (e2fsprogs is not in minbase).
        small.ssh("host-001", "apt-get update -q && apt-get install -yq e2fsprogs", timeout=300)
        disk = small.ssh(
            "host-001",
            "mkfs.ext4 -q /dev/vdb && mkdir -p /mnt/data && mount -o noatime /dev/vdb /mnt/data"
            " && echo ok > /mnt/data/probe && cat /mnt/data/probe && blkid /dev/vdb",
        ).stdout
        assert disk.splitlines()[0] == "ok" and 'TYPE="ext4"' in disk
        assert small.ssh("host-002", "test -e /dev/vdb", check=False).returncode != 0
        assert any(lab_traces(name).values())
    finally:
        lifecycle.down(name)
    assert lab_traces(name) == {key: [] for key in lab_traces(name)}
    assert not (tmp_path / "cluster.yml").exists()
    # The shared lab did not notice.
    assert lab.ssh("etcd-1", "true").returncode == 0


def test_a_saved_layer_starts_new_hosts_where_the_saved_one_stood(
    lab: LabCluster, tmp_path: Path
) -> None:
    """save-layer keeps a host's changes (a package, a file, a removed file) and leaves out what
    makes it that host and its firewall; hosts booted on it have their own keys and names."""
    seed_name, layered_name = f"{lab.name}-seed", f"{lab.name}-layered"
    layer = tmp_path / "layer"
    seed = boot_lab(seed_name, generic_topology(1), tmp_path / "seed.yml")
    try:
        seed.ssh(
            "host-001",
            "apt-get update -q && apt-get install -yq --no-install-recommends jq"
            " && echo seeded > /etc/gpuinfra-seed && rm /etc/issue.net"
            " && printf 'flush ruleset\\n' > /etc/nftables.conf",
            timeout=300,
        )
        seed_key = seed.ssh("host-001", "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout
        lifecycle.save_layer(seed_name, "host-001", layer)
    finally:
        lifecycle.down(seed_name)
    assert (layer / "etc/gpuinfra-seed").exists()
    assert not (layer / "etc/nftables.conf").exists() and not (layer / "etc/hostname").exists()
    assert not list(layer.glob("etc/ssh/ssh_host_*"))
    layered = boot_lab(layered_name, generic_topology(2), tmp_path / "layered.yml", layer)
    try:
        lifecycle.up(layered_name, generic_topology(2), layer=layer)  # the same layer: no-op
        with pytest.raises(lifecycle.LabInvalid):
            lifecycle.up(layered_name, generic_topology(2), layer=tmp_path)
        seen = {}
        for name in ("host-001", "host-002"):
            seen[name] = layered.ssh(
                name,
                "cat /etc/gpuinfra-seed; jq --version; test -e /etc/issue.net || echo removed;"
                " hostname; cat /etc/machine-id /etc/ssh/ssh_host_ed25519_key.pub",
            ).stdout.splitlines()
        for name, lines in seen.items():
            assert lines[0] == "seeded" and lines[1].startswith("jq-") and lines[2] == "removed"
            assert lines[3] == name and lines[5] != seed_key.strip()
        assert seen["host-001"][4:] != seen["host-002"][4:]  # machine id and host key differ
    finally:
        lifecycle.down(layered_name)
