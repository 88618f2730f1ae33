"""The Kubernetes conformance suite against a running cluster: which tests, how e2e.test runs
them, and what they gave (JUnit and a short summary under the cluster's state directory).

e2e.test (built from go/conformance-<minor>, lab/gobuild.py) talks to the API server through
the operator's kubeconfig, as kubectl does; it changes no host, so no host lock is taken, but
it creates namespaces in the cluster, which the suite deletes as each test ends. Its images
come from the registry named by `KUBE_TEST_REPO_LIST` (the environment variable: the image
manifest reads it when e2e.test starts, before flags are parsed). The parallel part runs as
several e2e.test processes at once, each on its own share of the tests (e2e.test's own
parallel mode needs the ginkgo CLI's server); the `[Serial]` tests run after, one process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from inventory.model import LoadedCluster
from roles.kubernetes.deploy import OPERATOR_KUBECONFIG
from toolkit.nodes import PREFLIGHT_TAINT_KEY, TEAM_TAINT_KEY

CI_SUBSET = Path(__file__).with_name("conformance-ci.txt")
SUBSETS = ("ci", "all")
RESULTS_DIR = "conformance"  # under the cluster's state directory
CONFORMANCE = "[Conformance]"
SERIAL = "[Serial]"
# The tags of `KUBE_TEST_REPO_LIST` (k8s.io/kubernetes test/utils/image/manifest.go, RegistryList)
# and the path under a registry each one's images are pushed to: the upstream path, so that a
# registry mirroring registry.k8s.io serves them under either name.
REGISTRY_PATHS = {
    "promoterE2eRegistry": "e2e-test-images",
    "buildImageRegistry": "build-image",
    "gcEtcdRegistry": "",
    "gcRegistry": "",
    "sigStorageRegistry": "sig-storage",
    "privateRegistry": "k8s-authenticated-test",
    "dockerLibraryRegistry": "library",
    "cloudProviderGcpRegistry": "cloud-provider-gcp",
}
# Where the suite's "image that cannot be pulled" points: a closed port on the node itself, so
# the pull is refused at once (the upstream name needs DNS and a network a lab has not).
INVALID_REGISTRY = "127.0.0.1:1/invalid"
# e2e.test processes for the parallel part: the lab's two workers are busy at about four.
DEFAULT_PROCESSES = 4
# Taints that do not stop the suite from starting: its own default, and gpuinfra's. At start
# the suite waits for every node to be ready for tests, up to 30 minutes, then fails every test;
# a GPU node kept for a team or waiting for its preflight checks would stop it on every GPU
# cluster gpuinfra builds. The suite schedules its pods on untainted nodes only, either way.
NON_BLOCKING_TAINTS = ("node-role.kubernetes.io/control-plane", PREFLIGHT_TAINT_KEY, TEAM_TAINT_KEY)
# "[sig-architecture] Conformance Tests should have at least two untainted nodes", and the
# tests that spread pods over two nodes.
MIN_UNTAINTED_NODES = 2
# The suite's own limit per run is 24 h; a wedged test fails its process after this instead.
PROCESS_TIMEOUT = "6h"


class ConformanceError(RuntimeError):
    """The suite could not be run (not a failing test: those are in the summary)."""


class ConformanceInputError(ConformanceError):
    """Bad input found before anything ran: no kubeconfig, no e2e.test, an unknown subset."""


@dataclass
class Summary:
    """What one run gave; `failures` are the ginkgo names of the failed tests."""

    subset: str
    selected: int
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    not_run: int = 0
    wall_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    junit: list[str] = field(default_factory=list)
    registry: str = ""
    # Nodes the suite was told to leave out (not Ready, cordoned, or another taint), and why.
    left_out: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.not_run == 0

    def to_text(self) -> str:
        lines = [
            f"subset {self.subset}: {self.selected} tests, {self.passed} passed, "
            f"{self.failed} failed, {self.skipped} skipped, {self.not_run} not run, "
            f"wall time {self.wall_s:.0f} s",
            f"images from {self.registry}",
            *(f"left out: {name} ({why})" for name, why in sorted(self.left_out.items())),
            *(f"failed: {name}" for name in self.failures),
            *(f"junit: {path}" for path in self.junit),
        ]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- what runs


def ci_subset(path: Path = CI_SUBSET) -> list[str]:
    """The CI subset's test names: one a line, `#` comments and blank lines left out."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def conformance_names(conformance_yaml: str) -> list[str]:
    """The ginkgo names of the [Conformance] tests, from the suite's conformance.yaml."""
    return [entry["codename"] for entry in yaml.safe_load(conformance_yaml)]


def select(subset: str, listed: Iterable[str]) -> list[str]:
    """The tests a subset runs among those e2e.test lists: `ci`, the subset file's names
    (each must be listed, or the file is stale for this release); `all`, every
    [Conformance] test."""
    conformance = [name for name in listed if CONFORMANCE in name]
    if subset == "all":
        return conformance
    if subset != "ci":
        raise ConformanceInputError(f"--subset {subset}: one of {', '.join(SUBSETS)}")
    wanted = ci_subset()
    missing = sorted(set(wanted) - set(conformance))
    if missing:
        raise ConformanceInputError(
            f"{CI_SUBSET.name} names tests this e2e.test does not have: {missing[0]}"
        )
    return wanted


def failed_before(summary: Path, listed: Iterable[str]) -> list[str]:
    """The tests a run's summary.txt names as failed, to run again (`--rerun-failed`); each
    must be one e2e.test lists."""
    if not summary.is_file():
        raise ConformanceInputError(f"no earlier run to rerun: {summary} does not exist")
    lines = summary.read_text().splitlines()
    failed = [line.removeprefix("failed: ") for line in lines if line.startswith("failed: ")]
    if not failed:
        raise ConformanceInputError(f"{summary} names no failed test: nothing to rerun")
    unknown = sorted(set(failed) - set(listed))
    if unknown:
        raise ConformanceInputError(
            f"{summary} names a test this e2e.test does not have: {unknown[0]}"
        )
    return failed


def shards(names: list[str], processes: int) -> list[list[str]]:
    """The parallel tests dealt out to processes, round-robin (neighbours in a file tend to
    be alike in cost); the [Serial] tests as one last shard of their own."""
    parallel = [name for name in names if SERIAL not in name]
    serial = [name for name in names if SERIAL in name]
    count = max(1, min(processes, len(parallel)))
    dealt = [parallel[index::count] for index in range(count)] if parallel else []
    return [shard for shard in dealt if shard] + ([serial] if serial else [])


def focus(names: Iterable[str]) -> str:
    """A ginkgo focus (Go RE2) that matches exactly these names: RE2 refuses escaped spaces,
    so only its own metacharacters are escaped."""
    return "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", name) for name in names)


def repo_list(registry: str) -> str:
    """KUBE_TEST_REPO_LIST's YAML: every registry the suite names, at `registry`'s paths, and
    the invalid one at a port that refuses at once."""
    registry = registry.rstrip("/")
    lines = [
        f"{key}: {registry}/{path}".rstrip("/") for key, path in sorted(REGISTRY_PATHS.items())
    ]
    return "\n".join([*lines, f"invalidRegistry: {INVALID_REGISTRY}"]) + "\n"


# ---------------------------------------------------------------- running it


@dataclass(frozen=True)
class Suite:
    """e2e.test and what it runs with."""

    e2e_test: Path
    kubectl: Path | None  # the kubectl tests' client; None: the one on PATH
    registry: str  # host:port[/path] holding the suite's images


def kubeconfig(loaded: LoadedCluster) -> Path:
    """The operator's kubeconfig, which the kubernetes role copies to the state directory."""
    path = loaded.state_dir / OPERATOR_KUBECONFIG
    if not path.is_file():
        raise ConformanceInputError(
            f"no kubeconfig at {path}: apply the cluster first (`gpuinfra apply`), which copies "
            "admin.conf there"
        )
    return path


@dataclass(frozen=True)
class NodeSurvey:
    """The cluster's nodes as the suite will see them."""

    untainted: list[str]  # Ready, schedulable, no NoSchedule or NoExecute taint
    tainted: dict[str, str]  # Ready and schedulable, with only NON_BLOCKING_TAINTS: key list
    left_out: dict[str, str]  # what would stop the suite from starting, and why


def survey_nodes(node_list: dict) -> NodeSurvey:
    """Sort `kubectl get nodes -o json`'s nodes into those the suite runs its pods on, those
    it passes over (our taints, the control plane's), and those it must be told to leave out."""
    untainted: list[str] = []
    tainted: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for node in node_list.get("items", []):
        name = node["metadata"]["name"]
        conditions = node.get("status", {}).get("conditions", [])
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        keys = [
            taint["key"]
            for taint in node.get("spec", {}).get("taints") or []
            if taint.get("effect") in ("NoSchedule", "NoExecute")
        ]
        others = [key for key in keys if key not in NON_BLOCKING_TAINTS]
        if not ready:
            left_out[name] = "not Ready"
        elif node.get("spec", {}).get("unschedulable"):
            left_out[name] = "cordoned"
        elif others:
            left_out[name] = "taint " + ", ".join(others)
        elif keys:
            tainted[name] = ", ".join(keys)
        else:
            untainted.append(name)
    return NodeSurvey(untainted, tainted, left_out)


def check_nodes(survey: NodeSurvey) -> None:
    """Refuse a cluster the suite cannot pass, before its 30-minute wait."""
    if len(survey.untainted) >= MIN_UNTAINTED_NODES:
        return
    why = [f"{name}: {keys}" for name, keys in sorted(survey.tainted.items())]
    why += [f"{name}: {reason}" for name, reason in sorted(survey.left_out.items())]
    raise ConformanceInputError(
        f"the suite needs {MIN_UNTAINTED_NODES} Ready, untainted, schedulable nodes and the "
        f"cluster has {len(survey.untainted)} ({', '.join(survey.untainted) or 'none'}); "
        f"the others: {'; '.join(why) or 'none'}"
    )


def read_nodes(suite: Suite, config: Path) -> NodeSurvey:
    kubectl = str(suite.kubectl) if suite.kubectl is not None else "kubectl"
    argv = [kubectl, f"--kubeconfig={config}", "get", "nodes", "-o", "json"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConformanceError(f"kubectl get nodes failed: {exc}") from exc
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConformanceError(f"kubectl get nodes failed: {tail}")
    return survey_nodes(json.loads(result.stdout))


def list_tests(suite: Suite) -> list[str]:
    """Every test e2e.test has, by its ginkgo name (`--list-tests`)."""
    result = subprocess.run(
        [str(suite.e2e_test), "--list-tests"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConformanceError(f"{suite.e2e_test} --list-tests failed: {tail}")
    return parse_listing(result.stdout)


def parse_listing(text: str) -> list[str]:
    """--list-tests prints `<file>:<line>: <name>` a line; the names, in that order."""
    found = []
    for line in text.splitlines():
        match = re.match(r"^\s*\S+\.go:\d+: (.*\S)\s*$", line)
        if match:
            found.append(match.group(1))
    return found


def e2e_argv(
    suite: Suite, config: Path, names: list[str], report: Path, left_out: int = 0
) -> list[str]:
    argv = [
        str(suite.e2e_test),
        f"--kubeconfig={config}",
        f"--non-blocking-taints={','.join(NON_BLOCKING_TAINTS)}",
        f"--allowed-not-ready-nodes={left_out}",
        f"--ginkgo.focus={focus(names)}",
        f"--ginkgo.junit-report={report}",
        f"--ginkgo.timeout={PROCESS_TIMEOUT}",
        "--ginkgo.no-color",
        "--ginkgo.silence-skips",
        "--provider=skeleton",
    ]
    if suite.kubectl is not None:
        argv.append(f"--kubectl-path={suite.kubectl}")
    return argv


def run(
    loaded: LoadedCluster,
    suite: Suite,
    subset: str,
    processes: int = DEFAULT_PROCESSES,
    progress: Callable[[str], None] = lambda line: None,
    rerun_failed: bool = False,
) -> Summary:
    """Run a subset against the cluster: the parallel shards at once, then the [Serial] one;
    JUnit per shard and summary.txt in <state>/conformance/<subset>/. With `rerun_failed`,
    only the tests that failed in that subset's last run, into <subset>-rerun/ (the full
    run's record stays as it was)."""
    config = kubeconfig(loaded)
    if not suite.e2e_test.is_file():
        raise ConformanceInputError(f"no e2e.test at {suite.e2e_test}")
    listed = list_tests(suite)
    names = select(subset, listed)
    results = loaded.state_dir / RESULTS_DIR
    if rerun_failed:
        names = failed_before(results / subset / "summary.txt", names)
        subset = f"{subset}-rerun"
    nodes = read_nodes(suite, config)
    check_nodes(nodes)
    out = results / subset
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("junit-*.xml"):
        stale.unlink()
    repo = out / "repo-list.yaml"
    repo.write_text(repo_list(suite.registry))
    env = {**os.environ, "KUBE_TEST_REPO_LIST": str(repo)}
    started = time.monotonic()
    planned = shards(names, processes)
    parallel = [shard for shard in planned if SERIAL not in shard[0]]
    serial = [shard for shard in planned if SERIAL in shard[0]]
    reports: list[tuple[list[str], Path]] = []
    for wave, label in ((parallel, "parallel"), (serial, "serial")):
        if not wave:
            continue
        progress(f"{label}: {sum(map(len, wave))} tests in {len(wave)} e2e.test process(es)")
        running = []
        for shard in wave:
            index = len(reports) + 1
            report = out / f"junit-{index:02d}.xml"
            reports.append((shard, report))
            log = (out / f"e2e-{index:02d}.log").open("w")
            argv = e2e_argv(suite, config, shard, report, len(nodes.left_out))
            running.append((subprocess.Popen(argv, stdout=log, stderr=log, env=env), log))
        for process, log in running:
            process.wait()
            log.close()
    summary = summarize(subset, names, reports)
    summary.wall_s = time.monotonic() - started
    summary.registry = suite.registry
    summary.left_out = dict(nodes.left_out)
    (out / "summary.txt").write_text(summary.to_text())
    return summary


def summarize(subset: str, names: list[str], reports: Iterable[tuple[list[str], Path]]) -> Summary:
    """Each selected test's outcome from the JUnit report of the process that ran it (ginkgo
    names a test case `[It] <name>` and lists every other test as skipped); a test whose
    process left no report did not run."""
    outcome: dict[str, str] = {}
    reports = list(reports)
    for shard, report in reports:
        if not report.is_file():
            continue
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            text = case.get("name", "")
            name = next((wanted for wanted in shard if wanted in text), None)
            if name is None:
                continue
            if case.find("failure") is not None or case.find("error") is not None:
                outcome[name] = "failed"
            elif case.find("skipped") is not None:
                outcome.setdefault(name, "skipped")
            else:
                outcome[name] = "passed"
    summary = Summary(subset=subset, selected=len(names))
    summary.junit = [str(report) for _, report in reports]
    for name in names:
        state = outcome.get(name, "not run")
        if state == "passed":
            summary.passed += 1
        elif state == "failed":
            summary.failed += 1
            summary.failures.append(name)
        elif state == "skipped":
            summary.skipped += 1
        else:
            summary.not_run += 1
    return summary
