"""The lab's Go builds and container hosts, offline: module pins, the build cache's key, a real
build of the smallest module, and the systemd-nspawn settings of a Kubernetes node."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab import gobuild, host
from lab.errors import LabError

KUBERNETES_GO_MOD = """\
module gpuinfra.local/build/kubernetes-9.9

go 1.25.0

require k8s.io/kubernetes v1.35.4

replace k8s.io/api => k8s.io/api v0.35.4

tool (
\tk8s.io/kubernetes/cmd/kubeadm
\tk8s.io/kubernetes/cmd/kubelet
)

tool k8s.io/kubernetes/cmd/kubectl
"""


def module_at(tmp_path: Path, text: str, name: str = "kubernetes-9.9") -> gobuild.GoModule:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "go.mod").write_text(text)
    (folder / "go.sum").write_text("k8s.io/kubernetes v1.35.4 h1:pinned=\n")
    return gobuild.GoModule(name, folder)


def test_the_tools_and_pins_come_from_go_mod(tmp_path):
    module = module_at(tmp_path, KUBERNETES_GO_MOD)
    assert module.tools() == [
        "k8s.io/kubernetes/cmd/kubeadm",
        "k8s.io/kubernetes/cmd/kubectl",
        "k8s.io/kubernetes/cmd/kubelet",
    ]
    assert module.requirement("k8s.io/kubernetes") == "v1.35.4"
    assert module.requirement("k8s.io/absent") is None
    # kubeadm picks the control plane's version from its own: it is stamped in.
    assert "-X k8s.io/component-base/version.gitVersion=v1.35.4" in module.ldflags()
    assert "-X k8s.io/component-base/version.gitMinor=35" in module.ldflags()


def test_the_cache_key_follows_the_pins_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(gobuild, "CACHE_DIR", tmp_path / "cache")
    module = module_at(tmp_path, KUBERNETES_GO_MOD)
    first = module.output
    assert first == module.output  # stable
    (module.path / "README").write_text("notes")  # not a build input
    assert module.output == first
    (module.path / "go.sum").write_text("k8s.io/kubernetes v1.35.4 h1:other=\n")
    assert module.output != first
    with pytest.raises(LabError, match="make install"):
        module.binary("kubeadm")


def test_the_repository_builds_each_kubernetes_version_it_pins():
    versions = [m.requirement("k8s.io/kubernetes") for m in gobuild.kubernetes_modules()]
    assert versions == ["v1.35.4", "v1.36.3"]  # oldest first
    assert gobuild.kubernetes_module("1.35.4").name == "kubernetes-1.35"
    with pytest.raises(LabError, match="no Go module"):
        gobuild.kubernetes_module("1.20.0")


def test_make_install_builds_the_labs_kubernetes_and_leaves_the_upgrades_target():
    """A lab runs the oldest build; the newer one (about 12 minutes cold) only for an upgrade."""
    names = [m.name for m in gobuild.lab_modules()]
    assert "kubernetes-1.35" in names and "kubernetes-1.36" not in names
    assert {"containerd-2", "etcd-3.6", "cluster-tools", "pause"} <= set(names)
    assert "kubernetes-1.36" in [m.name for m in gobuild.modules()]


def test_kwok_is_built_by_the_fleet_command_not_by_make_install():
    """kwok's controller (go/kwok) is as big a build as kubectl: `gpuinfra lab fleet` builds it
    the first time it runs, and `python -m lab.gobuild --all` with the rest."""
    kwok = gobuild.module("kwok")
    assert kwok.tools() == ["sigs.k8s.io/kwok/cmd/kwok"]
    assert kwok.requirement("sigs.k8s.io/kwok") == "v0.8.0"
    assert "kwok" not in [m.name for m in gobuild.lab_modules()]
    assert "kwok" in [m.name for m in gobuild.modules()]


def test_the_conformance_suite_is_built_on_first_use_not_by_make_install():
    """go/conformance-1.35 pins k8s.io/kubernetes as the cluster's build does, but it builds the
    suite (e2e.test, more packages than the cluster's binaries together) and its images'
    programs: neither `make install` nor the Kubernetes builds' list may pick it up."""
    suite = gobuild.conformance_module("v1.35.4")
    assert suite.name == "conformance-1.35" and suite.name in gobuild.ON_FIRST_USE
    assert suite.name not in [m.name for m in gobuild.lab_modules()]
    assert suite.name not in [m.name for m in gobuild.kubernetes_modules()]
    assert suite.test_programs() == {"e2e.test": "k8s.io/kubernetes/test/e2e"}
    assert "k8s.io/kubernetes/test/images/agnhost" in suite.tools()
    # The suite reports the cluster's release, as the cluster's binaries do.
    assert "-X k8s.io/component-base/version.gitVersion=v1.35.4" in suite.ldflags()
    with pytest.raises(LabError, match="conformance suite of Kubernetes v1.20.0"):
        gobuild.conformance_module("1.20.0")


def test_every_conformance_module_pins_what_its_cluster_build_pins():
    """Same k8s.io/kubernetes, same staging replaces: the suite tests the release we run."""
    for suite in gobuild.modules():
        if not suite.name.startswith(gobuild.CONFORMANCE_PREFIX):
            assert not suite.test_programs()
            continue
        assert suite.name in gobuild.ON_FIRST_USE
        version = suite.requirement("k8s.io/kubernetes") or ""
        cluster = gobuild.kubernetes_module(version)
        replaces = [line for line in cluster.go_mod.splitlines() if " => " in line]
        assert replaces and all(line in suite.go_mod.splitlines() for line in replaces)


def test_a_test_program_is_part_of_the_cache_key(tmp_path, monkeypatch):
    """A module that builds the suite is keyed on it; one that does not keeps the key it had."""
    monkeypatch.setattr(gobuild, "CACHE_DIR", tmp_path / "cache")
    plain = module_at(tmp_path, KUBERNETES_GO_MOD)
    suite = module_at(tmp_path, KUBERNETES_GO_MOD, name="conformance-9.9")
    assert suite.test_programs() and not plain.test_programs()
    suite_key, plain_key = suite.digest(), plain.digest()
    monkeypatch.setattr(gobuild, "CONFORMANCE_TESTS", {"other.test": "example.com/other"})
    assert suite.digest() != suite_key
    assert plain.digest() == plain_key


def test_containerd_reports_its_release_version():
    """kubelet reads the runtime's version over CRI; `containerd --version` prints it."""
    containerd = gobuild.module("containerd-2")
    version = containerd.requirement(gobuild.CONTAINERD)
    assert version and version.startswith("v2.")
    assert f"-X {gobuild.CONTAINERD}/version.Version={version}" in containerd.ldflags()


def test_a_module_builds_into_the_cache_once(tmp_path, monkeypatch):
    """The pause module (our own 30 lines, no dependency) built for real: a static binary in the
    cache under its key, and a second build is a no-op."""
    monkeypatch.setattr(gobuild, "CACHE_DIR", tmp_path / "cache")
    pause = gobuild.module("pause")
    output = gobuild.build(pause)
    binary = pause.binary("pause")
    assert binary.is_file() and output == pause.output
    described = subprocess.run(["file", str(binary)], capture_output=True, text=True).stdout
    if described:  # `file` is optional here
        assert "statically linked" in described
    # kubeadm's upgrade health check runs the pause image with -v in a Job and waits for it.
    version = subprocess.run([str(binary), "-v"], capture_output=True, text=True, timeout=10)
    assert (version.returncode, version.stdout) == (0, "pause (gpuinfra)\n")
    stamp = (output / gobuild.COMPLETE).stat().st_mtime_ns
    assert gobuild.build(pause) == output
    assert (output / gobuild.COMPLETE).stat().st_mtime_ns == stamp


def test_a_kubernetes_node_gets_what_runc_needs_in_systemd_nspawn(tmp_path):
    paths = host.HostPaths(tmp_path / "cp-1")
    argv = host.nspawn_argv(paths, "cp-1", "ns", [], runs_containers=True)
    assert "--capability=all" in argv
    assert "--system-call-filter=@keyring" in argv
    assert f"--bind={paths / host.CONTAINERD_STATE}:{host.CONTAINERD_DIR}" in argv
    plain = host.nspawn_argv(paths, "etcd-1", "ns", [])
    assert "--capability=CAP_NET_ADMIN" in plain  # negative control: other hosts as before
    assert not any(a.startswith("--system-call-filter") or "containerd" in a for a in plain)


def test_a_kubernetes_node_runs_in_cgroups_of_its_own(tmp_path):
    paths = host.HostPaths(tmp_path / "cp-1")
    script = host.supervisor_script(paths, "cp-1", "lab", ["true"], own_cgroups=True)
    name = host.cgroup_name("lab", "cp-1")
    assert f'/{name}"' in script and 'echo $$ > "$dir/cgroup.procs"' in script
    assert script.index("cgroup.procs") < script.index("while :; do")  # before nspawn starts
    plain = host.supervisor_script(paths, "etcd-1", "lab", ["true"])
    assert "cpuset.cpus" in script and "cpuset.cpus" not in plain  # controllers: containers only


def test_every_host_runs_in_systemd_cgroups_of_its_own(tmp_path):
    """Hosts that shared one name=systemd/unified folder shared their units' cgroups, and a unit
    started on several at once failed ("Failed to spawn executor"); measured on a 3-host lab:
    16 to 20 failed starts of 150 each before, none after."""
    script = host.supervisor_script(host.HostPaths(tmp_path / "etcd-1"), "etcd-1", "lab", ["true"])
    assert "name=systemd) top=/sys/fs/cgroup/systemd" in script
    assert "'') top=/sys/fs/cgroup/unified" in script
    assert f'dir="$top${{path%/}}/{host.cgroup_name("lab", "etcd-1")}"' in script
    assert script.index("cgroup.procs") < script.index("while :; do")  # before nspawn starts


def test_the_boot_unit_makes_cgroups_writable_and_kmsg(tmp_path):
    paths = host.HostPaths(tmp_path / "cp-1")
    (paths.merged / "etc/systemd/system").mkdir(parents=True)
    host.write_container_support(paths)
    script = (paths.merged / host.CONTAINERS_SCRIPT).read_text()
    assert "mount -t cgroup" in script and "/dev/kmsg" in script
    link = paths.merged / "etc/systemd/system/sysinit.target.wants/gpuinfra-lab-containers.service"
    assert link.is_symlink()
    result = subprocess.run(["sh", "-n", str(paths.merged / host.CONTAINERS_SCRIPT)])
    assert result.returncode == 0  # valid shell


def test_one_module_is_built_by_name(monkeypatch):
    """`python -m lab.gobuild --module NAME` builds that module only: what the conformance
    command tells the operator to run."""
    built = []
    monkeypatch.setattr(gobuild, "build", lambda target: built.append(target.name))
    assert gobuild.main(["--module", "conformance-1.35"]) == 0
    assert built == ["conformance-1.35"]
    assert gobuild.main(["--module", "no-such-module"]) == 2
    assert built == ["conformance-1.35"]
