"""The container_runtime role offline: which hosts get it, what each source installs, and
that containerd's TOML and Docker's JSON carry the settings kubelet depends on."""

from __future__ import annotations

import functools
import json
import tomllib

import pytest
from typer.testing import CliRunner

from cli.main import app
from engine.context import host_contexts, host_files, load
from roles.container_runtime.files import runtime_packages
from roles.container_runtime.operations import (
    ContainerdVersion,
    containerd_binaries,
    containerd_tarball_url,
)
from tests.helpers import files_of as shared_files_of
from tests.unit.conftest import SAMPLE
from tests.unit.fake_host import commands
from toolkit.aptkeys import KeyFingerprints, fetch_key_commands

runner = CliRunner()


files_of = functools.partial(shared_files_of, role="container_runtime")


def test_only_kubernetes_nodes_get_a_runtime():
    loaded = load(SAMPLE)
    with_runtime = {ctx.name for ctx in host_contexts(loaded) if files_of(loaded, ctx.name)}
    nodes = {
        name
        for name, host in loaded.cluster.hosts.items()
        if {"control_plane", "gpu_worker", "cpu_worker"} & set(host.groups)
    }
    assert with_runtime == nodes
    assert not files_of(loaded, "etcd-1")


def test_containerd_uses_systemd_cgroups_and_the_pinned_pause_image():
    config = tomllib.loads(files_of(load(SAMPLE), "gpu-1")["/etc/containerd/config.toml"])
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert config["version"] == 2
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.10.1"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"]["SystemdCgroup"] is True
    assert "restrict_oom_score_adj" not in cri  # root may lower a container's OOM score


def test_a_cgroup_v1_host_without_cap_sys_resource_gets_cgroupfs_and_clamped_oom_scores(
    small_cluster, load_small
):
    """The lab's settings: runc manages the cgroups itself and never lowers oom_score_adj."""
    small_cluster["group_vars"] = {
        "all": {
            "container_runtime": {"cgroup_driver": "cgroupfs", "restrict_oom_score_adj": True},
            "kubernetes": {"cgroup_driver": "cgroupfs"},  # kubelet's must match (checked)
        }
    }
    loaded = load_small()
    node = next(n for n, h in loaded.cluster.hosts.items() if "cpu_worker" in h.groups)
    cri = tomllib.loads(files_of(loaded, node)["/etc/containerd/config.toml"])["plugins"][
        "io.containerd.grpc.v1.cri"
    ]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False


def test_docker_rotates_logs_restores_live_and_uses_systemd_cgroups():
    daemon = json.loads(files_of(load(SAMPLE), "gpu-1")["/etc/docker/daemon.json"])
    assert daemon["exec-opts"] == ["native.cgroupdriver=systemd"]
    assert daemon["live-restore"] is True
    assert daemon["log-driver"] == "json-file"
    assert daemon["log-opts"] == {"max-size": "100m", "max-file": "5"}
    assert daemon["data-root"] == "/var/lib/docker"


def test_mirrors_and_data_root_come_from_the_inventory(small_cluster, load_small):
    small_cluster["group_vars"] = {
        "all": {
            "container_runtime": {
                "registry_mirrors": {
                    "docker.io": ["https://mirror.example:5000"],
                    "registry.k8s.io": ["https://k8s-mirror.example"],
                },
                "data_root": "/data/docker",
            }
        }
    }
    files = files_of(load_small(), "cpu-1")
    config = tomllib.loads(files["/etc/containerd/config.toml"])
    mirrors = config["plugins"]["io.containerd.grpc.v1.cri"]["registry"]["mirrors"]
    assert mirrors["docker.io"]["endpoint"] == ["https://mirror.example:5000"]
    assert mirrors["registry.k8s.io"]["endpoint"] == ["https://k8s-mirror.example"]
    daemon = json.loads(files["/etc/docker/daemon.json"])
    assert daemon["registry-mirrors"] == ["https://mirror.example:5000"]
    assert daemon["data-root"] == "/data/docker"


def test_docker_source_on_ubuntu_pins_dockers_packages_and_key():
    files = files_of(load(SAMPLE), "cpu-1")
    sources = files["/etc/apt/sources.list.d/docker.sources"]
    assert "URIs: https://download.docker.com/linux/ubuntu" in sources
    assert "Suites: jammy" in sources
    assert "Signed-By: /etc/apt/keyrings/docker.asc" in sources
    assert "Enabled: yes" in sources
    pins = files["/etc/apt/preferences.d/gpuinfra-container-runtime"]
    assert "Package: docker-ce\nPin: version 5:26.1.5*\nPin-Priority: 1001" in pins
    assert "Package: containerd.io\nPin: version 2.2.9*" in pins  # the sample's versions


def test_distribution_source_on_debian_13_uses_debians_packages(small_cluster, load_small):
    small_cluster["group_vars"] = {"all": {"container_runtime": {"source": "distribution"}}}
    # Debian 13's containerd, pinned as the lab pins it (the default is containerd 2).
    small_cluster["versions"] = {**small_cluster.get("versions", {}), "containerd": "1.7.24"}
    files = files_of(load_small(), "cpu-1")
    assert "Enabled: no" in files["/etc/apt/sources.list.d/docker.sources"]
    pins = files["/etc/apt/preferences.d/gpuinfra-container-runtime"]
    for package, version in [
        ("docker.io", "26.1.5"),
        ("docker-cli", "26.1.5"),
        ("containerd", "1.7.24"),
    ]:
        assert f"Package: {package}\nPin: version {version}*" in pins
    assert set(runtime_packages("distribution", "ubuntu-24.04")) == {"docker.io", "containerd"}


def test_the_key_is_checked_against_its_fingerprint_before_it_is_moved_in():
    commands = fetch_key_commands("https://x/gpg", "ABCD", "/etc/apt/keyrings/docker.asc")
    check = next(i for i, c in enumerate(commands) if "grep -qix ABCD" in c)
    move = next(i for i, c in enumerate(commands) if c.endswith("/etc/apt/keyrings/docker.asc"))
    assert check < move
    assert "rm -f /etc/apt/keyrings/docker.asc.new" in commands[check]
    assert KeyFingerprints().process(["9dc858229fc7dd38854ae2d88d81803c0ebfcd88"]) == [
        "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
    ]


def test_config_files_are_validated_before_they_go_live():
    ctx = next(c for c in host_contexts(load(SAMPLE)) if c.name == "cpu-1")
    checks = {f.path: f.check for f in host_files(ctx) if f.role == "container_runtime"}
    assert checks["/etc/docker/daemon.json"] == "dockerd --validate --config-file {path}"
    assert "containerd --config {path} config dump" in checks["/etc/containerd/config.toml"]


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ({"source": "snap"}, "group_vars.all.container_runtime.source"),
        ({"log_max_files": 3}, "group_vars.all.container_runtime.log_max_files: unknown key"),
    ],
)
def test_bad_runtime_settings_name_the_key(small_cluster, write_cluster, setting, key):
    small_cluster["group_vars"] = {"all": {"container_runtime": setting}}
    result = runner.invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert key in result.stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"registry_mirrors": {"docker.io": ["::bad"]}}, "not an http(s) URL"),
        ({"log_max_size": "lots"}, "log_max_size"),
        ({"data_root": "relative/docker"}, "data_root"),
    ],
)
def test_values_dockerd_validate_lets_through_are_refused(
    small_cluster, write_cluster, setting, message
):
    """`dockerd --validate` (Docker 26) checks only the JSON's types; these would pass it and
    then keep dockerd from starting."""
    small_cluster["hosts"]["cpu-1"]["vars"] = {"container_runtime": setting}
    result = runner.invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert message in result.stderr


PIN = "a" * 64


def binaries_cluster(small_cluster, write_cluster, **settings):
    small_cluster["versions"] = {**small_cluster.get("versions", {}), "containerd": "2.2.9"}
    small_cluster["group_vars"] = {
        "all": {"container_runtime": {"source": "binaries", "containerd_sha256": PIN, **settings}}
    }
    return load(write_cluster(small_cluster))


def test_binaries_source_installs_containerd_with_its_own_unit_and_no_docker(
    small_cluster, write_cluster
):
    files = files_of(binaries_cluster(small_cluster, write_cluster), "cpu-1")
    assert "/etc/docker/daemon.json" not in files
    unit = files["/etc/systemd/system/containerd.service"]
    assert "ExecStart=/usr/local/bin/containerd\n" in unit
    assert "Delegate=yes" in unit and "KillMode=process" in unit
    assert "After=network.target" in unit
    assert "Package:" not in files["/etc/apt/preferences.d/gpuinfra-container-runtime"]
    assert "Enabled: no" in files["/etc/apt/sources.list.d/docker.sources"]
    assert runtime_packages("binaries", "debian-13") == {}


def test_binaries_source_needs_the_tarballs_pin(small_cluster, write_cluster):
    small_cluster["group_vars"] = {"all": {"container_runtime": {"source": "binaries"}}}
    result = runner.invoke(app, ["inventory", "validate", str(write_cluster(small_cluster))])
    assert result.exit_code == 2
    assert "containerd_sha256" in result.stderr


def test_containerd_tarball_is_checked_before_it_is_unpacked():
    url = containerd_tarball_url("http://files:3144/containerd/", "2.2.9")
    assert url == "http://files:3144/containerd/v2.2.9/containerd-2.2.9-linux-amd64.tar.gz"
    found, _ = commands(
        containerd_binaries, {ContainerdVersion: "1.7.24"}, url=url, version="2.2.9", sha256=PIN
    )
    check = next(i for i, c in enumerate(found) if "sha256sum -c" in c)
    unpack = next(i for i, c in enumerate(found) if c.startswith("tar -xzf"))
    assert check < unpack and PIN in found[check]
    assert "bin/containerd-shim-runc-v2" in found[unpack]
    same, _ = commands(
        containerd_binaries, {ContainerdVersion: "2.2.9"}, url=url, version="2.2.9", sha256=PIN
    )
    assert same == []


def test_containerd_version_fact_reads_the_release_version():
    line = "containerd github.com/containerd/containerd/v2 v2.2.9 0123abc"
    assert ContainerdVersion().process([line]) == "2.2.9"
    assert ContainerdVersion().process([]) == ""
