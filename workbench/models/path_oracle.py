"""Model-level oracle for tree verify on any target, hybrids included: each node's logits from its own path.

``path_logits`` runs every root-to-node path as a plain chain through transformers' own model and its own
cache (prefill the committed context once; node i continues a copy of its parent's cache by one decode
step): slow, and obviously correct for recurrent layers, since nothing but a node's ancestors ever touches
its state. The test checks it against one uncached forward of context + path per node.
``flattened_logits`` is the naive tree verify a dense target gets away with: one forward of every node
with the tree attention mask and depth positions. Attention layers honour the mask; a GatedDeltaNet layer
takes none, so its conv and state run over the flattened order and a sibling continues from the branch
before it (``tests/models/test_hybrid_oracle.py`` measures by how much).
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor

from ddtree_kernels import Tree, compile_tree


def prefill(model, context: Tensor):
    """context: [L] token ids -> (logits of the last context token [V], the model's own cache after it)."""
    out = model(input_ids=context[None], use_cache=True)
    return out.logits[0, -1], out.past_key_values


@torch.no_grad()
def path_logits(model, context: Tensor, tree: Tree, return_caches: bool = False):
    """Every node's logits from its own path. context: [bs, L] committed ids (the root, tree.tokens[:, 0], comes
    after them); tree: [bs, n]. -> logits [bs, n, V] float32 (and, with ``return_caches``, caches[b][i]: the
    model's cache after consuming node i's path, i.e. the request's state if i is the last accepted node).

    Node i's cache is a copy of its parent's (the prefilled context's at the root) that then takes token i as
    a one-token decode step: the chain root ... i, run incrementally, touching nothing but i's ancestors.
    """
    bs, n = tree.tokens.shape
    rows, caches = [], []
    for b in range(bs):
        _, base = prefill(model, context[b])
        row, kept = [], []
        for i, p in enumerate(tree.parents[b].tolist()):
            cache = copy.deepcopy(base if p < 0 else kept[p])
            out = model(input_ids=tree.tokens[b, i].reshape(1, 1), past_key_values=cache, use_cache=True)
            row.append(out.logits[0, -1].float())
            kept.append(cache)
        rows.append(torch.stack(row))
        caches.append(kept)
    logits = torch.stack(rows)
    return (logits, caches) if return_caches else logits


@torch.no_grad()
def flattened_logits(model, context: Tensor, tree: Tree) -> Tensor:
    """The naive tree verify: one forward of all n nodes after the prefilled context, with the tree mask
    (additive, [1, 1, n, L + n]) and positions L + depth. context: [bs, L]; -> logits [bs, n, V] float32."""
    bs, n = tree.tokens.shape
    L = context.shape[1]
    rows = []
    for b in range(bs):
        _, cache = prefill(model, context[b])
        vis = compile_tree(tree[b], L).visibility  # [1, n, n] ancestor-or-self
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(1, 1, n, L + n, dtype=dtype)
        mask[..., L:].masked_fill_(~vis[:, None], torch.finfo(dtype).min)
        out = model(input_ids=tree.tokens[b : b + 1], position_ids=L + tree.depth[b : b + 1], attention_mask=mask,
                    past_key_values=cache, use_cache=True)
        rows.append(out.logits[0].float())
    return torch.stack(rows)
