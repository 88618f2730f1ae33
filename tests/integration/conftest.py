"""The `lab` fixture: one 13-host Debian 13 lab (default topology) shared by integration tests.

Use it from any integration test (engine, roles, etcd ...)::

    @pytest.mark.integration
    def test_something(lab: LabCluster) -> None:
        loaded = lab.loaded                      # the validated LoadedCluster
        inventory = lab.inventory_path           # cluster.yml, for the CLI or pyinfra
        result = lab.ssh("etcd-1", "systemctl is-system-running")
        assert result.stdout.strip() == "running"

The lab is booted once per test session under the name `itest` (its own subnet, bridge and
namespaces: a developer's `lab` is never touched; GPUINFRA_LAB_NAME picks another name, for
two sessions on one machine) and taken down at the end. Set
GPUINFRA_LAB_KEEP=1 to leave it running after the session; the next session then reuses it
(`lab up` is idempotent) and starts in seconds. Tests that break a host (stop, partition,
reboot) must leave it as they found it. Needs root, systemd-nspawn and debootstrap
(scripts/install-debian-packages.sh); the first run builds the Debian root (about 45 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.context import load
from inventory.model import LoadedCluster
from lab import lifecycle
from lab.state import read_state
from lab.topology import Topology, default_topology
from tests.helpers import FIRST_APPLY_S, lab_module_order
from tests.integration.roles_helpers import failed_run, gpuinfra
from toolkit.ssh import ssh_argv

# Two sessions at once on one machine (two developers) each set their own name.
LAB_NAME = os.environ.get("GPUINFRA_LAB_NAME", "itest")
KEEP_ENV = "GPUINFRA_LAB_KEEP"


@dataclass(frozen=True)
class LabCluster:
    """A running lab: its name, its cluster.yml and the cluster loaded from it."""

    name: str
    inventory_path: Path
    loaded: LoadedCluster
    up_result: lifecycle.UpResult
    fresh: bool = False  # booted now from nothing: no earlier lab of this name was reused

    @property
    def hosts(self) -> list[str]:
        return list(self.loaded.cluster.hosts)

    def address(self, host: str) -> str:
        return str(self.loaded.cluster.hosts[host].address)

    def ssh(
        self, host: str, command: str, *, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command on a host over ssh, host keys checked against the lab's file."""
        argv = ssh_argv(self.loaded, host) + [command]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(
                f"{host}: {command!r} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result


def boot_lab(
    name: str,
    topology: Topology,
    inventory_path: Path,
    layer: Path | None = None,
    kubernetes: bool = False,
) -> LabCluster:
    """Bring a lab up (replacing a leftover one with other hosts) and load its inventory.
    Kubernetes runs only on a lab that asks for it (tests/integration/test_kubernetes.py's)."""
    if os.geteuid() != 0:
        pytest.fail(
            "integration tests boot lab hosts and need root (deselect: -m 'not integration')"
        )
    existing = read_state(name)
    wanted_layer = layer.absolute() if layer else None
    wanted = (topology, wanted_layer, kubernetes)
    if existing is not None and (existing.topology, existing.layer, existing.kubernetes) != wanted:
        lifecycle.down(name)
        existing = None
    result = lifecycle.up(
        name, topology, inventory_path=inventory_path, layer=layer, kubernetes=kubernetes
    )
    loaded = load(result.inventory_path)
    return LabCluster(name, result.inventory_path, loaded, result, fresh=existing is None)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    """The shared default-topology lab (see the module docstring)."""
    inventory = tmp_path_factory.mktemp("lab-inventory") / "cluster.yml"
    cluster = boot_lab(LAB_NAME, default_topology(), inventory)
    yield cluster
    if os.environ.get(KEEP_ENV) != "1":
        lifecycle.down(LAB_NAME)


@pytest.fixture(scope="session")
def converged(lab: LabCluster) -> LabCluster:
    """The shared lab with every role applied, once per run: the modules that test a converged
    host (engine, drift, verify, each role's own checks) share this apply; only kernel and
    fabric apply again, for the report they read (ten no-op applies of the whole lab were a
    sixth of the shared-lab process).
    A test that changes a host puts it back; the drift tests end with a clean fleet. The run's
    first apply of fresh hosts goes past the default 900 s on a loaded machine, and a killed
    apply leaves dpkg busy for the next module's: it gets FIRST_APPLY_S."""
    result = gpuinfra(
        "apply", str(lab.inventory_path), "--yes", "--format", "json", timeout=FIRST_APPLY_S
    )
    assert result.returncode == 0, failed_run(result)
    return lab


def needed_later(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test after the requesting module's last one uses `fixture` (this run's
    selection, in its order)."""
    items = request.session.items
    mine = [i for i, item in enumerate(items) if getattr(item, "module", None) is request.module]
    later = items[max(mine) + 1 :] if mine else []
    return any(fixture in getattr(item, "fixturenames", ()) for item in later)


_kubernetes: dict[str, object] = {}


@pytest.fixture(scope="module")
def kubernetes_lab(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[object]:
    """The Kubernetes lab (tests/integration/kube_lab.py): booted and applied by the first
    module that asks for it, shared by the next ones, taken down after the last (unless kept).
    Its apply is a from-bare bootstrap of the whole cluster (about 18 minutes in a loaded CI
    run): one per run, not one per module. An apply that failed fails the later modules at
    once, naming it, rather than being tried again."""
    from tests.integration import kube_lab  # it imports this module

    if "failed" in _kubernetes:
        pytest.fail(
            f"the Kubernetes lab's apply failed in an earlier module: {_kubernetes['failed']}"
        )
    if "running" not in _kubernetes:
        report = tmp_path_factory.mktemp("k8s") / "apply.json"
        running = kube_lab.applied_lab(kube_lab.KUBE_LAB, report, prepare=kube_lab.lab_inventory)
        try:
            _kubernetes["cluster"] = next(running)
        except BaseException as failed:  # the generator took the lab down already
            _kubernetes["failed"] = (str(failed) or repr(failed)).splitlines()[0][:300]
            raise
        _kubernetes["running"] = running
    yield _kubernetes["cluster"]
    if not needed_later(request, "kubernetes_lab"):
        _kubernetes.pop("running").close()  # down, unless kept
        _kubernetes.pop("cluster")


# Each run's time per module, whether the module used the shared lab above, and which other
# lab it shares with other modules ("lab"), for scripts/integration_split.py: it puts the
# modules with labs of their own beside the shared-lab ones (those sharing a lab together)
# so the two processes of `make test` end together. Fixture setup counts
# (a lab's boot is the module's time), so does teardown; the setup's share is also kept on its
# own ("setup_seconds": a lab's boot and first apply, which the test bodies do not show).
TIMES_DIR = Path(__file__).resolve().parents[2] / "build" / "integration-times"
_times: dict[str, dict[str, float | bool | str]] = {}


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def uses_kubernetes_lab(item: pytest.Item) -> bool:
    return "kubernetes_lab" in getattr(item, "fixturenames", ())


def uses_shared_lab(item: pytest.Item) -> bool:
    """Whether a test asks for the session lab (directly or through `converged`)."""
    definitions = getattr(item, "_fixtureinfo", None)
    chain = definitions.name2fixturedefs.get("lab", ()) if definitions else ()
    # The session lab is this conftest's fixture; a module may define a `lab` of its own.
    return bool(chain) and not chain[-1].baseid.endswith(".py")


def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    """Modules with labs of their own first, then those on the session lab: the session lab
    is booted when its first module starts and stays up to the end, so an own-lab module run
    between two shared-lab ones kept its 16 hosts idle beside (a third of a core, measured
    with scripts/cpu_profile.py) and three labs on the machine's disk. Whole modules move, in
    their own order, so a module's fixtures are set up once; the Kubernetes lab's modules stay
    together (tests.helpers.lab_module_order)."""
    modules = list(dict.fromkeys(module_of(item) for item in items))
    shared = {module_of(item) for item in items if uses_shared_lab(item)}
    kubernetes = {module_of(item) for item in items if uses_kubernetes_lab(item)}
    order = lab_module_order(modules, shared, kubernetes)
    items.sort(key=lambda item: order.index(module_of(item)))


def pytest_runtest_setup(item: pytest.Item) -> None:
    entry = _times.setdefault(module_of(item), {"seconds": 0.0, "shared_lab": False})
    entry["shared_lab"] = bool(entry["shared_lab"]) or uses_shared_lab(item)
    if uses_kubernetes_lab(item):
        entry["lab"] = "kubernetes"  # one process runs every module of this lab


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _times.setdefault(report.nodeid.split("::")[0], {"seconds": 0.0, "shared_lab": False})
    entry["seconds"] = round(float(entry["seconds"]) + report.duration, 1)
    if report.when == "setup":
        entry["setup_seconds"] = round(float(entry.get("setup_seconds", 0.0)) + report.duration, 1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _times or hasattr(session.config, "workerinput"):
        return
    TIMES_DIR.mkdir(parents=True, exist_ok=True)
    name = os.environ.get("GPUINFRA_INTEGRATION_PROCESS", "run")
    written = {"finished": time.time(), "modules": _times}
    (TIMES_DIR / f"{name}.json").write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
