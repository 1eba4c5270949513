"""Draft: one drafter forward over every row's block [root, MASK x (B-1)] -> per-slot log-probs."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ddtree_kernels.tree_build import top_slots
from workbench.records.forward import ForwardRecord


@dataclass
class Draft:
    logprobs: Tensor  # float32 [1, depth, V]: slot d predicts the token at start + d + 1
    record: ForwardRecord
    _top: tuple | None = field(default=None, repr=False)
    # [1, depth, H]: each slot's final hidden state (the LM head's input), or None from a drafter that keeps none
    hidden: Tensor | None = field(default=None, repr=False)

    def top(self, k: int) -> tuple[Tensor, Tensor]:
        """The k best tokens per slot in the tree build's order: (log-probs, ids), each [1, depth, k].

        Computed once for the largest k asked, so the tree build and the record share one top-k.
        """
        k = min(k, self.logprobs.shape[-1])
        if self._top is None or self._top[0].shape[-1] < k:
            self._top = top_slots(self.logprobs, k)
        v, i = self._top
        return v[..., :k], i[..., :k]

    @classmethod
    def stack(cls, drafts: list["Draft"]) -> "Draft":
        """Several rows' drafts of one depth as one (logprobs [n, D, V]), for a policy that builds their trees
        at once; its top-k is computed once for all of them and handed back to each row, so a row's record
        still shares the top-k its tree was built from."""
        hidden = None if any(d.hidden is None for d in drafts) else torch.cat([d.hidden for d in drafts])
        return StackedDraft(torch.cat([d.logprobs for d in drafts]), drafts[0].record, hidden=hidden, rows=drafts)


@dataclass
class StackedDraft(Draft):
    rows: list = field(default_factory=list, repr=False)  # the rows' own Drafts, in order

    def top(self, k: int) -> tuple[Tensor, Tensor]:
        v, i = super().top(k)  # [n, D, k] each
        for b, d in enumerate(self.rows):
            if d._top is None or d._top[0].shape[-1] < v.shape[-1]:
                d._top = (v[b : b + 1], i[b : b + 1])
        return v, i


def draft(drafter, roots: list[int], starts: list[int], depths: list[int | None], observe=None) -> list[Draft | None]:
    """Run the drafter once for every row (``drafter``: its state, holding each row's pending context).
    ``depths[b]``: slots row b keeps, or None where the row drafts nothing this cycle. ``observe``: None, or a
    callable given each row's ``DraftInput`` (what the forward was handed; ``cycle.hook_draft_input``)."""
    # Without an observer the state is called with two arguments: a model state that takes no observer still works.
    logits, rec = drafter.draft(roots, starts) if observe is None else drafter.draft(roots, starts, observe)  # [B, block - 1, V]
    hidden = getattr(drafter, "hidden", None)  # [B, block - 1, H] or None
    if len(roots) == 1:  # log-softmax only the kept slots
        return [Draft(torch.log_softmax(logits[:, : depths[0]].float(), dim=-1), rec,
                      hidden=None if hidden is None else hidden[:, : depths[0]])]
    deepest = max(d for d in depths if d is not None)
    lp = torch.log_softmax(logits[:, :deepest].float(), dim=-1)
    return [None if d is None else Draft(lp[b : b + 1, :d], rec, hidden=None if hidden is None else hidden[b : b + 1, :d])
            for b, d in enumerate(depths)]
