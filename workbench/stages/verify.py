"""Verify: one target forward over the whole tree, then the target's choice at every node."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels import CompiledTree, Tree
from workbench.forward import ForwardMode, ForwardRecord, run_target
from workbench.sampling import Sampling, target_choice


@dataclass
class Verified:
    choice: Tensor  # int64 [1, n]
    choice_prob: Tensor  # float32 [1, n]
    features: Tensor | None  # [1, n, F]: drafter context for the accepted rows
    mask: Tensor | None  # additive [1, 1, n, start + n] (0 = visible, -inf = hidden); None for one token
    record: ForwardRecord
    top2_tokens: Tensor | None = None  # int64 [1, n, 2]: the target's two best tokens at every node
    top2_logits: Tensor | None = None  # [1, n, 2] in the model's dtype: their logits (explain divergences)


class MaskBuffer:
    """The verify mask, kept in one buffer across cycles: every node sees the whole committed prefix
    and its own ancestors. Additive (0 / -inf) in the model's dtype, the form SDPA adds to the scores
    as it is (a bool mask is converted in every attention layer).

    Only the tree block [start, start + n) changes from cycle to cycle, so a cycle writes n x n
    entries instead of building [n, start + n] afresh.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self.buf = torch.zeros(1, 1, 0, 0, dtype=dtype, device=device)  # [1, 1, rows, cols]
        self._written: tuple[int, int] | None = None  # (start, n) of the tree block last written

    def _reserve(self, rows: int, cols: int) -> None:
        r, c = self.buf.shape[2:]
        if rows <= r and cols <= c:
            return
        # Doubling keeps growth rare; the new buffer starts all-visible.
        self.buf = torch.zeros(1, 1, max(rows, r), max(cols, 2 * c, 256), dtype=self.dtype, device=self.device)
        self._written = None

    def mask(self, visibility: Tensor, start: int) -> Tensor:
        """visibility: bool [1, n, n] ancestor-or-self -> additive mask [1, 1, n, start + n] (a view)."""
        n = visibility.shape[-1]
        self._reserve(n, start + n)
        if self._written is not None:  # columns of the last tree are prefix (or this tree) now
            s, m = self._written
            self.buf[:, :, :m, s : s + m] = 0
        block = self.buf[:, :, :n, start : start + n]
        block.masked_fill_(~visibility[:, None], float("-inf"))
        self._written = (start, n)
        return self.buf[:, :, :n, : start + n]


def verify(models, cache, tree: Tree, compiled: CompiledTree, start: int, mode: ForwardMode,
           sampling: Sampling, generator, need_features: bool, masks: MaskBuffer | None = None,
           capture=None) -> Verified:
    n = tree.n
    mask = None
    if n > 1:
        masks = masks or MaskBuffer(models.dtype, models.device)
        mask = masks.mask(compiled.visibility, start)
    out = run_target(models.target, tree.tokens, compiled.positions, cache, mode,
                     models.target_layer_ids if need_features else None, mask, capture)
    choice, prob = target_choice(out.logits, sampling, generator)
    top2 = out.logits.topk(2, dim=-1)  # one small kernel; lets wb.first_divergence name near-ties
    return Verified(choice, prob, out.features, mask, out.record, top2.indices, top2.values)
