"""Run the verification suites against a cluster's hosts over SSH (`gpuinfra verify`).

Each folder under tests/verify/ is named after a role; its tests run once per host the role
targets (the groups of that role's phases in its record, roles/<role>/role.py), or per host of
the groups a module names in `TARGET_GROUPS`. Fixtures a suite can use:

- `host`: the testinfra Host of the target, over SSH with the cluster's key and host keys
  checked against its known_hosts file (an unknown or changed key is refused);
- `ctx`: the target's engine.render.HostContext (name, groups, settings, topology);
- `cluster`: the LoadedCluster; `topology`: its derived Topology.

Options (set by `gpuinfra verify`): --gpuinfra-inventory PATH, --gpuinfra-limit a,b
(host or group names), --gpuinfra-roles r1,r2, --gpuinfra-hosts a,b (exact host names:
the share of one process when `gpuinfra verify` runs several), --gpuinfra-results FILE.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import pytest
from testinfra.backend.paramiko import ParamikoBackend
from testinfra.host import Host

from engine.context import host_context, load, topology_of
from engine.registry import PHASES
from inventory.model import LoadedCluster, StateAccess
from inventory.topology import Topology
from toolkit.spec import HostContext, settings_of
from toolkit.ssh import ssh_settings

SUITES = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuinfra")
    group.addoption("--gpuinfra-inventory", default=os.environ.get("GPUINFRA_INVENTORY"))
    group.addoption("--gpuinfra-limit", default="", help="hosts or groups, comma-separated")
    group.addoption("--gpuinfra-roles", default="", help="roles (suite folders), comma-separated")
    group.addoption("--gpuinfra-results", default=None, help="write one JSON record per test")
    group.addoption("--gpuinfra-hosts", default="", help="only these hosts (a shard of a run)")


def _split(value: str) -> set[str]:
    return {part.strip() for part in value.split(",") if part.strip()}


@cache
def _load(path: str) -> LoadedCluster:
    # Checks read the cluster's state and never create it (a missing secret is an error).
    return load(Path(path)).with_state_access(StateAccess.existing)


def _cluster(config: pytest.Config) -> LoadedCluster:
    path = config.getoption("--gpuinfra-inventory")
    if not path:
        raise pytest.UsageError("no inventory: pass --gpuinfra-inventory or set GPUINFRA_INVENTORY")
    return _load(path)


def suite_role(path: Path) -> str | None:
    """The role a test file verifies: the first folder under tests/verify/."""
    try:
        relative = path.resolve().relative_to(SUITES)
    except ValueError:
        return None
    return relative.parts[0] if len(relative.parts) > 1 else None


def role_groups(role: str) -> tuple[str, ...] | None:
    """The groups a role's phases target; None when any of them targets every host."""
    groups: set[str] = set()
    for phase in PHASES:
        if phase.role == role:
            if phase.groups is None:
                return None
            groups.update(phase.groups)
    return tuple(sorted(groups))


def targets(loaded: LoadedCluster, groups: tuple[str, ...] | None, limit: set[str]) -> list[str]:
    names = []
    for name, entry in loaded.cluster.hosts.items():
        if groups is not None and not set(groups) & set(entry.groups):
            continue
        if limit and name not in limit and not limit & set(entry.groups):
            continue
        names.append(name)
    return names


def role_settings(loaded: LoadedCluster, host: str, role: str) -> object:
    """The host's settings of a role, or None for a folder that names no registered role."""
    try:
        return settings_of(loaded, host, role)
    except (KeyError, ModuleNotFoundError):
        return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    roles = _split(config.getoption("--gpuinfra-roles"))
    role = suite_role(collection_path)
    if roles and role is not None and role not in roles:
        return True
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" not in metafunc.fixturenames:
        return
    loaded = _cluster(metafunc.config)
    role = suite_role(Path(str(metafunc.definition.path)))
    groups = getattr(metafunc.module, "TARGET_GROUPS", None)
    if groups is None and role is not None:
        groups = role_groups(role)
    limit = _split(metafunc.config.getoption("--gpuinfra-limit"))
    names = targets(loaded, groups, limit)
    if role is not None and getattr(metafunc.module, "ONLY_WHERE_ENABLED", False):
        # A role whose `enabled: false` means it installs nothing on a host (kubernetes) has
        # nothing to check there: no target, so a module left without any is deselected, not
        # skipped. (The firewall's `enabled: false` keeps its table: still checked.)
        names = [n for n in names if getattr(role_settings(loaded, n, role), "enabled", True)]
    shard = _split(metafunc.config.getoption("--gpuinfra-hosts"))
    if shard:
        names = [name for name in names if name in shard]
    metafunc.parametrize("target", names, scope="module")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A module with no target among the selected hosts (its role runs elsewhere, or another
    process of the run has those hosts) has nothing to check: deselect it, not a skip."""
    idle = [
        item
        for item in items
        if "target" in getattr(item, "fixturenames", ())
        # An empty parameter set leaves a placeholder, not a host name, in the item's params.
        and not isinstance(
            getattr(getattr(item, "callspec", None), "params", {}).get("target"), str
        )
    ]
    if idle:
        config.hook.pytest_deselected(items=idle)
        items[:] = [item for item in items if item not in idle]


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> LoadedCluster:
    return _cluster(request.config)


@pytest.fixture(scope="session")
def _connections(cluster: LoadedCluster):
    opened: dict[str, Host] = {}
    yield opened
    for connected in opened.values():
        connected.backend.client.close()


@pytest.fixture
def host(target: str, cluster: LoadedCluster, _connections: dict[str, Host]) -> Host:
    if target not in _connections:
        _connections[target] = connect(cluster, target)
    return _connections[target]


@pytest.fixture(scope="session")
def topology(cluster: LoadedCluster) -> Topology:
    return topology_of(cluster)


@pytest.fixture
def ctx(target: str, cluster: LoadedCluster, topology: Topology) -> HostContext:
    return host_context(cluster, target, topology)


@pytest.fixture(autouse=True)
def _label(request: pytest.FixtureRequest, target: str, record_property) -> None:
    """Label every result with its host and role: JUnit and `gpuinfra verify` group by them."""
    record_property("host", target)
    record_property("role", suite_role(Path(str(request.node.path))) or "")


class ResultRecorder:
    """One record per test (role, host, test, outcome, message) for `gpuinfra verify`'s report."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.results: list[dict[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        failed_setup = report.when == "setup" and not report.passed
        if report.when != "call" and not failed_setup:
            return
        labels = dict(report.user_properties)
        message = ""
        if not report.passed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
        self.results.append(
            {
                "role": str(labels.get("role", "")),
                "host": str(labels.get("host", "")),
                "test": report.nodeid.split("::")[-1],
                "outcome": "error" if failed_setup and report.failed else report.outcome,
                "message": message.strip().splitlines()[0] if message.strip() else "",
                "seconds": round(report.duration, 3),
            }
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.path:
            Path(self.path).write_text(json.dumps(self.results, indent=1))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(
        ResultRecorder(config.getoption("--gpuinfra-results")), "gpuinfra-results"
    )


def connect(loaded: LoadedCluster, name: str) -> Host:
    """A testinfra Host over paramiko that refuses unknown and changed host keys (the bastion's
    too): testinfra's own paramiko backend only warns about them. toolkit/ssh.py builds the
    client, with the same settings pyinfra and the ssh command lines get."""
    settings = ssh_settings(loaded)
    address = str(loaded.cluster.hosts[name].address)
    client = settings.connect(address)
    backend = ParamikoBackend(f"paramiko://{settings.user}@{address}:{settings.port}")
    backend.__dict__["client"] = client  # replaces testinfra's cached, warn-only client
    return Host(backend)
