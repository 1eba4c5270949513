"""The package's import graph: imports between workbench's modules (function-level ones too), and any circle.

    python tools/import_graph.py            # rooms (packages) and arrows between them, then circles
    python tools/import_graph.py --dot      # Graphviz of the same, one node per package

It also lists private names (``_x``) used across module boundaries (``private_reach_ins``): none may be.

Every import counts, the module body's and those inside function bodies alike: a function-level import
only defers a circle to the first call, it does not remove it. Imports under ``if TYPE_CHECKING:`` are left
out (type hints only, never run). ``tests/packaging/test_import_graph.py`` asserts there is no circle.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_from(node: ast.ImportFrom, name: str, is_pkg: bool) -> str:
    """The absolute module a ``from ... import`` in module ``name`` reads (relative imports resolved)."""
    base = node.module or ""
    if node.level:
        pkg = name if is_pkg else name.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            pkg = pkg.rsplit(".", 1)[0]
        base = f"{pkg}.{base}" if base else pkg
    return base


def imports_of(path: Path, name: str) -> set[str]:
    """Modules of workbench that ``path`` imports anywhere in its body (``if TYPE_CHECKING`` excluded)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()

    def visit(node: ast.AST) -> None:  # every statement, function and class bodies included
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for n in child.orelse:  # the `else:` of a TYPE_CHECKING block does run
                    visit_one(n)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] in OURS)
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, name, is_pkg)
            if base.split(".")[0] in OURS:
                for a in node.names:  # `from workbench.engine import stages` imports that module alone
                    out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
        else:
            visit(node)

    visit(tree)
    return out


OURS = ("workbench", "ddtree_kernels")
KERNELS = ROOT / "kernels"  # installed as ddtree_kernels: the house's ground floor, counted like any room


def all_modules() -> dict[str, Path]:
    """Every module of ours by its import name: workbench's and ddtree_kernels' (kernels/ on disk)."""
    mods = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    if KERNELS.is_dir():
        for p in KERNELS.rglob("*.py"):
            parts = ["ddtree_kernels", *p.relative_to(KERNELS).with_suffix("").parts]
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


MODULES = all_modules()


def graph() -> dict[str, set[str]]:
    """module -> the modules it imports by name. Python also runs every enclosing package's __init__ first;
    those implicit edges are left out, as import linters do (otherwise every module would sit in a circle
    with the top-level package, which imports the public API)."""
    return {name: {d for d in imports_of(path, name) if d in MODULES and d != name}
            for name, path in MODULES.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def room(mod: str) -> str:
    """The package a module lives in (workbench's top-level modules are their own room; ddtree_kernels is
    one room)."""
    parts = mod.split(".")
    return parts[0] if parts[0] == "ddtree_kernels" else ".".join(parts[:2])


# The floor plan, ground floor first: a room imports only rooms on floors below its own (rooms on one floor
# import neither each other). docs/architecture.md draws the same plan; a room not listed is reported.
FLOORS = [
    ["ddtree_kernels", "workbench.version", "workbench.extras", "workbench.shipped"],
    ["workbench.records"],
    ["workbench.models", "workbench.analysis"],
    ["workbench.interface"],          # the engine interface and registry: what every engine implements
    ["workbench.engine"],             # the workbench's own engine
    ["workbench.cli_args"],           # what every command module shares: value parsers, the engine options
    ["workbench.conform"],            # cycle dumps and the checker
    ["workbench.adapters"],           # production engines (vLLM in process) and the comparison report
    ["workbench.shapes"],
    ["workbench.serve"],
    ["workbench.bench"],
    ["workbench.train"],
    ["workbench.calibrate"],          # makes the calibration files the calibrated policies load (as data)
    ["workbench.payoff"],             # sizes the calibrated policies the way the calibration chooses (replays)
    ["workbench.views"],
    ["workbench", "workbench.report_command", "workbench.run_command"],  # the public API: re-exports from every
                                      # floor below; the report command, above the views it writes with (their
                                      # package needs plotly); the run command, one generation on any engine
    ["workbench.cli"],
    ["workbench.__main__"],
]


def floor_of(r: str) -> int | None:
    return next((i for i, rooms in enumerate(FLOORS) if r in rooms), None)


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    """Imports from a room to one on its own floor or above (``a -> b``, one line each), and rooms missing
    from the floor plan. The top-level package (``workbench``) re-exports the API and is the top floor."""
    out = sorted(f"room {r} is on no floor (add it to FLOORS)" for r in {room(m) for m in g}
                 if floor_of(r) is None)
    for a, deps in sorted(g.items()):
        for b in sorted(deps):
            fa, fb = floor_of(room(a)), floor_of(room(b))
            if room(a) != room(b) and fa is not None and fb is not None and fb >= fa:
                out.append(f"{a} -> {b} (floor {fa} -> {fb})")
    return out


def room_arrows(g: dict[str, set[str]]) -> dict[str, set[str]]:
    arrows: dict[str, set[str]] = {}
    for a, deps in g.items():
        for b in deps:
            if room(a) != room(b) and room(b) != "workbench":
                arrows.setdefault(room(a), set()).add(room(b))
    return arrows


# --------------------------------------------------------------------------------------------- private names


def _our_name(path: Path) -> str:
    if path.is_relative_to(KERNELS):
        rel = path.relative_to(KERNELS).with_suffix("")
        parts = ["ddtree_kernels", *rel.parts]
    else:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reach_ins(files=None) -> list[str]:
    """Private names (``_x``) used across a module boundary, one line each ("path:line: what").

    Ours (workbench, ddtree_kernels): ``from m import _x`` and ``m._x`` on a module bound by an import, from any
    other module. A third-party private (``dflash.model._draft_value``, ``torch.autograd._profiler_enabled``)
    may be used in one module of ours only, the one place that wraps it."""
    files = list(files) if files is not None else [*PACKAGE.rglob("*.py"), *KERNELS.rglob("*.py")]
    ours = ("workbench", "ddtree_kernels")
    out: list[str] = []
    foreign: dict[str, list[str]] = {}
    for path in files:
        name, is_pkg = _our_name(path), path.name == "__init__.py"
        tree = ast.parse(path.read_text())
        modules: dict[str, str] = {}  # local name -> the module it is bound to
        where = f"{path.relative_to(ROOT)}"

        def report(line: int, module: str, attr: str, how: str) -> None:
            if module.split(".")[0] in ours:
                if module != name:
                    out.append(f"{where}:{line}: {how}")
            else:
                foreign.setdefault(f"{module}.{attr}", []).append(f"{where}:{line}")

        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = imported_from(node, name, is_pkg)
                for a in node.names:
                    if _private(a.name):
                        report(node.lineno, base, a.name, f"from {base} import {a.name}")
                    else:  # `from pkg import module` binds a module (or a name; attributes of either are checked)
                        modules[a.asname or a.name] = f"{base}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                chain, v = [], node.value
                while isinstance(v, ast.Attribute):
                    chain.append(v.attr)
                    v = v.value
                if isinstance(v, ast.Name) and v.id in modules and not any(_private(c) for c in chain):
                    module = ".".join([modules[v.id], *reversed(chain)])
                    report(node.lineno, module, node.attr, f"{ast.unparse(node)} ({module})")
    for what, uses in sorted(foreign.items()):
        if len({u.rsplit(":", 1)[0] for u in uses}) > 1:
            out.append(f"{what} (a third-party private) used in more than one module: {', '.join(uses)}")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    g = graph()
    arrows = room_arrows(g)
    if "--dot" in argv:
        print("digraph workbench {\n  rankdir=LR;")
        for a in sorted(arrows):
            for b in sorted(arrows[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    for a in sorted({room(m) for m in g}):
        print(f"{a:28s} -> {', '.join(sorted(arrows.get(a, ()))) or '-'}")
    found = circles(g)
    print(f"\n{len({room(m) for m in g})} rooms, {sum(len(v) for v in arrows.values())} arrows between them; "
          f"{len(g)} modules, {sum(len(v) for v in g.values())} imports (function-level included), "
          f"{len(found)} circle(s)")
    for c in found:
        print("  circle: " + " <-> ".join(c))
    up = upward_imports(g)
    print(f"{len(up)} import(s) from a floor to its own or a higher one")
    for line in up:
        print("  " + line)
    private = private_reach_ins()
    print(f"{len(private)} private name(s) used across modules")
    for line in private:
        print("  " + line)
    return 1 if found or private or up else 0


if __name__ == "__main__":
    raise SystemExit(main())
