"""The package-level import graph (scripts/import_graph.py): every arrow points down, and
docs/architecture.md shows the graph as it is."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts/import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)


def test_no_arrow_points_up():
    assert import_graph.arrows_up(import_graph.package_graph()) == []


def test_an_arrow_up_is_reported():
    """The positive control: the toolkit importing the engine, a role the command line, and
    day2 and lab (one floor) each other."""
    graph = {package: set() for package in import_graph.FLOOR_OF}
    graph["toolkit"] = {"engine", "inventory"}
    graph["roles"] = {"cli", "toolkit"}
    graph["day2"] = {"lab", "engine"}
    assert import_graph.arrows_up(graph) == ["day2 -> lab", "roles -> cli", "toolkit -> engine"]


def test_the_architecture_document_shows_the_current_graph():
    figure = import_graph.figure(import_graph.package_graph())
    assert figure in (REPO / "docs/architecture.md").read_text(), figure
