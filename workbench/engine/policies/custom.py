"""TreePolicy: your own tree build, a Python function, checked on every cycle."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ddtree_kernels import validate_tree
from workbench.engine.policies.base import MAX_BUDGET, Policy, register


@register
@dataclass(frozen=True)
class TreePolicy(Policy):
    """Your own tree: ``build(logprobs [bs, D, V], root_tokens [bs], budget) -> ddtree_kernels.Tree``.

    The engine checks every tree it returns (``ddtree_kernels.validate_tree``: root first, parents
    before children, at most ``budget`` drafted nodes, depth <= D, tokens in the vocabulary,
    distinct sibling tokens) and stops with a one-line error naming the first violation.
    """

    build: Callable
    name: str = "custom"
    budget: int = 32
    kind = "tree"
    usage = ""  # no spelling: a function cannot be written as text
    servable = False
    knobs = ("budget",)

    def __post_init__(self):
        if not callable(self.build):
            raise TypeError(f"TreePolicy build={self.build!r} is not callable; pass fn(logprobs, root_tokens, budget)")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TreePolicy name={self.name!r} must be a non-empty string")
        b = self.budget
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BUDGET:
            raise ValueError(f"TreePolicy budget={b!r} must be an integer in [1, {MAX_BUDGET}]")

    @property
    def label(self) -> str:
        return self.name

    def static_nodes(self, block_size: int) -> int:
        return self.budget + 1

    def build_tree(self, drafted, roots, sync_free):
        lp = drafted.logprobs
        tree = self.build(lp, roots, self.budget)
        validate_tree(tree, self.budget, lp.shape[-1], roots, lp.shape[1], who=f"TreePolicy {self.name!r}")
        return tree

    @classmethod
    def parse(cls, t: str):
        return None

    def __str__(self) -> str:
        return f"{self.name}({self.budget})"
