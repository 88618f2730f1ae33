"""The fabric role offline: rendered files from the sample (the reference server's two HDR
ports), the GPUDirect RDMA decision the kernel role follows, the firewall rule, inventory
errors, the device check against fake facts, and the diagnostics' recorded outputs (written
from documentation: tests/unit/recordings/fabric/README.md)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from engine.context import host_context, load
from inventory.errors import InventoryInvalid
from roles.fabric import operations as fabric_ops
from roles.fabric.facts import FabricPorts
from roles.fabric.ibtools import parse_ibstat, parse_ibv_devinfo, port_problems
from roles.firewall.files import render_table
from tests.helpers import files_of as shared_files_of
from tests.unit.conftest import SAMPLE
from tests.unit.fake_host import commands
from toolkit import record
from toolkit.dropins import MARKER

RECORDINGS = Path(__file__).parent / "recordings" / "fabric"
files_of = functools.partial(shared_files_of, role="fabric")
PORT0 = {"device": "mlx5_0", "port": 1, "interface": "ib0", "address": "10.1.0.61/24"}
PORT1 = {"device": "mlx5_1", "port": 1, "interface": "ib1", "address": "10.2.0.61/24"}


def recording(name: str) -> str:
    return (RECORDINGS / name).read_text()


def modules(loaded, host: str) -> list[str]:
    return shared_files_of(loaded, host)["/etc/modules-load.d/gpuinfra.conf"].splitlines()


@pytest.fixture(scope="module")
def sample():
    return load(SAMPLE)


def test_sample_gpu_worker_has_two_hdr_ports_with_ipoib_addresses(sample):
    files = files_of(sample, "gpu-3")
    first = files["/etc/systemd/network/60-gpuinfra-fabric0.network"]
    second = files["/etc/systemd/network/60-gpuinfra-fabric1.network"]
    assert "Name=ib0\n" in first and "Address=10.50.10.13/16\n" in first
    assert "Name=ib1\n" in second and "Address=10.51.10.13/16\n" in second
    assert "mlx5_1 port 1 (IPoIB)" in second


def test_nccl_conf_names_both_hcas_exactly_and_the_ipoib_interface(sample):
    nccl = files_of(sample, "gpu-1")["/etc/nccl.conf"]
    settings = [line for line in nccl.splitlines() if not line.startswith("#")]
    assert settings == ["NCCL_IB_HCA==mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME==ib0"]


def test_nccl_conf_comments_hold_no_equals_sign(sample):
    # NCCL's reader takes any line with "=" as a variable, comment or not.
    comments = [
        line for line in files_of(sample, "gpu-1")["/etc/nccl.conf"].splitlines() if "#" in line
    ]
    assert comments and not [line for line in comments if "=" in line]


def test_roce_sets_the_gid_index_and_extras(small_cluster, load_small):
    small_cluster["hosts"]["gpu-1"]["vars"] = {
        "fabric": {
            "ports": [PORT0],
            "link_layer": "ethernet",
            "nccl_extra": {"NCCL_IB_TIMEOUT": "22"},
        }
    }
    nccl = files_of(load_small(), "gpu-1")["/etc/nccl.conf"]
    assert "\nNCCL_IB_GID_INDEX=3\n" in nccl
    assert nccl.endswith("NCCL_IB_TIMEOUT=22\n")
    assert (
        "(RoCE)"
        in files_of(load_small(), "gpu-1")["/etc/systemd/network/60-gpuinfra-fabric0.network"]
    )


def test_infiniband_sets_no_gid_index(sample):
    assert "GID_INDEX" not in files_of(sample, "gpu-1")["/etc/nccl.conf"]


def test_memlock_for_sessions_and_both_runtimes(sample, small_cluster, load_small):
    files = files_of(sample, "gpu-1")
    limits = files["/etc/security/limits.d/91-gpuinfra-fabric.conf"]
    for who in ("*", "root"):
        assert f"{who} hard memlock unlimited" in limits
    for unit in ("containerd", "docker"):
        assert (
            "LimitMEMLOCK=infinity"
            in files[f"/etc/systemd/system/{unit}.service.d/50-gpuinfra-fabric.conf"]
        )
    small_cluster["hosts"]["gpu-1"]["vars"] = {"fabric": {"memlock": "67108864"}}
    files = files_of(load_small(), "gpu-1")
    assert (
        "LimitMEMLOCK=67108864K"
        in files["/etc/systemd/system/containerd.service.d/50-gpuinfra-fabric.conf"]
    )


def test_every_file_in_a_shared_folder_carries_the_marker(sample):
    for path, content in files_of(sample, "gpu-1").items():
        assert MARKER in "".join(content.splitlines(keepends=True)[:3]), path


def test_packages_are_pinned_per_os(sample, loaded):
    pins = files_of(sample, "gpu-1")["/etc/apt/preferences.d/gpuinfra-fabric"]
    assert "Package: rdma-core\nPin: version 39.0-1\n" in pins  # the sample is Ubuntu 22.04
    debian = files_of(loaded, "gpu-1")
    prefs = debian["/etc/apt/preferences.d/gpuinfra-fabric"]
    assert "Package: perftest\nPin: version 25.01.0+0.80-1\n" in prefs
    assert "Package: infiniband-diags\nPin: version 56.1-1\n" in prefs


def test_fabric_role_runs_on_gpu_workers_only(sample):
    assert files_of(sample, "cpu-1") == {}
    assert files_of(sample, "etcd-1") == {}


def test_gpudirect_rdma_follows_the_fabric_settings(small_cluster, load_small):
    loaded = load_small()
    assert "nvidia-peermem" not in modules(loaded, "gpu-1")  # no fabric ports: nothing to do
    small_cluster["hosts"]["gpu-1"]["vars"] = {"fabric": {"ports": [PORT0]}}
    assert "nvidia-peermem" in modules(load_small(), "gpu-1")
    small_cluster["hosts"]["gpu-1"]["vars"] = {
        "fabric": {"ports": [PORT0], "gpudirect_rdma": False}
    }
    assert "nvidia-peermem" not in modules(load_small(), "gpu-1")
    small_cluster["group_vars"] = {"all": {"fabric": {"gpudirect_rdma": True}}}
    small_cluster["hosts"]["gpu-1"]["vars"] = {}
    loaded = load_small()
    assert "nvidia-peermem" in modules(loaded, "gpu-1")
    assert "nvidia-peermem" not in modules(loaded, "cpu-1")  # a GPU module, GPU workers only


def test_firewall_admits_tcp_from_fabric_peers_on_gpu_workers(sample, loaded):
    table = render_table(host_context(sample, "gpu-1"))
    line = next(line for line in table.splitlines() if "fabric peers" in line)
    assert "10.50.10.18" in line and "10.51.10.11" in line and "ip protocol tcp" in line
    assert "fabric peers" not in render_table(host_context(sample, "cpu-1"))
    # Control: no ports declared anywhere, no rule at all.
    assert "fabric peers" not in render_table(host_context(loaded, "gpu-1"))


def test_fewer_ports_than_another_host_writes_fewer_files(small_cluster, load_small):
    small_cluster["hosts"]["gpu-2"] = {
        "address": "10.0.0.62",
        "groups": ["gpu_worker"],
        "gpu": {"model": "H100-SXM5-80GB", "count": 8},
        "vars": {"fabric": {"ports": [PORT0 | {"address": "10.1.0.62/24"}]}},
    }
    small_cluster["hosts"]["gpu-1"]["vars"] = {"fabric": {"ports": [PORT0, PORT1]}}
    loaded = load_small()
    from roles.fabric.files import port_slots

    assert port_slots(host_context(loaded, "gpu-2")) == 2  # gpu-2 removes slot 1's file
    assert "/etc/systemd/network/60-gpuinfra-fabric1.network" not in files_of(loaded, "gpu-2")


@pytest.mark.parametrize(
    ("fabric", "key", "message"),
    [
        ({"ports": [PORT0, PORT0 | {"interface": "ib1"}]}, "fabric", "same device and port"),
        ({"ports": [PORT0, PORT1 | {"interface": "ib0"}]}, "fabric", "same interface"),
        ({"ports": [PORT0 | {"address": "10.1.0.61"}]}, "address", "needs its prefix"),
        ({"rate": 200}, "fabric.rate", "unknown key"),
        ({"nccl_extra": {"FOO": "1"}}, "fabric", "not an NCCL_ variable"),
        ({"memlock": "64G"}, "fabric.memlock", ""),
    ],
)
def test_bad_fabric_settings_name_the_host_and_key(small_cluster, load_small, fabric, key, message):
    small_cluster["hosts"]["gpu-1"]["vars"] = {"fabric": fabric}
    with pytest.raises(InventoryInvalid) as error:
        load_small()
    text = str(error.value)
    assert "hosts.gpu-1.vars.fabric" in text and key in text and message in text


def test_an_address_on_two_hosts_is_refused(small_cluster, load_small):
    small_cluster["hosts"]["gpu-2"] = {
        "address": "10.0.0.62",
        "groups": ["gpu_worker"],
        "gpu": {"model": "H100-SXM5-80GB", "count": 8},
        "vars": {"fabric": {"ports": [PORT0]}},
    }
    small_cluster["hosts"]["gpu-1"]["vars"] = {"fabric": {"ports": [PORT0]}}
    with pytest.raises(InventoryInvalid, match=r"gpu-2.*10\.1\.0\.61 is also gpu-1 ib0's"):
        load_small()


def test_an_os_without_pins_needs_package_versions(small_cluster, load_small):
    small_cluster["os"] = "debian-12"
    with pytest.raises(InventoryInvalid, match="no pinned version on debian-12"):
        load_small()
    small_cluster["group_vars"] = {
        "gpu_worker": {
            "fabric": {
                "package_versions": {
                    name: "44.0-2"
                    for name in ("rdma-core", "ibverbs-utils", "infiniband-diags", "perftest")
                }
            }
        }
    }
    load_small()  # pinned by the site: accepted


def test_cli_validate_exits_2_on_a_bad_fabric_key(small_cluster, write_cluster):
    small_cluster["hosts"]["gpu-1"]["vars"] = {"fabric": {"ports": [PORT0 | {"speed": 1}]}}
    result = CliRunner().invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert "hosts.gpu-1.vars.fabric.ports.0.speed" in result.output


PORTS = (("mlx5_0", 1), ("mlx5_1", 1))


def test_present_ports_need_nothing():
    found = {PORTS[0]: True, PORTS[1]: True}
    assert commands(fabric_ops.ports_present, {FabricPorts: found}, ports=PORTS, standin=False) == (
        [],
        [],
    )


def test_a_missing_hca_fails_the_apply_naming_it():
    found = {PORTS[0]: True, PORTS[1]: False}
    done, notes = commands(
        fabric_ops.ports_present, {FabricPorts: found}, ports=PORTS, standin=False
    )
    assert len(done) == 1 and done[0].endswith("exit 1")
    assert "mlx5_1 port 1 not found" in done[0] and "mlx5_0" not in done[0]
    assert notes == []


def test_a_declared_stand_in_gets_a_note_instead():
    found = {PORTS[0]: False, PORTS[1]: False}
    with record.recording() as run:  # its own record: the note goes into the run report
        done, notes = commands(
            fabric_ops.ports_present, {FabricPorts: found}, ports=PORTS, standin=True
        )
    assert done == []
    assert len(notes) == 1 and "stand-in host" in notes[0] and "mlx5_0 port 1" in notes[0]
    assert list(run.host("fake-host").notes) == notes


def test_no_ports_asks_nothing():
    assert commands(fabric_ops.ports_present, {}, ports=(), standin=False) == ([], [])


def test_fabric_ports_fact():
    fact = FabricPorts()
    command = fact.command(PORTS)
    assert "/sys/class/infiniband/mlx5_1/ports/1" in command
    assert fact.process(["mlx5_0 1 present", "mlx5_1 1 missing"]) == {
        ("mlx5_0", 1): True,
        ("mlx5_1", 1): False,
    }


def test_ibstat_of_the_reference_server_is_all_active_at_hdr():
    ports = parse_ibstat(recording("ibstat-hdr-two-ports.txt"))
    assert set(ports) == set(PORTS)
    for device, port in PORTS:
        status = ports[(device, port)]
        assert status.active and status.rate_gbps == 200 and status.link_layer == "InfiniBand"
        assert port_problems(status, device, port, 200, "infiniband") == []


def test_ibstat_with_a_port_down_and_one_trained_low():
    ports = parse_ibstat(recording("ibstat-one-port-down.txt"))
    low = port_problems(ports[PORTS[0]], "mlx5_0", 1, 200, "infiniband")
    assert low == ["mlx5_0 port 1: rate 100 Gb/s, expected 200"]
    down = port_problems(ports[PORTS[1]], "mlx5_1", 1, 200, "infiniband")
    assert "mlx5_1 port 1: state Down, physical state Polling, not Active" in down
    assert port_problems(None, "mlx5_2", 1, 200, "infiniband") == [
        "mlx5_2 port 1: not reported (no such device or port)"
    ]


def test_ibstat_of_roce_says_ethernet():
    status = parse_ibstat(recording("ibstat-roce.txt"))[("mlx5_0", 1)]
    assert port_problems(status, "mlx5_0", 1, 200, "ethernet") == []
    assert port_problems(status, "mlx5_0", 1, 200, "infiniband") == [
        "mlx5_0 port 1: link layer Ethernet, expected InfiniBand"
    ]


def test_ibv_devinfo_states_and_link_layers():
    ports = parse_ibv_devinfo(recording("ibv_devinfo-hdr-two-ports.txt"))
    assert set(ports) == set(PORTS)
    assert all(s.active and s.link_layer == "InfiniBand" for s in ports.values())
    assert all(s.rate_gbps is None for s in ports.values())  # no rate without -v
    down = parse_ibv_devinfo(recording("ibv_devinfo-one-port-down.txt"))
    assert down[PORTS[0]].active and down[PORTS[1]].state == "Down"
    assert port_problems(down[PORTS[1]], "mlx5_1", 1, 200, "infiniband") == [
        "mlx5_1 port 1: state Down, not Active"
    ]
