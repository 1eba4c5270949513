"""EagleTree: SGLang's EAGLE top-k-per-step tree over the DFlash drafter's per-slot log-probs."""
from __future__ import annotations

from dataclasses import dataclass

from ddtree_kernels.eagle_tree import build_eagle_tree, check_eagle_shape
from workbench.engine.policies.base import MAX_BUDGET, Policy, register


@register
@dataclass(frozen=True)
class EagleTree(Policy):
    """SGLang's EAGLE tree over the DFlash drafter's per-slot log-probs: ``topk`` tokens per step,
    each later step expanding the best ``topk`` paths, ``steps`` deep; the best
    ``num_draft_tokens - 1`` candidates are verified with the root (SGLang's
    ``speculative_eagle_topk``, ``speculative_num_steps``, ``speculative_num_draft_tokens``).

    ``EagleTree(num_draft_tokens=N + 1)`` verifies as many tokens as ``DDTree(budget=N)``.
    """

    topk: int = 4
    steps: int = 5
    num_draft_tokens: int = 16
    kind = "eagle"
    usage = "eagle:TOPK:STEPS:N"
    knobs = ("num_draft_tokens", "topk")

    def __post_init__(self):
        check_eagle_shape(self.topk, self.steps, self.num_draft_tokens)
        if self.num_draft_tokens - 1 > MAX_BUDGET:
            raise ValueError(f"EagleTree num_draft_tokens={self.num_draft_tokens} is absurdly large; the limit is "
                             f"{MAX_BUDGET + 1}")

    @property
    def budget(self) -> int:
        return self.num_draft_tokens - 1

    def static_nodes(self, block_size: int) -> int:
        return self.num_draft_tokens

    def check_slots(self, slots: int) -> None:
        if self.steps > slots:
            raise ValueError(f"{self} has steps={self.steps} but this drafter drafts {slots} slots per cycle; "
                             f"use steps <= {slots}")

    def build_tree(self, drafted, roots, sync_free):
        lp = drafted.logprobs
        # Near the end of a generation fewer slots are drafted: the tree gets shallower, not invalid.
        steps = min(self.steps, lp.shape[1])
        k = self.topk
        return build_eagle_tree(lp, roots, k, steps, min(self.num_draft_tokens, 1 + k + (steps - 1) * k * k))

    @classmethod
    def parse(cls, t: str):
        if not t.startswith("eagle"):
            return None
        # 'eagle:4:5:16', or str / repr written back: 'EagleTree(4, 5, 16)', 'EagleTree(topk=4, ...)'
        args = t[len("eagletree("):-1].split(",") if t.startswith("eagletree(") and t.endswith(")") else t.split(":")[1:]
        try:
            nums = [int(a.split("=")[-1]) for a in args]
        except ValueError:
            nums = []
        if len(nums) != 3:
            raise ValueError(f"policy {t!r}: write 'eagle:TOPK:STEPS:N', e.g. 'eagle:4:5:16'")
        return cls(*nums)

    def __str__(self) -> str:
        return f"EagleTree({self.topk}, {self.steps}, {self.num_draft_tokens})"
