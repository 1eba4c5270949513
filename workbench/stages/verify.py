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
    mask: Tensor | None  # bool [1, 1, n, start + n], None for a single token (plain causal decode)
    record: ForwardRecord
    top2_tokens: Tensor | None = None  # int64 [1, n, 2]: the target's two best tokens at every node
    top2_logits: Tensor | None = None  # [1, n, 2] in the model's dtype: their logits (explain divergences)


def verify_mask(compiled: CompiledTree, start: int) -> Tensor:
    """[1, 1, n, start + n]: every node sees the whole committed prefix and its own ancestors."""
    vis = compiled.visibility  # [1, n, n]
    prefix = torch.ones(vis.shape[0], vis.shape[1], start, dtype=torch.bool, device=vis.device)
    return torch.cat([prefix, vis], dim=2)[:, None]


def verify(models, cache, tree: Tree, compiled: CompiledTree, start: int, mode: ForwardMode,
           sampling: Sampling, generator, need_features: bool, capture=None) -> Verified:
    n = tree.n
    mask = verify_mask(compiled, start) if n > 1 else None
    out = run_target(models.target, tree.tokens, compiled.positions, cache, mode,
                     models.target_layer_ids if need_features else None, mask, capture)
    choice, prob = target_choice(out.logits, sampling, generator)
    top2 = out.logits.topk(2, dim=-1)  # one small kernel; lets wb.first_divergence name near-ties
    return Verified(choice, prob, out.features, mask, out.record, top2.indices, top2.values)
