"""One cycle, stage by stage: draft -> tree_build -> tree_compile -> verify -> accept -> commit.

Each stage is a small function with typed inputs and outputs, in the module of
the same name. The runner (``workbench.engine.runner.Rows``) calls them in order and
times them; they do not time themselves.
"""
from workbench.engine.stages.accept import accept
from workbench.engine.stages.commit import Committed, commit
from workbench.engine.stages.draft import Draft, draft
from workbench.engine.stages.tree_build import tree_build, tree_build_checked, tree_build_rows
from workbench.engine.stages.tree_compile import tree_compile
from workbench.engine.stages.verify import Verified, verify

__all__ = ["Committed", "Draft", "Verified", "accept", "commit", "draft", "tree_build", "tree_build_checked",
           "tree_build_rows", "tree_compile", "verify"]
