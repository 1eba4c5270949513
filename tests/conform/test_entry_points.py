"""``wb.conform`` stays the checker however the package is imported: importing the subpackage
``workbench.conform`` (a dump writer does) binds the module where ``wb.conform`` stands, so the package is
callable itself, and ``wb.conform(dump)`` and ``import workbench.conform.dump as d`` both work in any order
(never "'module' object is not callable"). Every submodule imported, the documented entry points are what
docs/API.md says they are."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import types

import workbench as wb


def import_every_submodule() -> list[str]:
    """Every module of the package but the ``__main__`` ones (they run a command); those whose optional
    dependency is missing here are skipped. -> the skipped names."""
    skipped: list[str] = []
    for info in pkgutil.walk_packages(wb.__path__, "workbench.", onerror=skipped.append):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as e:  # an optional extra (vLLM, SGLang, the notebook stack) not installed
            if (e.name or "").split(".")[0] in ("workbench", "ddtree_kernels"):
                raise  # our own module missing is a bug
            skipped.append(info.name)
    return skipped


def test_the_entry_points_are_still_the_documented_ones_after_every_submodule_is_imported():
    import workbench.conform.check
    import workbench.conform.engine_dump  # noqa: F401  (what writing a dump imports)

    import_every_submodule()
    for name in ("pays_off", "compare"):
        fn = getattr(wb, name)
        assert inspect.isfunction(fn), (name, fn)
    assert callable(wb.conform) and wb.conform is sys.modules["workbench.conform"]  # the package, callable
    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(wb.conform) == params(workbench.conform.check.conform)
    import workbench.conform.dump as dump_module  # the package's modules reachable through it as ever

    assert dump_module.read_dump is sys.modules["workbench.conform.dump"].read_dump
    assert isinstance(wb.views, types.ModuleType) and wb.views.__name__ == "workbench.views"
    assert inspect.isclass(wb.Stepper)
    modules = {n for n in wb.__all__ if isinstance(getattr(wb, n), types.ModuleType)}
    assert modules == {"analysis", "conform", "shapes", "views"}, modules


def test_wb_conform_answers_twice_in_one_process(tmp_path):
    """The first example of docs/conformance.md calls it after a dump was written; then again."""
    import pytest

    for _ in range(2):  # a DumpFileError (a ValueError) each time, not TypeError: 'module' object is not callable
        with pytest.raises(ValueError, match="no such file"):
            wb.conform(tmp_path / "none.dump")
