"""Simulated GPU nodes (lab/fleet.py), offline: the Node objects kwok is given, from the sample
inventory and a small one, the stage cadence, kwok's command line and its stop."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time

import pytest

from engine.context import load
from lab import fleet
from lab.errors import LabInvalid
from tests.unit.conftest import SAMPLE
from toolkit import nodes


@pytest.fixture(scope="module")
def sample():
    return load(SAMPLE / "cluster.yml")


def kubelet_form(taint: dict[str, str]) -> str:
    return f"{taint['key']}={taint['value']}:{taint['effect']}"


def test_each_node_is_the_samples_gpu_worker_on_an_8_gpu_server(sample):
    (node,) = fleet.fleet_nodes(sample, [1])
    worker = sample.cluster.hosts["gpu-1"].gpu
    assert node["metadata"]["name"] == "sim-gpu-00001"
    expected = {"cpu": "224", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": str(worker.count)}
    assert node["status"]["capacity"] == expected
    assert node["status"]["allocatable"] == expected
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == worker.model
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v" + sample.cluster.versions.kubernetes
    # The API refuses a Node whose nodeInfo lacks one of its ten fields (found on a real one).
    assert set(info) == set(fleet.NODE_INFO_FIELDS) and len(info) == 10
    # kwok manages this node and no other (the lab's real kubelets keep theirs).
    assert node["metadata"]["annotations"] == {fleet.MANAGED_KEY: fleet.MANAGED_VALUE}


def test_nodes_carry_the_roles_labels_and_taints_dealt_round_the_teams(sample):
    teams = list(sample.cluster.teams)
    assert teams == ["research", "inference"]
    fleet_nodes = fleet.fleet_nodes(sample, range(1, 5))
    for node, team in zip(fleet_nodes, teams * 2, strict=True):
        labels = node["metadata"]["labels"]
        assert labels[nodes.TEAM_LABEL_KEY] == team
        assert labels[nodes.GPU_WORKER_LABEL_KEY] == nodes.GPU_WORKER_LABEL_VALUE
        # The device plugin and DCGM exporter select it: the fleet carries their pods too.
        assert labels[nodes.NVIDIA_RUNTIME_LABEL_KEY] == nodes.NVIDIA_RUNTIME_LABEL_VALUE
        # The same taints, in kubelet's --register-with-taints form, as a real GPU worker's.
        taints = [kubelet_form(taint) for taint in node["spec"]["taints"]]
        assert taints == [nodes.PREFLIGHT_TAINT, nodes.team_taint(team)]


def test_a_fleet_that_grows_keeps_each_nodes_team(sample):
    whole = fleet.fleet_nodes(sample, range(1, 8))
    assert fleet.fleet_nodes(sample, [6, 7]) == whole[5:]


def test_without_teams_the_nodes_are_shared_and_still_wait_for_the_preflight(loaded):
    (node,) = fleet.fleet_nodes(loaded, [3])
    assert nodes.TEAM_LABEL_KEY not in node["metadata"]["labels"]
    assert [kubelet_form(taint) for taint in node["spec"]["taints"]] == [nodes.PREFLIGHT_TAINT]


def test_an_inventory_without_a_gpu_worker_has_nothing_to_simulate(small_cluster, load_small):
    del small_cluster["hosts"]["gpu-1"]
    with pytest.raises(LabInvalid, match="gpu_worker"):
        fleet.fleet_nodes(load_small(), [1])


def test_the_played_pods_addresses_stay_clear_of_the_real_nodes_blocks(sample):
    pods = sample.cluster.networks.pod
    cidr = fleet.pod_cidr(sample)
    assert cidr.subnet_of(pods) and cidr.prefixlen == 16
    assert ipaddress.ip_network(f"{pods.network_address}/24") != cidr
    assert cidr.broadcast_address == pods.broadcast_address


def test_the_status_heartbeat_follows_kubelets_report_frequency():
    heartbeat = {
        "metadata": {"name": fleet.HEARTBEAT_STAGE},
        "spec": {"delay": {"durationMilliseconds": 600000}, "next": {"statusTemplate": "x"}},
    }
    changed = fleet.at_kubelet_cadence(heartbeat)
    assert changed["spec"]["delay"]["durationMilliseconds"] == 300000  # kubelet's 5 min
    assert changed["spec"]["next"] == heartbeat["spec"]["next"]
    other = {"metadata": {"name": "pod-ready"}, "spec": {}}
    assert fleet.at_kubelet_cadence(other) is other


def test_kwok_renews_leases_at_kubelets_cadence_and_manages_only_its_nodes(tmp_path):
    argv = fleet.controller_argv(
        tmp_path / "kwok", tmp_path / "c.yaml", tmp_path / "a", "10.0.0.0/16"
    )
    assert "--node-lease-duration-seconds=40" in argv  # renewed every 10 s, as kubelet does
    assert "--manage-all-nodes=false" in argv
    assert f"--manage-nodes-with-annotation-selector={fleet.MANAGED_KEY}=fake" in argv


def test_kwoks_workers_keep_up_with_the_largest_fleets_lease_renewals():
    document = fleet.configuration_document()
    assert document["kind"] == "KwokConfiguration"
    assert document["apiVersion"] == "config.kwok.x-k8s.io/v1alpha1"
    workers = document["options"]["nodeLeaseParallelism"]
    renewals_per_s = 7500 / (fleet.LEASE_DURATION_S / 4)  # kubelet renews at a quarter
    # A renewal may take 50 ms at 7,500 nodes; kwok's default of 4 workers allows 5 ms.
    assert workers / renewals_per_s >= 0.05


def test_lab_down_stops_the_labs_kwok_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet.naming, "LABS_DIR", tmp_path)
    assert fleet.stop_controller("demo") is False  # none started
    folder = fleet.fleet_dir("demo")
    folder.mkdir(parents=True)
    # A stand-in with the fleet folder on its command line, as kwok's --config puts it there.
    stand_in = ["-c", "import time; time.sleep(60)", str(folder / "kwok.yaml")]
    child = subprocess.Popen([sys.executable, *stand_in])
    (folder / "kwok.pid").write_text(f"{child.pid}\n")
    try:
        deadline = time.monotonic() + 10
        while fleet.controller_pid("demo") is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child's command line is readable
        assert fleet.controller_pid("other") is None
        assert fleet.stop_controller("demo") is True
        assert child.wait(timeout=10) is not None
    finally:
        child.kill()


def test_a_cluster_not_applied_yet_has_no_kubeconfig_to_reach(loaded):
    with pytest.raises(LabInvalid, match="apply the lab's inventory first"):
        fleet.kubeconfig(loaded)
    admin = loaded.state_dir / "kubernetes" / "admin.conf"
    admin.parent.mkdir(parents=True)
    admin.write_text("apiVersion: v1\n")
    assert fleet.kubeconfig(loaded) == admin


def test_the_ready_deadline_starts_once_the_last_node_is_created(sample, monkeypatch):
    """A slow creation (2,500 nodes took 290 s on 2 cores) does not eat the nodes' time to get
    Ready: the wait gets READY_TIMEOUT_S from the end of the creation, not from its start."""
    clock = [1000.0]
    monkeypatch.setattr(fleet.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(fleet, "lab_cluster", lambda name: sample)
    monkeypatch.setattr(fleet, "start_controller", lambda name, loaded: 4242)
    monkeypatch.setattr(fleet, "simulated_nodes", lambda loaded: {})

    def create(loaded, items):
        clock[0] += 700.0  # longer than the whole timeout

    deadlines = []
    monkeypatch.setattr(fleet, "create", create)
    monkeypatch.setattr(
        fleet, "_wait_ready", lambda name, loaded, count, deadline: deadlines.append(deadline)
    )
    result = fleet.scale("bench", 3)
    assert deadlines == [1700.0 + fleet.READY_TIMEOUT_S]
    assert (result.created, result.create_seconds) == (3, 700.0)
