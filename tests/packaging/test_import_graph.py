"""No import circles in the package (function-level imports counted), the rooms keep their direction, and no
private name crosses a module boundary (tools/import_graph.py draws the graph and finds both)."""
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


def test_function_level_imports_count_and_type_checking_ones_do_not(tmp_path, monkeypatch):
    """A circle hidden in a function body is a circle (it only waits for the first call); an import under
    ``if TYPE_CHECKING:`` never runs and is not an arrow."""
    pkg = tmp_path / "workbench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from workbench import b\n")
    (pkg / "b.py").write_text("def f():\n    try:\n        from workbench.a import x\n    except ImportError:\n"
                              "        pass\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from workbench import a\n"
                              "else:\n    import workbench.b\n")
    monkeypatch.setattr(ig, "ROOT", tmp_path)
    monkeypatch.setattr(ig, "PACKAGE", pkg)
    monkeypatch.setattr(ig, "MODULES", {ig.module_name(p): p for p in pkg.rglob("*.py")})
    g = ig.graph()
    assert g["workbench.b"] == {"workbench.a"} and g["workbench.c"] == {"workbench.b"}
    assert ig.circles(g) == [["workbench.a", "workbench.b"]]


def test_records_and_models_do_not_reach_up_into_the_engine_or_serving():
    arrows = ig.room_arrows(ig.graph())
    assert arrows.get("workbench.records", set()) == set()
    assert not arrows.get("workbench.models", set()) & {"workbench.engine", "workbench.serve", "workbench.views"}
    assert "workbench.views" not in set().union(*[arrows.get(r, set()) for r in
                                                  ("workbench.engine", "workbench.models", "workbench.serve")])


def test_no_submodule_imports_the_top_level_package():
    """``import workbench as wb`` inside the package closes a circle through workbench/__init__.py (which
    imports the engine, the shapes, the client); a module imports the module that holds what it needs."""
    g = ig.graph()
    inside = {m for m, deps in g.items() if "workbench" in deps and m != "workbench.__main__"}
    reached = ig.circles(g)
    assert not [c for c in reached if "workbench" in c], inside


def test_no_private_name_crosses_a_module():
    assert ig.private_reach_ins() == []


def test_the_private_name_finder_names_each_planted_reach_in(tmp_path, monkeypatch):
    pkg = tmp_path / "workbench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_secret = 1\nclass K:\n    @staticmethod\n    def _m():\n        return _secret\n")
    (pkg / "b.py").write_text("from workbench.a import _secret\n")
    (pkg / "c.py").write_text("from workbench import a\nfrom workbench.a import K\nx = a._secret + K._m()\n")
    (pkg / "d.py").write_text("from dflash.model import _draft_value\n")
    (pkg / "e.py").write_text("import dflash.model\ny = dflash.model._draft_value\n")
    (pkg / "f.py").write_text("from workbench.a import K\nz = K.public if K else None\n")  # nothing private
    monkeypatch.setattr(ig, "ROOT", tmp_path)
    monkeypatch.setattr(ig, "PACKAGE", pkg)
    monkeypatch.setattr(ig, "KERNELS", tmp_path / "kernels")
    found = ig.private_reach_ins(sorted(pkg.glob("*.py")))
    assert found[:3] == ["workbench/b.py:1: from workbench.a import _secret",
                         "workbench/c.py:3: a._secret (workbench.a)", "workbench/c.py:3: K._m (workbench.a.K)"]
    assert len(found) == 4 and found[3].startswith("dflash.model._draft_value (a third-party private) used in more "
                                                   "than one module: workbench/d.py:1, workbench/e.py:2")


def test_no_import_climbs_a_floor():
    """Interfaces below what implements them (tools/import_graph.py : FLOORS, drawn in docs/architecture.md):
    an import from a room to its own floor or a higher one, or a room on no floor, is named."""
    assert ig.upward_imports(ig.graph()) == []


def test_the_floor_check_names_a_planted_climb_and_an_unplaced_room(monkeypatch):
    g = {"workbench.engine.core": {"workbench.conform.dump"}, "workbench.conform.dump": {"workbench.records.files"},
         "workbench.records.files": set(), "workbench.newroom.x": set()}
    found = ig.upward_imports(g)
    assert found == ["room workbench.newroom is on no floor (add it to FLOORS)",
                     "workbench.engine.core -> workbench.conform.dump (floor 4 -> 6)"]


def test_the_kernels_are_a_room_of_the_graph():
    g = ig.graph()
    assert "ddtree_kernels" in {ig.room(m) for m in g}
    assert any(d.startswith("ddtree_kernels") for deps in g.values() for d in deps)
