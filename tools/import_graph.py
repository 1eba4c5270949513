"""The package's import graph: module-level imports between workbench's modules, and any circle in it.

    python tools/import_graph.py            # rooms (packages) and arrows between them, then circles
    python tools/import_graph.py --dot      # Graphviz of the same, one node per package

Only imports that run when a module is imported count (the module body, not function bodies): those are
the ones that can make a circle. ``tests/packaging/test_import_graph.py`` asserts there is none.
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


def top_level_imports(path: Path, name: str) -> set[str]:
    """Modules of workbench that ``path`` imports at module level (``if TYPE_CHECKING`` excluded)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("workbench"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name if is_pkg else name.rsplit(".", 1)[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rsplit(".", 1)[0]
                    base = f"{pkg}.{base}" if base else pkg
                if not base.startswith("workbench"):
                    continue
                for a in node.names:  # `from workbench.engine import stages` imports that module alone
                    out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)

    visit(tree.body)
    return out


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def graph() -> dict[str, set[str]]:
    """module -> the modules it imports by name. Python also runs every enclosing package's __init__ first;
    those implicit edges are left out, as import linters do (otherwise every module would sit in a circle
    with the top-level package, which imports the public API)."""
    return {name: {d for d in top_level_imports(path, name) if d in MODULES and d != name}
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
    """The package a module lives in (workbench's top-level modules are their own room)."""
    parts = mod.split(".")
    return ".".join(parts[:2])


def room_arrows(g: dict[str, set[str]]) -> dict[str, set[str]]:
    arrows: dict[str, set[str]] = {}
    for a, deps in g.items():
        for b in deps:
            if room(a) != room(b) and room(b) != "workbench":
                arrows.setdefault(room(a), set()).add(room(b))
    return arrows


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
    print(f"\n{len(g)} modules, {sum(len(v) for v in g.values())} module-level imports, "
          f"{len(found)} circle(s)")
    for c in found:
        print("  circle: " + " <-> ".join(c))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
