"""scripts/cpu_profile.py: a lab host's processes are named by their root folder, and the report
sums each sample's groups by lab, host and command against the machine's busy time."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cpu_profile", REPO / "scripts/cpu_profile.py")
profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile)


def test_a_process_is_placed_in_its_lab_host_by_its_network_namespace():
    assert profile.where("gpuinfra.itest.etcd-1") == "itest/etcd-1"
    assert profile.where("gpuinfra.itest-k8s.cp-1") == "itest-k8s/cp-1"
    # Controls: the machine's own namespace (no name), another program's, one with no host.
    assert profile.where(None) == "machine"
    assert profile.where("cni-1234") == "machine"
    assert profile.where("gpuinfra.itest") == "machine"


def test_a_hosts_systemd_nspawn_counts_as_that_host():
    argv = [
        b"systemd-nspawn",
        b"--directory=/x",
        b"--network-namespace-path=/run/netns/gpuinfra.a.b",
    ]
    assert profile.nspawn_host(b"\0".join(argv) + b"\0") == "gpuinfra.a.b"
    assert profile.nspawn_host(b"systemd-nspawn\0--boot\0") is None


def test_the_report_sums_samples_after_the_first_by_lab_host_and_command(tmp_path):
    samples = [
        {"t": 0, "busy": 99.0, "groups": {"machine|go": 99.0}},  # before the window's start
        {"t": 10, "busy": 20.0, "groups": {"itest/cp-1|etcd": 6.0, "machine|python": 12.0}},
        {"t": 20, "busy": 20.0, "groups": {"itest/cp-2|etcd": 4.0, "itest-k8s/cp-1|etcd": 8.0}},
    ]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    lines = profile.report(path, 0, 20)
    assert lines[0] == "20 s, 40 CPU-s busy (2.00 cores), 30 CPU-s in processes"
    by_lab = lines[lines.index("by lab:") + 1 : lines.index("by host:")]
    assert [line.split() for line in by_lab] == [
        ["12", "30.0%", "machine"],
        ["10", "25.0%", "itest"],
        ["8", "20.0%", "itest-k8s"],
    ]
    by_host = lines[lines.index("by host:") + 1 : lines.index("by command:")]
    assert ["6", "15.0%", "itest/cp-1"] in [line.split() for line in by_host]
    by_command = lines[lines.index("by command:") + 1 :]
    # etcd of two hosts of one lab in one line; the other lab's etcd apart.
    assert [line.split() for line in by_command[:2]] == [
        ["12", "30.0%", "machine", "python"],
        ["10", "25.0%", "itest", "etcd"],
    ]
    assert profile.report(path, 15, 20) == [f"{path}: fewer than two samples in that window"]
