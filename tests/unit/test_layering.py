"""The layering of the code base: data flows one way, inventory -> model -> per-host typed role
config -> operations -> hosts -> report, and no module imports from a layer above its own or
takes part in an import cycle. Every import counts, including those inside functions and under
TYPE_CHECKING: an import hidden in a function is still a dependency."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine.registry import ROLE_PACKAGES, ROLES_BY_NAME

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "inventory",
    "toolkit",
    "roles",
    "gpuhealth",
    "engine",
    "lab",
    "cli",
    "day2",
    "benchmarks",
)

# Lowest first; the first pattern a module matches gives its layer.
LAYERS: list[tuple[str, list[str]]] = [
    ("model", [r"inventory\.(errors|grammar|model|versions)"]),
    ("inventory", [r"inventory(\..*)?"]),
    ("role toolkit", [r"roles", r"toolkit(\..*)?"]),
    ("roles", [rf"roles\.{name}(\..*)?" for name in ROLE_PACKAGES]),
    # The GPU health agent reads its role's settings and constants; no role reads the agent.
    ("node agent", [r"gpuhealth(\..*)?"]),
    ("registry", [r"engine\.(registry|context)"]),
    ("engine", [r"engine(\..*)?"]),
    ("day-2 flows and the lab", [r"day2(\..*)?", r"lab(\..*)?"]),
    ("command line", [r"cli(\..*)?"]),
    ("benchmarks", [r"benchmarks(\..*)?"]),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    for index, (_, patterns) in enumerate(LAYERS):
        if any(re.fullmatch(pattern, module) for pattern in patterns):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def first_party_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")) if (REPO / package).is_dir() else []:
            modules[module_name(path)] = path
    return modules


MODULES = first_party_modules()


def imports_of(module: str, path: Path) -> set[str]:
    """First-party modules imported anywhere in the file (resolved to the longest known name)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    if module == "engine.registry":  # roles are imported by name (ROLE_PACKAGES)
        found |= {f"roles.{name}.role" for name in ROLE_PACKAGES}
    return found


GRAPH = {module: imports_of(module, path) for module, path in MODULES.items()}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in GRAPH.items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    """Tarjan's strongly connected components: any component of more than one module is a
    cycle (a package importing its own submodules is not: Python loads the package first)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def edges(module: str) -> list[str]:
        # A package's __init__ importing its submodules is how packages work, not a cycle.
        return [t for t in GRAPH[module] if not t.startswith(f"{module}.")]

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges(module):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not cycles, "\n".join(" <-> ".join(cycle) for cycle in cycles)


def role_of(module: str) -> str | None:
    """The role package a module belongs to (`roles.etcd.trust` -> etcd), None outside one."""
    parts = module.split(".")
    return (
        parts[1] if len(parts) > 1 and parts[0] == "roles" and parts[1] in ROLE_PACKAGES else None
    )


def role_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a role's modules (the package or any submodule) that break the floors: one
    role importing another, or an engine module other than the registry importing a role."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            role = role_of(target)
            if role is None:
                continue
            own = role_of(module)
            if own is not None and own != role:
                found.append(f"{module} (role {own}) imports {target} (role {role})")
            elif module.startswith("engine.") and module != "engine.registry":
                found.append(f"{module} (engine) imports {target}: only the registry may")
    return found


def test_no_role_imports_another_role_and_the_engine_only_through_the_registry():
    """A role's submodules count: `engine.clusterstate` importing `roles.etcd.trust` is an
    engine module importing a role (the etcd CA check is now the record's pre_apply)."""
    assert role_imports(GRAPH) == []


def test_the_role_check_sees_submodules(tmp_path):
    """The positive control: synthetic modules importing a role's submodule are flagged, as
    today's code would have been (clusterstate -> etcd.trust, kubernetes <-> fleet_policy)."""
    engine_module = tmp_path / "clusterstate.py"
    engine_module.write_text("from roles.etcd.trust import TrustRefused, check_live_ca\n")
    role_module = tmp_path / "files.py"
    role_module.write_text("from roles.fleet_policy.files import scheduler_files\n")
    graph = {
        "engine.clusterstate": imports_of("engine.clusterstate", engine_module),
        "roles.kubernetes.files": imports_of("roles.kubernetes.files", role_module),
        "roles.kubernetes.deploy": {"roles.kubernetes.files", "toolkit.spec"},  # its own: fine
    }
    assert role_imports(graph) == [
        "engine.clusterstate (engine) imports roles.etcd.trust: only the registry may",
        "roles.kubernetes.files (role kubernetes) imports roles.fleet_policy.files "
        "(role fleet_policy)",
    ]


@pytest.mark.parametrize("role", ROLE_PACKAGES)
def test_a_role_is_its_folder_and_one_registry_line(role):
    """Each role's record lives in its own package."""
    assert (REPO / "roles" / role / "role.py").is_file()
    assert ROLES_BY_NAME[role].name == role


def by_name_uses() -> list[tuple[str, str, str, str | None]]:
    """(module, function, role, name) of each `provided("role", "name")`, `settings_of(...,
    "role")` and `default_settings("role")` call in the roles: how a role reaches another."""
    found = []
    for module, path in MODULES.items():
        if role_of(module) is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
            ):
                continue
            func = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            strings = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if func == "provided" and len(strings) == 2:
                found.append((module, func, strings[0], strings[1]))
            elif func in ("settings_of", "default_settings") and strings:
                found.append((module, func, strings[-1], None))
    return found


def test_what_a_role_reaches_by_name_exists():
    """A role reads another's settings and calls what another provides by the role's name; each
    name must be a registered role and each provided function in that role's record."""
    uses = by_name_uses()
    assert {func for _, func, _, _ in uses} >= {"provided", "settings_of"}  # the scan finds them
    wrong = [
        f"{module}: {func}({role!r}, {name!r})"
        for module, func, role, name in uses
        if role not in ROLES_BY_NAME
        or (name is not None and name not in ROLES_BY_NAME[role].provides)
    ]
    assert wrong == []


def test_the_layering_check_catches_an_upward_import(tmp_path):
    """The checker itself: a role module importing the runner is reported."""
    fake = tmp_path / "bad.py"
    fake.write_text("from engine.runner import run\n")
    assert "engine.runner" in imports_of("roles.base.bad", fake)
    assert layer_of("engine.runner") > layer_of("roles.base.bad")
