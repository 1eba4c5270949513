"""The reference's forwards under a suspected fault: what the target (or the drafter) computes when one input is
the one a known bug hands it, so that the diagnosis (``workbench.conform.diagnosis``) can hold it against what an
engine recorded.

- ``logits_at``: every tree node's logits from its own root-to-node path, at the positions given (any target:
  a plain causal forward per path, so recurrent layers see only the node's ancestors);
- ``masked_logits``: every node's logits under a given visibility and positions (one forward after the context,
  as a tree verify runs it; attention-only targets: a recurrent layer takes no mask);
- ``root_after``: the next root's logits after a commit that kept the K/V rows of ``kv_nodes`` and the recurrent
  state of ``state_node`` (any target: the model's own cache, assembled from each node's path cache);
- ``block_logits``: the drafter's block as a bug hands it (causal, the mask token in slot 0, shifted positions);
- ``agreement``: whether an engine's recorded top-k is the reproduction's, and by how much the values sit apart.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor

from workbench.conform import contracts as C


def path_rows(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Each node's root-to-node path of node indices, root first."""
    out = []
    for i in range(len(tokens)):
        path, j = [], i
        while j >= 0:
            path.append(j)
            j = parents[j]
        out.append(path[::-1])
    return out


@torch.no_grad()
def logits_at(model, context: list[int], tokens: list[int], parents: list[int], positions: list[int]) -> Tensor:
    """[n, V]: node i's logits when its path (root first) sits at ``positions`` of its nodes after ``context``
    (the root excluded, at 0..len-1). One uncached forward of n right-padded rows: causal, so the padding
    reaches no real position."""
    paths = path_rows(tokens, parents)
    P, width = len(context), max(map(len, paths))
    ids = torch.zeros(len(tokens), P + width, dtype=torch.long)  # [n, P + D + 1]
    pos = torch.zeros_like(ids)
    for i, path in enumerate(paths):
        row = [tokens[j] for j in path]
        at = [positions[j] for j in path]
        pad = width - len(path)
        ids[i] = torch.tensor(list(context) + row + [row[-1]] * pad)
        pos[i] = torch.tensor(list(range(P)) + at + [at[-1] + 1 + k for k in range(pad)])
    device = next(model.parameters()).device
    # an explicit all-ones mask: without one, transformers reads a jump in position_ids as packed sequences
    out = model(input_ids=ids.to(device), position_ids=pos.to(device), attention_mask=torch.ones_like(ids).to(device),
                use_cache=False)
    last = torch.tensor([P + len(p) - 1 for p in paths])
    return out.logits[torch.arange(len(tokens)), last].float().cpu()


@torch.no_grad()
def masked_logits(model, context: list[int], tokens: list[int], positions: list[int], visible: Tensor) -> Tensor:
    """[n, V]: every node's logits in one forward after the prefilled ``context`` (root excluded), node i seeing
    the whole context and the nodes ``visible[i]`` (bool [n, n]) at ``positions``."""
    from workbench.models.path_oracle import prefill

    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    n, P = len(tokens), len(context)
    _, cache = prefill(model, torch.tensor(context, device=device))
    mask = torch.zeros(1, 1, n, P + n, dtype=dtype, device=device)  # additive
    mask[..., P:].masked_fill_(~visible.bool().to(device)[None, None], torch.finfo(dtype).min)
    out = model(input_ids=torch.tensor([tokens], device=device), position_ids=torch.tensor([positions], device=device),
                attention_mask=mask, past_key_values=cache, use_cache=True)
    return out.logits[0].float().cpu()


class PathCaches:
    """The model's cache after each node's path of one tree (``path_oracle.path_logits``) and after the context
    alone: computed once, read by every ``root_after`` that reassembles them."""

    def __init__(self, model, context: list[int], tokens: list[int], parents: list[int]):
        from ddtree_kernels import Tree
        from workbench.models.path_oracle import path_logits, prefill

        device = next(model.parameters()).device
        ctx = torch.tensor(context, device=device)
        depth = torch.tensor([C.depths_from(parents)], device=device)
        zero = torch.zeros_like(depth)
        tree = Tree(torch.tensor([tokens], device=device), torch.tensor([parents], device=device), depth, zero,
                    zero.double())
        with torch.no_grad():
            _, self.nodes = path_logits(model, ctx[None], tree, return_caches=True)
            _, self.base = prefill(model, ctx)
        self.nodes = self.nodes[0]  # node i -> the cache after its path
        self.model, self.context_len = model, len(context)


@torch.no_grad()
def root_after(caches: PathCaches, kv_nodes: list[int], state_node: int, root: int, position: int) -> Tensor:
    """[V]: the next root's logits after a commit that kept the context's K/V, then the K/V rows of ``kv_nodes`` in
    that order, and the recurrent state (conv window and state) after ``state_node``'s path."""
    cache = copy.deepcopy(caches.nodes[state_node])
    for li, (layer, base) in enumerate(zip(cache.layers, caches.base.layers)):
        if not torch.is_tensor(getattr(base, "keys", None)):
            continue  # a recurrent layer: the state node's
        rows = [caches.nodes[j].layers[li] for j in kv_nodes]
        layer.keys = torch.cat([base.keys] + [r.keys[:, :, -1:] for r in rows], dim=2)
        layer.values = torch.cat([base.values] + [r.values[:, :, -1:] for r in rows], dim=2)
    device = next(caches.model.parameters()).device
    out = caches.model(input_ids=torch.tensor([[root]], device=device), position_ids=torch.tensor([[position]],
                       device=device), past_key_values=cache, use_cache=True)
    return out.logits[0, -1].float().cpu()


@torch.no_grad()
def block_logits(models, ids: list[int], k: int, features: Tensor, causal: bool = False, root: int | None = None,
                 shift: int = 0) -> Tensor:
    """[k, V]: the drafter's logits for slots 1..k of the block [root, mask x k] after ids[:-1] (``root``: ids[-1]
    unless given, e.g. the mask token), the block at positions P + shift .. (P = len(ids) - 1), each slot seeing the
    whole context and, with ``causal``, only the block's slots up to its own; ``features``: the context's drafter
    features [P, L*H]."""
    from workbench.models.config_facts import draft_value

    dev, dt = models.device, models.dtype
    P = len(ids) - 1
    block = torch.tensor([[ids[-1] if root is None else root] + [models.mask_token_id] * k], device=dev)
    noise = models.target.get_input_embeddings()(block) * float(draft_value(models.draft.config,
                                                                             "input_embedding_scale", 1.0))
    mask = torch.zeros(1, 1, k + 1, P + k + 1, dtype=dt, device=dev)  # additive: context all, the block all or causal
    if causal:
        mask[0, 0, :, P:].masked_fill_(torch.ones(k + 1, k + 1, dtype=torch.bool, device=dev).triu(1),
                                       torch.finfo(dt).min)
    positions = torch.cat([torch.arange(P), torch.arange(P + shift, P + shift + k + 1)]).to(dev)[None]
    hidden = models.draft(position_ids=positions, noise_embedding=noise, target_hidden=features[None].to(dev, dt),
                          attention_mask=mask, use_cache=False)
    return models.draft.compute_logits(hidden[:, 1:], models.target.lm_head)[0].float().cpu()


def agreement(ids: Tensor, values: Tensor, reproduced: Tensor, tol: C.Tolerance) -> tuple[bool, float]:
    """(the engine's top-k ids [R, k] and values [R, k] are the first R rows of the reproduction's [>= R, V] within
    ``tol``, the largest |difference| over the recorded values). A drafter cut short by the token limit records
    fewer slots than its block makes."""
    R = min(ids.shape[0], reproduced.shape[0])
    problem, _ = C.topk_problem(ids[:R], values[:R], reproduced[:R], tol, "node", "value")
    want = reproduced[:R].float().gather(1, ids[:R].long())
    got = values[:R].float()
    finite = torch.isfinite(want) & torch.isfinite(got)
    diff = float((got - want).abs()[finite].max()) if bool(finite.any()) else 0.0
    return problem is None and ids.shape[0] <= reproduced.shape[0], diff
