"""Draft: one drafter forward over the block [bonus, MASK x (B-1)] -> per-slot log-probs."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ddtree_kernels.tree_build import top_slots
from workbench.forward import ForwardRecord, run_draft


@dataclass
class Draft:
    logprobs: Tensor  # float32 [1, depth, V]: slot d predicts the token at start + d + 1
    record: ForwardRecord
    _top: tuple | None = field(default=None, repr=False)

    def top(self, k: int) -> tuple[Tensor, Tensor]:
        """The k best tokens per slot in the tree build's order: (log-probs, ids), each [1, depth, k].

        Computed once for the largest k asked, so the tree build and the record share one top-k.
        """
        k = min(k, self.logprobs.shape[-1])
        if self._top is None or self._top[0].shape[-1] < k:
            self._top = top_slots(self.logprobs, k)
        v, i = self._top
        return v[..., :k], i[..., :k]


def draft(models, draft_cache, bonus: int, start: int, context: Tensor, depth: int, capture=None) -> Draft:
    """Run the drafter once. ``context`` [1, m, F] holds the target features of positions
    [start - m, start) not yet in ``draft_cache``; afterwards the cache holds exactly [0, start)."""
    B = models.block_size
    dev = models.device
    block = torch.full((1, B), models.mask_token_id, dtype=torch.long, device=dev)
    block[0, 0] = bonus
    m = context.shape[1]
    positions = torch.arange(start - m, start + B, device=dev)[None]
    logits, rec = run_draft(models.draft, models.target, block, positions, context, draft_cache, capture)
    # The block's own K/V must not stay: next cycle's block sits at other positions.
    draft_cache.crop(start - draft_cache.get_seq_length())
    return Draft(torch.log_softmax(logits[:, :depth].float(), dim=-1), rec)
