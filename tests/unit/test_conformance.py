"""The conformance run, offline (issue 45): the CI subset against the suite's own list, the
KUBE_TEST_REPO_LIST it writes, how tests are dealt to e2e.test processes and read back from
JUnit, the images' names against the suite's manifest, and the command's bad-input errors."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.exitcodes import ExitCode
from cli.main import app
from day2 import conformance
from lab import conformance as images
from lab import gobuild, rootfs
from lab.errors import LabError
from tests.unit.loopback import loopback_cluster

runner = CliRunner()
SUITE = gobuild.conformance_module("v1.35.4")


def _module_source() -> Path:
    """k8s.io/kubernetes as go/conformance-1.35 pins it, from Go's module cache (the files are
    another project's: read where Go keeps them, never copied into the repository)."""
    if shutil.which("go") is None:
        pytest.skip("go is not installed: the suite's source is read from Go's module cache")
    found = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    source = Path(found) / f"k8s.io/kubernetes@{SUITE.requirement('k8s.io/kubernetes')}"
    if not source.is_dir():  # `make install` downloads it with the cluster's build
        subprocess.run(["go", "mod", "download", "k8s.io/kubernetes"], cwd=SUITE.path, check=True)
    return source


@pytest.fixture(scope="module")
def conformance_yaml() -> list[str]:
    path = _module_source() / "test/conformance/testdata/conformance.yaml"
    return conformance.conformance_names(path.read_text())


@pytest.fixture(scope="module")
def manifest_go() -> str:
    return (_module_source() / images.MANIFEST).read_text()


# ---------------------------------------------------------------- which tests


def test_the_release_has_441_conformance_tests(conformance_yaml):
    assert len(conformance_yaml) == 441
    assert all(name.endswith(conformance.CONFORMANCE) for name in conformance_yaml)


def test_the_ci_subset_names_conformance_tests_exactly(conformance_yaml):
    subset = conformance.ci_subset()
    assert 45 <= len(subset) <= 60
    assert len(set(subset)) == len(subset)
    unknown = [name for name in subset if name not in conformance_yaml]
    assert unknown == []
    assert conformance.select("ci", conformance_yaml) == subset


def test_the_ci_subset_is_parallel_and_covers_each_area():
    subset = conformance.ci_subset()
    assert [name for name in subset if conformance.SERIAL in name] == []
    areas = {re.match(r"\[(sig-[a-z-]+)\]", name).group(1) for name in subset}
    wanted = {"sig-network", "sig-apps", "sig-api-machinery", "sig-node", "sig-scheduling"}
    assert wanted <= areas
    dns = [name for name in subset if name.startswith("[sig-network] DNS ")]
    services = [name for name in subset if name.startswith("[sig-network] Services ")]
    assert len(dns) >= 3 and len(services) >= 3


def test_all_selects_every_conformance_test_and_an_unknown_subset_is_refused():
    listed = ["[sig-a] x [Conformance]", "[sig-a] y", "[sig-b] z [Serial] [Conformance]"]
    assert conformance.select("all", listed) == [listed[0], listed[2]]
    with pytest.raises(conformance.ConformanceInputError, match="one of ci, all"):
        conformance.select("some", listed)


def test_a_stale_ci_subset_is_refused_before_anything_runs():
    with pytest.raises(conformance.ConformanceInputError, match="does not have"):
        conformance.select("ci", ["[sig-a] x [Conformance]"])


def test_the_serial_tests_run_after_the_parallel_shards():
    names = [f"[sig-a] t{i} [Conformance]" for i in range(7)] + [
        "[sig-b] s1 [Serial] [Conformance]",
        "[sig-b] s2 [Serial] [Conformance]",
    ]
    planned = conformance.shards(names, 3)
    assert [len(shard) for shard in planned] == [3, 2, 2, 2]
    assert planned[-1] == names[-2:]
    assert sorted(sum(planned[:-1], [])) == sorted(names[:7])
    assert conformance.shards(names[:2], 8) == [[names[0]], [names[1]]]


def test_the_focus_matches_each_name_and_escapes_only_re2_metacharacters(conformance_yaml):
    chosen = conformance.ci_subset()
    pattern = conformance.focus(chosen)
    assert "\\ " not in pattern  # Go's RE2 refuses an escaped space
    compiled = re.compile(pattern)
    assert all(compiled.search(name) for name in chosen)
    others = [name for name in conformance_yaml if name not in chosen]
    assert [name for name in others if compiled.search(name)] == []


def test_the_listing_is_read_as_names():
    text = (
        "test/e2e/network/dns.go:51: [sig-network] DNS should provide DNS for the cluster "
        "[Conformance]\n"
        "some log line\n"
        "test/e2e/apps/job.go:99: [sig-apps] Job should delete a job [Conformance]\n"
    )
    assert conformance.parse_listing(text) == [
        "[sig-network] DNS should provide DNS for the cluster [Conformance]",
        "[sig-apps] Job should delete a job [Conformance]",
    ]


# ---------------------------------------------------------------- what it gave

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" failures="1">
  <testsuite name="Kubernetes e2e suite" tests="4">
    <testcase name="[SynchronizedBeforeSuite]" status="passed"></testcase>
    <testcase name="[It] [sig-a] passes [Conformance]" status="passed"></testcase>
    <testcase name="[It] [sig-a] fails [Conformance]" status="failed">
      <failure message="timed out">boom</failure>
    </testcase>
    <testcase name="[It] [sig-a] skips [Conformance]" status="skipped">
      <skipped message="skipped - no second node"></skipped>
    </testcase>
    <testcase name="[It] [sig-a] never ran [Conformance]" status="skipped">
      <skipped message="skipped"></skipped>
    </testcase>
  </testsuite>
</testsuites>
"""


def test_the_summary_counts_each_selected_test_once(tmp_path):
    report = tmp_path / "junit-01.xml"
    report.write_text(JUNIT)
    names = [
        "[sig-a] passes [Conformance]",
        "[sig-a] fails [Conformance]",
        "[sig-a] skips [Conformance]",
        "[sig-a] never ran [Conformance]",
    ]
    # The second process ran the last test and left no report; the first lists it as skipped.
    shards = [(names[:3], report), (names[3:], tmp_path / "junit-02.xml")]
    summary = conformance.summarize("ci", names, shards)
    assert (summary.passed, summary.failed, summary.skipped, summary.not_run) == (1, 1, 1, 1)
    assert summary.failures == ["[sig-a] fails [Conformance]"]
    assert not summary.ok
    text = summary.to_text()
    assert "4 tests, 1 passed, 1 failed, 1 skipped, 1 not run" in text
    assert "failed: [sig-a] fails [Conformance]" in text


# ---------------------------------------------------------------- the images


def test_the_repo_list_points_every_registry_of_the_manifest_at_ours(manifest_go):
    listed = yaml.safe_load(conformance.repo_list("10.1.0.1:5000"))
    keys = set(re.findall(r'`yaml:"(\w+)"`', manifest_go.split("type Config struct")[0]))
    assert set(listed) == keys
    assert listed.pop("invalidRegistry") == "127.0.0.1:1/invalid"  # refused at once
    assert listed["promoterE2eRegistry"] == "10.1.0.1:5000/e2e-test-images"
    assert listed["gcRegistry"] == "10.1.0.1:5000"
    assert all(value.startswith("10.1.0.1:5000") for value in listed.values())


def test_the_images_built_here_have_the_manifests_names_and_tags(manifest_go):
    found = images.manifest_images(manifest_go)
    assert set(images.BUILT_HERE) <= set(found)
    built = {found[image_id].image_id: found[image_id] for image_id in images.BUILT_HERE}
    agnhost = {built["Agnhost"].tag, built["AgnhostPrev"].tag}
    assert agnhost == {"2.59", "2.55"}
    assert built["Agnhost"].repository == "e2e-test-images/agnhost"
    assert built["Pause"].repository == "pause"
    assert built["Etcd"].repository == "etcd"
    # Each image the lab registry serves sits where repo_list sends the suite.
    for image in built.values():
        key = image.registry[0].lower() + image.registry[1:]
        assert conformance.REGISTRY_PATHS[key] == images.PATHS[image.registry]


def test_the_suite_names_the_pause_tag_the_clusters_kubeadm_names(manifest_go):
    """The cluster's own pause image (offline.publish_images) is the suite's: one image."""
    kubernetes = gobuild.kubernetes_module(SUITE.requirement("k8s.io/kubernetes") or "")
    kubernetes.binary("kubeadm")  # built by `make install`; LabError saying so when it is not
    from lab import offline

    assert images.manifest_images(manifest_go)["Pause"].tag == offline.pause_tag(kubernetes)


def test_the_busybox_config_sets_and_turns_off_exactly_the_settings_named():
    config = "CONFIG_STATIC is fine\n# CONFIG_STATIC is not set\nCONFIG_TC=y\nCONFIG_TCPSVD=y\n"
    made = images.busybox_config(config, images.BUSYBOX_CONFIG).splitlines()
    assert "CONFIG_STATIC=y" in made and "# CONFIG_TC is not set" in made
    assert "CONFIG_TCPSVD=y" in made  # a name that only starts like one is kept
    assert "CONFIG_TC=y" not in made and "# CONFIG_STATIC is not set" not in made


def _serve(folder: Path):
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, rootfs.Mirror(f"http://127.0.0.1:{httpd.server_address[1]}", None)


def test_busybox_is_built_from_the_pinned_source_and_a_wrong_tarball_is_refused(
    tmp_path, monkeypatch
):
    """The image's busybox is not Debian's binary (whose ash drops `data-1=...` from its
    environment): its source is fetched from the mirror and checked before anything is built.
    The positive control serves a source tree whose Makefile stands in for busybox's (its
    `defconfig` writes a .config, its `busybox` target copies it), so the build's steps run."""
    monkeypatch.setattr(images, "BUSYBOX_DIR", tmp_path / "cache")
    tree = tmp_path / "busybox-9.9"
    tree.mkdir()
    (tree / "Makefile").write_text(
        "defconfig:\n\tprintf '# CONFIG_STATIC is not set\\nCONFIG_TC=y\\n' > .config\n"
        "busybox:\n\tcp .config busybox\n"
    )
    path = "pool/main/b/busybox/busybox_9.9.orig.tar.bz2"
    served = tmp_path / "archive" / path
    served.parent.mkdir(parents=True)
    subprocess.run(["tar", "-cjf", str(served), "-C", str(tmp_path), tree.name], check=True)
    good = hashlib.sha256(served.read_bytes()).hexdigest()

    httpd, mirror = _serve(tmp_path / "archive")
    try:
        monkeypatch.setattr(images, "BUSYBOX_SOURCE", (path, "0" * 64))
        with pytest.raises(LabError, match=f"has sha256 {good}, not the 0000"):
            images.busybox_binary(mirror)
        assert list((tmp_path / "cache").iterdir()) == []  # nothing half built is kept

        monkeypatch.setattr(images, "BUSYBOX_SOURCE", (path, good))
        made = images.busybox_binary(mirror)
    finally:
        httpd.shutdown()
    assert made.read_text() == "CONFIG_STATIC=y\n# CONFIG_TC is not set\n"
    assert images.busybox_binary(mirror) == made  # once per machine: the server is gone


# ---------------------------------------------------------------- the command


def test_the_command_without_a_kubeconfig_says_to_apply_first(tmp_path):
    cluster = loopback_cluster(tmp_path / "loop")
    result = runner.invoke(app, ["kubernetes", "conformance", str(cluster)])
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert "no kubeconfig" in result.output and "gpuinfra apply" in result.output


def test_the_command_without_e2e_test_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setattr(gobuild, "CACHE_DIR", tmp_path / "empty-cache")
    cluster = loopback_cluster(tmp_path / "loop")
    (cluster / ".state/kubernetes").mkdir(parents=True)
    (cluster / ".state/kubernetes/admin.conf").write_text("apiVersion: v1\n")
    result = runner.invoke(app, ["kubernetes", "conformance", str(cluster)])
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert "python -m lab.gobuild --module conformance-1.35" in result.output
    missing = tmp_path / "no-e2e.test"
    given = ["kubernetes", "conformance", str(cluster), "--e2e-test", str(missing)]
    result = runner.invoke(app, given)
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert "no e2e.test at" in result.output


def test_the_command_refuses_an_unknown_subset(tmp_path):
    cluster = loopback_cluster(tmp_path / "loop")
    result = runner.invoke(app, ["kubernetes", "conformance", str(cluster), "--subset", "some"])
    assert result.exit_code == ExitCode.BAD_INPUT


# ---------------------------------------------------------------- a run, with a stand-in e2e.test

FAKE_E2E = """#!{python}
import os, re, sys
from pathlib import Path
TESTS = {tests!r}
FAIL = {fail!r}
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
if "--list-tests" in sys.argv:
    print("The following spec names can be used with 'ginkgo run --focus/skip':")
    for number, name in enumerate(TESTS):
        print(f"    k8s.io/kubernetes@v1.35.4/test/e2e/x.go:{{number}}: {{name}}")
    sys.exit(0)
assert "promoterE2eRegistry" in Path(os.environ["KUBE_TEST_REPO_LIST"]).read_text()
assert Path(args["--kubeconfig"]).is_file()
focus = re.compile(args["--ginkgo.focus"])
cases = []
for name in TESTS:
    ran = bool(focus.search(name))
    status = ("failed" if name in FAIL else "passed") if ran else "skipped"
    body = {{"failed": "<failure>x</failure>", "skipped": "<skipped/>"}}.get(status, "")
    cases.append(f'<testcase name="[It] {{name}} [x]" status="{{status}}">{{body}}</testcase>')
Path(args["--ginkgo.junit-report"]).write_text("<testsuites>" + "".join(cases) + "</testsuites>")
sys.exit(1 if FAIL & {{n for n in TESTS if focus.search(n)}} else 0)
"""


def _fake_suite(tmp_path: Path, tests: list[str], fail: set[str]) -> conformance.Suite:
    import sys

    script = tmp_path / "e2e.test"
    script.write_text(FAKE_E2E.format(python=sys.executable, tests=tests, fail=fail))
    script.chmod(0o755)
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f"#!/bin/sh\ncat {tmp_path / 'nodes.json'}\n")
    kubectl.chmod(0o755)
    nodes = [_node("cpu-1"), _node("cpu-2"), _node("cp-1", taints=[CONTROL_PLANE_TAINT])]
    (tmp_path / "nodes.json").write_text(json.dumps({"items": nodes}))
    return conformance.Suite(e2e_test=script, kubectl=kubectl, registry="10.1.0.1:5000")


CONTROL_PLANE_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def _node(name: str, ready: bool = True, cordoned: bool = False, taints=()) -> dict:
    status = {"type": "Ready", "status": "True" if ready else "False"}
    spec = {"taints": list(taints)} | ({"unschedulable": True} if cordoned else {})
    return {"metadata": {"name": name}, "spec": spec, "status": {"conditions": [status]}}


def test_gpuinfras_taints_do_not_block_the_suite_and_other_nodes_are_left_out():
    preflight = {"key": "gpuinfra.io/preflight", "value": "pending", "effect": "NoSchedule"}
    team = {"key": "gpuinfra.io/team", "value": "research", "effect": "NoSchedule"}
    foreign = {"key": "example.com/maintenance", "effect": "NoExecute"}
    soft = {"key": "example.com/soft", "effect": "PreferNoSchedule"}
    nodes = [
        _node("cp-1", taints=[CONTROL_PLANE_TAINT]),
        _node("cpu-1", taints=[soft]),
        _node("gpu-1", taints=[preflight, team]),
        _node("gpu-2", cordoned=True),
        _node("gpu-3", ready=False),
        _node("gpu-4", taints=[foreign]),
    ]
    survey = conformance.survey_nodes({"items": nodes})
    assert survey.untainted == ["cpu-1"]  # PreferNoSchedule keeps no pod off
    assert survey.tainted == {
        "cp-1": "node-role.kubernetes.io/control-plane",
        "gpu-1": "gpuinfra.io/preflight, gpuinfra.io/team",
    }
    assert survey.left_out == {
        "gpu-2": "cordoned",
        "gpu-3": "not Ready",
        "gpu-4": "taint example.com/maintenance",
    }
    with pytest.raises(conformance.ConformanceInputError) as refused:
        conformance.check_nodes(survey)
    message = str(refused.value)
    assert "needs 2 Ready, untainted, schedulable nodes and the cluster has 1 (cpu-1)" in message
    assert "gpu-1: gpuinfra.io/preflight, gpuinfra.io/team" in message
    assert "gpu-2: cordoned" in message
    # The positive control: a second untainted node and the same cluster is accepted.
    conformance.check_nodes(conformance.survey_nodes({"items": [*nodes, _node("cpu-2")]}))
    argv = conformance.e2e_argv(
        conformance.Suite(Path("e2e.test"), None, "r"), Path("k"), ["t"], Path("j"), 3
    )
    assert "--allowed-not-ready-nodes=3" in argv
    assert (
        "--non-blocking-taints=node-role.kubernetes.io/control-plane,"
        "gpuinfra.io/preflight,gpuinfra.io/team"
    ) in argv


def test_a_run_writes_junit_per_process_and_a_summary(tmp_path):
    from engine.context import load

    tests = [f"[sig-a] t{index} (x) [Conformance]" for index in range(5)] + [
        "[sig-b] s [Serial] [Conformance]",
        "[sig-c] not conformance",
    ]
    suite = _fake_suite(tmp_path, tests, fail={tests[5]})
    cluster = loopback_cluster(tmp_path / "loop")
    (cluster / ".state/kubernetes").mkdir(parents=True)
    (cluster / ".state/kubernetes/admin.conf").write_text("apiVersion: v1\n")
    summary = conformance.run(load(cluster), suite, "all", processes=2)
    assert (summary.selected, summary.passed, summary.failed) == (6, 5, 1)
    assert summary.failures == ["[sig-b] s [Serial] [Conformance]"]
    out = cluster / ".state/conformance/all"
    assert sorted(p.name for p in out.glob("junit-*.xml")) == [
        "junit-01.xml",
        "junit-02.xml",
        "junit-03.xml",  # the [Serial] one, after the two parallel processes
    ]
    assert "6 tests, 5 passed, 1 failed" in (out / "summary.txt").read_text()
    listed = yaml.safe_load((out / "repo-list.yaml").read_text())
    assert listed["promoterE2eRegistry"] == "10.1.0.1:5000/e2e-test-images"


def test_a_rerun_runs_only_the_last_runs_failures_and_keeps_its_record(tmp_path):
    from engine.context import load

    tests = [f"[sig-a] t{index} (x) [Conformance]" for index in range(4)]
    cluster = loopback_cluster(tmp_path / "loop")
    (cluster / ".state/kubernetes").mkdir(parents=True)
    (cluster / ".state/kubernetes/admin.conf").write_text("apiVersion: v1\n")
    loaded = load(cluster)
    # No run yet: refused before anything runs.
    with pytest.raises(conformance.ConformanceInputError, match="no earlier run"):
        conformance.run(loaded, _fake_suite(tmp_path, tests, set()), "all", rerun_failed=True)
    first = conformance.run(loaded, _fake_suite(tmp_path, tests, {tests[1], tests[3]}), "all")
    assert first.failures == [tests[1], tests[3]]
    # The rerun: only those two, and one of them passes now.
    again = conformance.run(
        loaded, _fake_suite(tmp_path, tests, {tests[3]}), "all", rerun_failed=True
    )
    assert (again.selected, again.passed, again.failed) == (2, 1, 1)
    assert again.failures == [tests[3]]
    record = (cluster / ".state/conformance/all/summary.txt").read_text()
    assert "4 tests, 2 passed, 2 failed" in record
    assert (
        "2 tests, 1 passed, 1 failed"
        in (cluster / ".state/conformance/all-rerun/summary.txt").read_text()
    )
    # A last run that failed nothing leaves nothing to rerun.
    conformance.run(loaded, _fake_suite(tmp_path, tests, set()), "all")
    with pytest.raises(conformance.ConformanceInputError, match="nothing to rerun"):
        conformance.run(loaded, _fake_suite(tmp_path, tests, set()), "all", rerun_failed=True)


def test_the_command_exits_1_on_a_failed_test_and_0_when_all_pass(tmp_path, monkeypatch):
    import cli.kubernetes

    monkeypatch.setattr(cli.kubernetes, "_built_kubectl", lambda version: tmp_path / "kubectl")
    tests = ["[sig-a] t0 [Conformance]", "[sig-a] t1 [Conformance]"]
    cluster = loopback_cluster(tmp_path / "loop")
    (cluster / ".state/kubernetes").mkdir(parents=True)
    (cluster / ".state/kubernetes/admin.conf").write_text("apiVersion: v1\n")
    for fail, code in (({tests[1]}, ExitCode.ERROR), (set(), ExitCode.OK)):
        suite = _fake_suite(tmp_path, tests, fail)
        argv = ["kubernetes", "conformance", str(cluster), "--subset", "all"]
        result = runner.invoke(app, [*argv, "--e2e-test", str(suite.e2e_test)])
        assert result.exit_code == code, result.output
        assert "2 tests" in result.output


def test_the_command_refuses_a_cluster_with_one_untainted_node_before_running(
    tmp_path, monkeypatch
):
    import cli.kubernetes

    monkeypatch.setattr(cli.kubernetes, "_built_kubectl", lambda version: tmp_path / "kubectl")
    cluster = loopback_cluster(tmp_path / "loop")
    (cluster / ".state/kubernetes").mkdir(parents=True)
    (cluster / ".state/kubernetes/admin.conf").write_text("apiVersion: v1\n")
    suite = _fake_suite(tmp_path, ["[sig-a] t0 [Conformance]"], set())
    preflight = {"key": "gpuinfra.io/preflight", "effect": "NoSchedule"}
    nodes = [_node("cpu-1"), _node("gpu-1", taints=[preflight])]
    (tmp_path / "nodes.json").write_text(json.dumps({"items": nodes}))
    argv = ["kubernetes", "conformance", str(cluster), "--e2e-test", str(suite.e2e_test)]
    result = runner.invoke(app, [*argv, "--subset", "all"])
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert "gpu-1: gpuinfra.io/preflight" in result.output
    assert not (cluster / ".state/conformance/all/junit-01.xml").exists()
