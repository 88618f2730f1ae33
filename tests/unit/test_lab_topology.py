"""Lab topologies become cluster inventories that load and validate like any operator's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from engine.context import load
from lab import lifecycle, naming, offline
from lab.errors import LabInvalid
from lab.inventory import GPU_COMMENT, inventory_data, render_inventory, write_inventory
from lab.state import LabState, read_state, recorded_labs
from lab.topology import (
    DISK_DEVICE,
    Topology,
    default_topology,
    generic_topology,
    named_topology,
    parse_disks,
    parse_size,
    scale_topology,
)


@pytest.fixture
def labs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Labs in a temporary folder, with the private key the inventory must point at (0600)."""
    folder = tmp_path / "labs"
    monkeypatch.setattr(naming, "LABS_DIR", folder)
    # What this machine's `lab up` published must not leak into the inventories here.
    monkeypatch.setattr(offline, "RUN_DIR", tmp_path / "offline")
    return folder


def lab_state(labs_dir: Path, name: str, topology: Topology, slot: int = 2) -> LabState:
    state = LabState(name, slot, topology, labs_dir.parent / "inventory" / name / "cluster.yml")
    state.private_key.parent.mkdir(parents=True, exist_ok=True)
    state.private_key.write_text("not a real key\n")
    state.private_key.chmod(0o600)
    return state


def test_default_topology_has_every_group() -> None:
    topology = default_topology()
    groups = [group for host in topology.hosts for group in host.groups]
    assert groups.count("etcd") == 5
    assert groups.count("control_plane") == 3
    for group in ("loadbalancer", "monitoring", "cpu_worker", "gpu_worker"):
        assert groups.count(group) == 1
    # A DNS primary and a secondary (mon-1 doubles as the secondary: no extra host).
    assert [host.name for host in topology.hosts if "dns" in host.groups] == ["dns-1", "mon-1"]
    # etcd disks only on request; gpu-1 has its data disk (the data_disks role's volume), each
    # storage host its OSD's disk.
    storage = ["stor-1", "stor-2", "stor-3"]
    assert [host.name for host in topology.hosts if "storage" in host.groups] == storage
    assert [host.name for host in topology.hosts if host.disk_bytes] == ["gpu-1", *storage]


def test_default_inventory_loads_and_validates(labs_dir: Path) -> None:
    state = lab_state(labs_dir, "lab", default_topology())
    path = write_inventory(state, state.inventory_path)
    loaded = load(path)
    cluster = loaded.cluster
    assert cluster.os == "debian-13"
    assert str(cluster.networks.node) == "198.18.8.0/22"
    assert cluster.in_group("etcd") == [f"etcd-{i}" for i in range(1, 6)]
    assert cluster.hosts["gpu-1"].gpu is not None
    assert cluster.api.vip is None  # one load balancer: no virtual address needed
    # The controller connects from the bridge's gateway: the firewall must admit it.
    assert [str(net) for net in cluster.networks.admin] == ["198.18.8.1/32"]
    # Absolute paths: the inventory works from any working directory.
    assert cluster.ssh.key == state.private_key and cluster.ssh.key.is_absolute()
    assert cluster.ssh.known_hosts == state.known_hosts and cluster.ssh.known_hosts.is_absolute()
    assert {str(host.address) for host in cluster.hosts.values()} == {
        f"198.18.8.{10 + i}" for i in range(len(state.topology.hosts))
    }


def test_gpu_spec_is_explained_in_a_comment(labs_dir: Path) -> None:
    text = render_inventory(lab_state(labs_dir, "lab", default_topology()))
    lines = text.splitlines()
    gpu_line = next(i for i, line in enumerate(lines) if line.strip().startswith("gpu:"))
    assert lines[gpu_line - 1].strip() == GPU_COMMENT
    assert yaml.safe_load(text)["hosts"]["gpu-1"]["gpu"]["count"] >= 1


def test_etcd_disk_is_recorded_only_for_etcd_hosts(labs_dir: Path) -> None:
    topology = default_topology().with_disks({"etcd-1": 2**30, "cpu-1": 2**30})
    state = lab_state(labs_dir, "lab", topology)
    cluster = load(write_inventory(state, state.inventory_path)).cluster
    assert cluster.hosts["etcd-1"].etcd is not None
    assert cluster.hosts["etcd-1"].etcd.disk == DISK_DEVICE
    assert cluster.hosts["etcd-2"].etcd is None
    assert cluster.hosts["cpu-1"].etcd is None  # the disk exists, but etcd settings cannot


def test_scale_topology_is_ha_and_loads(labs_dir: Path) -> None:
    state = lab_state(labs_dir, "scale", scale_topology())
    cluster = load(write_inventory(state, state.inventory_path)).cluster
    assert len(cluster.hosts) == 100
    assert len(cluster.in_group("loadbalancer")) == 2
    assert cluster.api.vip is not None and cluster.api.vip in cluster.networks.node


@pytest.mark.parametrize("count", [1, 100, 200])
def test_generic_hosts_load(labs_dir: Path, count: int) -> None:
    state = lab_state(labs_dir, "many", generic_topology(count))
    cluster = load(write_inventory(state, state.inventory_path)).cluster
    assert len(cluster.hosts) == count
    assert cluster.in_group("cpu_worker") == list(cluster.hosts)


def test_generic_needs_a_host() -> None:
    with pytest.raises(LabInvalid):
        generic_topology(0)


def test_unknown_topology_and_disk_host_are_refused() -> None:
    with pytest.raises(LabInvalid, match="unknown topology"):
        named_topology("huge")
    with pytest.raises(LabInvalid, match="not in the lab"):
        default_topology().with_disks({"etcd-9": 2**30})


@pytest.mark.parametrize(
    ("text", "size"), [("512M", 512 * 2**20), ("2G", 2 * 2**30), ("1GiB", 2**30), ("4096K", 2**22)]
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "2X", "-1G", "1.5G", "100"])
def test_parse_size_refuses_nonsense(text: str) -> None:
    with pytest.raises(LabInvalid):
        parse_size(text)


def test_parse_disks() -> None:
    assert parse_disks(["etcd-1=1G", "etcd-2=2G"]) == {"etcd-1": 2**30, "etcd-2": 2 * 2**30}
    with pytest.raises(LabInvalid, match="HOST=SIZE"):
        parse_disks(["etcd-1"])


def test_state_round_trips_through_json(labs_dir: Path) -> None:
    state = lab_state(labs_dir, "lab", default_topology().with_disks({"etcd-3": 2**30}))
    assert LabState.from_json(state.to_json()) == state


def test_inventory_data_uses_the_lab_domain(labs_dir: Path) -> None:
    data = inventory_data(lab_state(labs_dir, "itest", default_topology()))
    assert data["domain"] == "itest.gpuinfra.test"
    assert data["name"] == "itest"


def test_labs_get_distinct_subnets_and_keep_theirs(
    labs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slot 0 is taken by something on the machine (a lab bridge or address): it is skipped.
    monkeypatch.setattr(lifecycle, "_used_slots", lambda: {0} | {s.slot for s in recorded_labs()})
    first = lifecycle._resolve_state("one", default_topology(), None)
    second = lifecycle._resolve_state("two", generic_topology(3), None)
    assert (first.slot, second.slot) == (1, 2)
    assert not first.subnet.overlaps(second.subnet)
    assert read_state("one") == first  # recorded at once, so a third lab sees both taken
    # Resuming keeps the slot; asking for other hosts is refused instead of silently changed.
    assert lifecycle._resolve_state("one", None, None).slot == 1
    with pytest.raises(LabInvalid, match="already up with other hosts"):
        lifecycle._resolve_state("one", generic_topology(2), None)
    third = lifecycle._resolve_state("three", None, None)
    assert third.slot == 3 and third.topology == default_topology()


def test_lab_inventory_takes_the_container_runtime_from_debian(labs_dir: Path) -> None:
    """Docker's repository is out of reach from the lab: Debian's docker.io is used instead.
    Before the lab published a Kubernetes build, the kubernetes role stays off."""
    data = inventory_data(lab_state(labs_dir, "itest", default_topology()))
    assert data["group_vars"]["all"]["container_runtime"] == {"source": "distribution"}
    assert data["group_vars"]["all"]["kubernetes"] == {"enabled": False}
    assert data["group_vars"]["etcd"]["etcd"]["source"] == "distribution"


PUBLISHED = offline.Published(
    kubernetes_version="v1.35.4",
    coredns_version="v1.14.7",
    cni_plugins_version="1.10.0",
    pause_tag="3.10.1",
    etcd_version="3.6.16",
    etcd_sha256="e" * 64,
    sha256={"kubeadm": "a" * 64, "kubelet": "b" * 64, "kubectl": "c" * 64, "cni-plugins": "d" * 64},
    containerd_version="2.2.9",
    containerd_sha256="f" * 64,
    gpuinfra_image="gpuinfra/gpuinfra:0.1.0-0123456789ab",
)
NEWER = replace(
    PUBLISHED,
    kubernetes_version="v1.36.3",
    pause_tag="3.10.2",
    sha256={"kubeadm": "1" * 64, "kubelet": "2" * 64, "kubectl": "3" * 64, "cni-plugins": "d" * 64},
)


def test_a_lab_without_kubernetes_ignores_the_published_build(
    labs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lab booted with --no-kubernetes (the shared integration lab, the benchmarks' labs)
    keeps the role off and Debian's etcd even where this machine published a build."""
    monkeypatch.setattr(offline, "published", lambda version=None: PUBLISHED)
    monkeypatch.setattr(offline, "upgrades", lambda: [])
    state = replace(lab_state(labs_dir, "itest", default_topology()), kubernetes=False)
    data = inventory_data(state)
    assert data["group_vars"]["all"]["kubernetes"] == {"enabled": False}
    assert data["group_vars"]["etcd"]["etcd"]["source"] == "distribution"
    # Debian's packages, so Debian's versions: the defaults are the versions built here.
    assert data["versions"] == {"etcd": "3.5.16", "containerd": "1.7.24"}
    assert "gpu_health" not in data["group_vars"]["all"]
    # Positive control: the same lab with Kubernetes on takes the build.
    on = inventory_data(replace(state, kubernetes=True))
    assert on["group_vars"]["all"]["kubernetes"]["source"] == "binaries"


def test_a_lab_without_kubernetes_takes_the_etcd_build_when_its_topology_asks(
    labs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The etcd module's lab runs the sample's etcd line (the build) without Kubernetes; the
    rest stays as in a lab without it (Debian's containerd, the role off)."""
    monkeypatch.setattr(offline, "published", lambda version=None: PUBLISHED)
    monkeypatch.setattr(offline, "upgrades", lambda: [])
    asks = replace(default_topology(), etcd_build=True)
    state = replace(lab_state(labs_dir, "itest", asks), kubernetes=False)
    assert state.etcd_from_build and not state.runs_kubernetes_nodes
    data = inventory_data(state)
    etcd = data["group_vars"]["etcd"]["etcd"]
    assert (etcd["source"], etcd["sha256"]) == ("mirror", "e" * 64)
    assert etcd["mirror_url"] == f"http://{state.gateway}:{offline.FILES_PORT}/etcd"
    assert data["versions"] == {"etcd": "3.6.16", "containerd": "1.7.24"}
    assert data["group_vars"]["all"]["kubernetes"] == {"enabled": False}
    # The choice is recorded with the lab, so a kept lab keeps its line.
    assert Topology.from_json(asks.to_json()) == asks
    # A lab without etcd members serves no etcd, asked or not.
    workers = Topology(tuple(h for h in asks.hosts if "etcd" not in h.groups), etcd_build=True)
    assert not replace(state, topology=workers).etcd_from_build


def test_a_published_build_turns_kubernetes_on_from_the_labs_own_sources(
    labs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the machine's build published, the inventory installs it from the lab's file server
    and registry (the gateway), pinned by the published digests, and the lab's cgroup v1
    settings stay in the lab's inventory."""
    monkeypatch.setattr(offline, "published", lambda version=None: PUBLISHED)
    monkeypatch.setattr(offline, "upgrades", lambda: [NEWER])
    state = lab_state(labs_dir, "itest", default_topology())
    path = write_inventory(state, state.inventory_path)
    loaded = load(path)
    gateway = str(state.gateway)
    kube = yaml.safe_load(path.read_text())["group_vars"]["all"]["kubernetes"]
    assert kube["binaries_url"] == f"http://{gateway}:{offline.FILES_PORT}/kubernetes/release"
    assert kube["binary_sha256"] == PUBLISHED.sha256
    assert kube["cni"] == "routes" and kube["kube_proxy_mode"] == "nftables"
    assert kube["fail_cgroup_v1"] is False
    assert loaded.cluster.versions.kubernetes == "1.35.4"
    assert loaded.cluster.versions.etcd == "3.6.16"
    # The newer build is pinned too, for `kubernetes upgrade` (kubeadm, kubelet, kubectl).
    assert kube["release_sha256"] == {
        "1.36.3": {"kubeadm": "1" * 64, "kubelet": "2" * 64, "kubectl": "3" * 64}
    }
    runtime = yaml.safe_load(path.read_text())["group_vars"]["all"]["container_runtime"]
    # containerd 2, built here and pinned: Debian 13's 1.7 is too old for Kubernetes 1.36.
    assert loaded.cluster.versions.containerd == "2.2.9"
    assert (runtime["source"], runtime["containerd_sha256"]) == ("binaries", "f" * 64)
    assert runtime["containerd_url"] == f"http://{gateway}:{offline.FILES_PORT}/containerd"
    registry = f"http://{gateway}:{offline.REGISTRY_PORT}"
    assert runtime["registry_mirrors"] == {
        "registry.k8s.io": [registry],  # kubeadm's images, mirrored
        f"{gateway}:{offline.REGISTRY_PORT}": [registry],  # the lab's own test image, over HTTP
    }
    etcd = yaml.safe_load(path.read_text())["group_vars"]["etcd"]["etcd"]
    assert (etcd["source"], etcd["sha256"]) == ("mirror", "e" * 64)
    # The GPU health pods pull gpuinfra's own image from the lab's registry.
    assert loaded.cluster.group_vars["all"]["gpu_health"]["image"] == (
        f"{gateway}:{offline.REGISTRY_PORT}/gpuinfra/gpuinfra:0.1.0-0123456789ab"
    )


def test_the_gpuinfra_image_carries_the_controllers_runtime_dependencies() -> None:
    """Pinned at the versions this controller runs; rendering's schemas, Ansible import and
    testinfra stay out of the image."""
    from importlib import metadata

    wanted = offline._runtime_requirements()
    names = {requirement.split("==")[0].lower() for requirement in wanted}
    assert {"pydantic", "pyinfra", "typer", "nvidia-ml-py", "pyyaml"} <= names
    assert names.isdisjoint(offline.GPUINFRA_LEFT_OUT)
    assert f"pyinfra=={metadata.version('pyinfra')}" in wanted
    # The control: the left-out ones are gpuinfra dependencies, not names that never matched.
    declared = " ".join(metadata.requires("gpuinfra") or []).lower()
    assert all(name in declared for name in offline.GPUINFRA_LEFT_OUT)


def test_a_worker_disk_is_its_data_volume_by_stable_name(labs_dir: Path) -> None:
    state = lab_state(labs_dir, "lab", default_topology())
    cluster = load(write_inventory(state, state.inventory_path)).cluster
    (volume,) = cluster.hosts["gpu-1"].vars["data_disks"]["volumes"]
    assert volume == {
        "name": "data",
        "layout": "single",
        "disks": ["/dev/disk/by-id/virtio-gpuinfra-vdb"],
    }
    assert "fabric" in cluster.hosts["gpu-1"].vars  # beside the fabric stand-in, not over it
    assert "data_disks" not in cluster.hosts["cpu-1"].vars


def test_several_disks_per_host_survive_the_state_file() -> None:
    from lab.topology import HostSpec, disk_devices, disk_id

    spec = HostSpec("cpu-1", ("cpu_worker",), disk_bytes=2**29, extra_disks=(2**29, 2**30))
    assert spec.disk_sizes == (2**29, 2**29, 2**30)
    assert HostSpec.from_json(spec.to_json()) == spec
    old = {"name": "x", "groups": ["etcd"], "gpu": False, "disk_bytes": 2**30}
    assert HostSpec.from_json(old).extra_disks == ()  # a lab recorded before several disks
    assert HostSpec("x", ("etcd",), extra_disks=(2**29,)).disk_sizes == ()
    assert disk_devices(3) == ["/dev/vdb", "/dev/vdc", "/dev/vdd"]
    assert disk_id("/dev/vdc") == "/dev/disk/by-id/virtio-gpuinfra-vdc"


def test_lab_gpu_workers_declare_the_fabric_as_a_stand_in(labs_dir: Path) -> None:
    """Two HDR ports on every lab GPU worker, marked as a stand-in (no RDMA in the lab), their
    IPoIB addresses in the lab's own /22 but outside the hosts' first /24; the scale lab's 24
    GPU workers load and validate with them (addresses unique)."""
    import ipaddress

    state = lab_state(labs_dir, "itest", scale_topology())
    data = inventory_data(state)
    gpu = data["hosts"]["gpu-01"]
    fabric = gpu["vars"]["fabric"]
    assert fabric["device_standin"] is True
    assert [port["interface"] for port in fabric["ports"]] == ["ib0", "ib1"]
    hosts_net = ipaddress.IPv4Network(f"{state.subnet.network_address}/24")
    for port in fabric["ports"]:
        address = ipaddress.IPv4Interface(port["address"])
        assert address.ip in state.subnet and address.ip not in hosts_net
    assert "fabric" not in data["hosts"]["cpu-01"].get("vars", {})
    loaded = load(write_inventory(state, labs_dir.parent / "scale" / "cluster.yml"))
    assert loaded.settings["gpu-24"]["fabric"].wants_gpudirect_rdma
