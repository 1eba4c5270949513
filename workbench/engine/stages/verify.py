"""Verify: one target forward over every row's tree, then the target's choice at every node."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels.greedy import greedy_choice
from workbench.records.forward import ForwardMode, ForwardRecord
from workbench.models.layout import TreeLayout
from workbench.engine.sampling import Sampling, target_choice


@dataclass
class Verified:
    choice: Tensor  # int64 [B, N]
    choice_prob: Tensor  # float32 [B, N]
    features: Tensor | None  # [B, N, F]: drafter context for the accepted rows
    record: ForwardRecord
    top2_tokens: Tensor | None = None  # int64 [B, N, 2]: the target's two best tokens at every node
    top2_logits: Tensor | None = None  # [B, N, 2] in the model's dtype: their logits (explain divergences)

    def row(self, b: int, n: int) -> "Verified":
        """Row b's first n nodes, [1, n] (the row itself when it is the only one and unpadded)."""
        if self.choice.shape == (1, n):
            return self
        f = None if self.features is None else self.features[b : b + 1, :n]
        return Verified(self.choice[b : b + 1, :n], self.choice_prob[b : b + 1, :n], f, self.record,
                        self.top2_tokens[b : b + 1, :n], self.top2_logits[b : b + 1, :n])


def verify(state, layout: TreeLayout, mode: ForwardMode, samplings: list[Sampling],
           generators: list, sync_free: bool = False) -> Verified:
    """``state``: the target's ``TargetState``. Row b chooses with ``samplings[b]`` from ``generators[b]``,
    over its own nodes only, so a batch consumes each generator as that request alone would.
    ``sync_free``: read no value on the host (static shapes)."""
    out = state.decode(layout) if mode == ForwardMode.DECODE else state.verify(layout)
    # The top-2 at every node names near-ties (wb.first_divergence); greedy rows read their choice off it.
    if all(s.greedy for s in samplings):
        choice, top2_logits, top2_tokens = greedy_choice(out.logits, sync_free)  # the first of equal logits
        # The choice's probability: its logit is the largest, top2's first value.
        prob = torch.exp(top2_logits[..., 0].float() - torch.logsumexp(out.logits.float(), dim=-1))
        return Verified(choice, prob, out.features, out.record, top2_tokens, top2_logits)
    top2_logits, top2_tokens = out.logits.topk(2, dim=-1)
    if len(samplings) == 1:
        choice, prob = target_choice(out.logits, samplings[0], generators[0])
    else:
        choice = torch.zeros(layout.tree.tokens.shape, dtype=torch.long, device=out.logits.device)
        prob = torch.zeros(layout.tree.tokens.shape, device=out.logits.device)
        for b, (s, g, n) in enumerate(zip(samplings, generators, layout.n)):
            c, p = target_choice(out.logits[b : b + 1, :n], s, g)
            choice[b, :n], prob[b, :n] = c[0], p[0]
    return Verified(choice, prob, out.features, out.record, top2_tokens, top2_logits)
