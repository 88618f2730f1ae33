"""Print the package-level import graph of gpuinfra, floor by floor, and exit 1 if any arrow
points up (a package importing one on a higher floor) or two floors import each other.

    python3 scripts/import_graph.py

docs/architecture.md shows its output; tests/unit/test_import_graph.py keeps the two equal.
Every import counts, including those inside functions and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Highest first; packages on one floor may not import each other either.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("benchmarks",),
    ("cli",),
    ("day2", "lab"),
    ("engine", "gpuhealth"),
    ("roles",),
    ("toolkit",),
    ("inventory",),
)
FLOOR_OF = {package: len(FLOORS) - i for i, floor in enumerate(FLOORS) for package in floor}


def imported_packages(path: Path) -> set[str]:
    """The first-party top-level packages one file imports (relative imports stay inside)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & FLOOR_OF.keys()
    return found


def package_graph(repo: Path = REPO) -> dict[str, set[str]]:
    """package -> the other first-party packages its modules import."""
    graph = {}
    for package in FLOOR_OF:
        targets: set[str] = set()
        for path in sorted((repo / package).rglob("*.py")):
            if "_assets" not in path.parts:
                targets |= imported_packages(path)
        graph[package] = targets - {package}
    return graph


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{package} -> {target}"
        for package, targets in sorted(graph.items())
        for target in sorted(targets)
        if FLOOR_OF[target] >= FLOOR_OF[package]
    ]


def figure(graph: dict[str, set[str]]) -> str:
    """One line per package, highest floor first: what it imports, every arrow pointing down."""
    lines = []
    for floor in FLOORS:
        for package in floor:
            below = sorted(graph[package], key=lambda p: (-FLOOR_OF[p], p))
            lines.append(f"{FLOOR_OF[package]}  {package:<10} -> {', '.join(below) or '(nothing)'}")
    return "\n".join(lines)


def main() -> int:
    graph = package_graph()
    print(figure(graph))
    up = arrows_up(graph)
    for arrow in up:
        print(f"arrow up: {arrow}", file=sys.stderr)
    return 1 if up else 0


if __name__ == "__main__":
    sys.exit(main())
