"""DDTree: the ``budget`` best prefixes of the drafter's per-slot log-probs, verified as one tree."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ddtree_kernels import build_tree_from_topk
from ddtree_kernels.tree_build import build_tree_vectorized, sorted_slots
from workbench.engine.policies.base import MAX_BUDGET, Policy, register

# str(policy) written back: 'DDTree(32)', 'DDTree(16, width=1)', 'DDTree(budget=16, width=None)'
_CALL = re.compile(r"ddtree\((?:budget=)?\s*([^,()]*?)\s*(?:,\s*(?:width=)?\s*([^,()]*?)\s*)?\)")


@register
@dataclass(frozen=True)
class DDTree(Policy):
    """The ``budget`` best prefixes of the drafter's per-slot log-probs, verified as one tree.

    ``width`` caps the candidate tokens per slot (None: up to ``budget``);
    ``DDTree(budget=B-1, width=1)`` is the argmax chain, i.e. linear DFlash.
    """

    budget: int = 32
    width: int | None = None
    kind = "ddtree"
    usage = "ddtree:N"
    knobs = ("budget", "width")
    batched_build = True  # its build takes a cycle's rows at once (the stage groups them)

    def __post_init__(self):
        b = self.budget
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"DDTree budget={b!r} must be a positive integer (e.g. DDTree(budget=32))")
        if b > MAX_BUDGET:
            raise ValueError(f"DDTree budget={b} is absurdly large; the limit is {MAX_BUDGET} nodes")
        w = self.width
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"DDTree width={w!r} must be a positive integer or None")

    def static_nodes(self, block_size: int) -> int:
        return self.budget + 1

    def capacity(self, slots: int, vocab: int) -> int | None:
        # at most w tokens per slot: sum_d w**d prefixes
        w = min(self.width or vocab, vocab)
        total, p = 0, 1
        for _ in range(slots):
            p *= w
            total += p
            if total >= self.budget:
                return None
        return total

    def build_tree(self, drafted, roots, sync_free):
        k = min(self.budget, self.width or self.budget)
        if sync_free:  # the device build on every device: the same tree, and no host read of the top-k
            return build_tree_vectorized(*sorted_slots(drafted.logprobs, min(k, drafted.logprobs.shape[-1])),
                                         roots, self.budget)
        return build_tree_from_topk(*drafted.top(k), roots, self.budget)

    @classmethod
    def parse(cls, t: str):
        call = _CALL.fullmatch(t.replace(" ", ""))
        if call:
            budget, width = call.group(1), call.group(2)
            try:
                nums = [int(budget), None if width in (None, "", "none") else int(width)]
            except ValueError:
                raise ValueError(f"policy {t!r}: the budget and width must be positive integers, as in "
                                 "'DDTree(32)' or 'DDTree(16, width=1)'") from None
            return cls(*nums)
        if not t.startswith("ddtree"):
            return None
        parts = t.split(":")
        try:
            nums = [int(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"policy {t!r}: the budget must be a positive integer, as in 'ddtree:32'") from None
        if not 1 <= len(nums) <= 2:
            raise ValueError(f"policy {t!r}: write 'ddtree:N' with a budget N, e.g. 'ddtree:32'")
        return cls(*nums)

    def __str__(self) -> str:
        return f"DDTree({self.budget})" if self.width is None else f"DDTree({self.budget}, width={self.width})"
