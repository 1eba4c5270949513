"""No import circles in the package, and the rooms keep their direction (tools/import_graph.py draws them)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
ig = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ig)


def test_no_import_circles():
    assert ig.circles(ig.graph()) == []


def test_the_circle_finder_finds_a_planted_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert ig.circles(g) == [["a", "b", "c"]]


def test_records_and_models_do_not_reach_up_into_the_engine_or_serving():
    arrows = ig.room_arrows(ig.graph())
    assert arrows.get("workbench.records", set()) == set()
    assert not arrows.get("workbench.models", set()) & {"workbench.engine", "workbench.serve", "workbench.views"}
    assert "workbench.views" not in set().union(*[arrows.get(r, set()) for r in
                                                  ("workbench.engine", "workbench.models", "workbench.serve")])
