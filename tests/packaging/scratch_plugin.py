"""A third-party package that extends the workbench through entry points only: a tree policy ('prefix:N')
and an engine ('slowref'). ``install(dest)`` lays it out as an installed distribution (its code and a
``.dist-info`` with ``entry_points.txt``) in a folder that goes on ``sys.path``, exactly what pip leaves in
site-packages; ``tests/packaging/test_plugins.py`` also pip-installs it into a scratch venv (slow)."""
from __future__ import annotations

from pathlib import Path

POLICY = '''
from dataclasses import dataclass

from ddtree_kernels import chain_tree
from workbench.engine.policies import Policy, register


@register
@dataclass(frozen=True)
class Prefix(Policy):
    """The drafter's argmax chain, cut to its first ``depth`` slots."""

    depth: int = 4
    kind = "prefix"
    usage = "prefix:N"
    knobs = ("depth",)

    def __post_init__(self):
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ValueError(f"Prefix(depth={self.depth!r}): give a whole number of slots >= 1")

    def static_nodes(self, block_size: int) -> int:
        return min(self.depth, block_size - 1) + 1

    def build_tree(self, drafted, roots, sync_free):
        lp = drafted.logprobs[:, : self.depth]  # [1, D', V]
        return chain_tree(lp.argmax(-1), roots, lp)

    def __str__(self) -> str:
        return f"Prefix({self.depth})"
'''

ENGINE = '''
from workbench.engine.core import Engine


class SlowRef(Engine):
    """The workbench's own engine under another name: what a third-party engine module looks like."""

    name = "slowref"
'''

ENTRY_POINTS = """[workbench.policies]
prefix = scratch_wb.policy

[workbench.engines]
slowref = scratch_wb.engine:SlowRef
"""

PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "scratch-wb"
version = "0.1"

[project.entry-points."workbench.policies"]
prefix = "scratch_wb.policy"

[project.entry-points."workbench.engines"]
slowref = "scratch_wb.engine:SlowRef"

[tool.setuptools]
packages = ["scratch_wb"]
"""


def write_package(src: Path) -> Path:
    """The package's source tree (pyproject.toml and scratch_wb/), for pip."""
    pkg = src / "scratch_wb"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "policy.py").write_text(POLICY)
    (pkg / "engine.py").write_text(ENGINE)
    (src / "pyproject.toml").write_text(PYPROJECT)
    return src


def install(dest: Path) -> Path:
    """The package as installed into ``dest`` (a folder to put on sys.path / PYTHONPATH)."""
    write_package(dest)
    (dest / "pyproject.toml").unlink()
    info = dest / "scratch_wb-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: scratch-wb\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return dest
