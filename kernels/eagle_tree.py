"""EAGLE-style tree build: SGLang's top-k-per-step selection, fed by a DFlash drafter's per-slot log-probs.

SGLang's EAGLE worker drafts ``steps`` times. Step 0 keeps the drafter's top-``topk``
tokens; every later step expands each of the ``topk`` beam paths by its top-``topk``
children (``topk**2`` candidates) and keeps the best ``topk`` as the next beam. Every
candidate of every step is kept; the tree is the best ``num_draft_tokens - 1`` of them
by cumulative score, in ascending candidate order (``organize_draft_results``). A DFlash
drafter gives one distribution per slot for all paths, so here every beam path's
children come from the same slot.

Candidate ids follow SGLang's flat layout: step 0 holds ids ``[0, topk)``; step i >= 1
holds ``topk + topk**2 * (i - 1) + p * topk + j`` for beam position p and token rank j.
``parent_list`` and ``selected_index`` are exactly the arrays SGLang's
``build_tree_kernel_efficient`` takes, so the same selection can be compiled by it.

Scores are summed log-probs (SGLang multiplies probabilities: the same order up to
rounding). Ties are broken one way, shared with the oracle: score descending, then
candidate id ascending. A child never scores above its parent and has a larger id, so
the selected set is always prefix-closed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree_kernels.tree_build import Tree, sorted_slots


@dataclass(frozen=True)
class EagleSelection:
    """SGLang's draft results (``organize_draft_results``) plus what a Tree needs."""

    parent_list: Tensor  # int64 [bs, topk + 1 + (steps - 2) * topk] ([bs, 0] when steps == 1)
    selected_index: Tensor  # int64 [bs, m]: chosen candidate ids, ascending (SGLang's top_scores_index)
    tokens: Tensor  # int64 [bs, m]: their tokens (SGLang's draft_tokens)
    parents: Tensor  # int64 [bs, m]: flattened parent index (0 = root, i >= 1 = selected_index[i - 1])
    depth: Tensor  # int64 [bs, m]
    rank: Tensor  # int64 [bs, m]: token rank within its slot
    score: Tensor  # float32 [bs, m]: path log-prob


def check_eagle_shape(topk, steps, num_draft_tokens) -> None:
    """One-line errors for settings SGLang would reject or that cannot fill the tree."""
    for name, v in (("topk", topk), ("steps", steps), ("num_draft_tokens", num_draft_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"EagleTree {name}={v!r} must be a positive integer")
    if num_draft_tokens < 2:
        raise ValueError(f"EagleTree num_draft_tokens={num_draft_tokens} counts the root; use at least 2")
    cands = topk + (steps - 1) * topk * topk
    if num_draft_tokens - 1 > cands:
        raise ValueError(f"EagleTree num_draft_tokens={num_draft_tokens} needs {num_draft_tokens - 1} candidates but "
                         f"topk={topk}, steps={steps} make only {cands}; raise topk or steps")


def eagle_select(logprobs: Tensor, topk: int, steps: int, num_draft_tokens: int) -> EagleSelection:
    """logprobs [bs, D, V] (D >= steps) -> the selection of SGLang's EAGLE worker, vectorized over the batch."""
    check_eagle_shape(topk, steps, num_draft_tokens)
    bs, D, V = logprobs.shape
    if steps > D or topk > V:
        raise ValueError(f"EagleTree(topk={topk}, steps={steps}) needs at least {steps} drafted slots and {topk} "
                         f"tokens; the drafter gave {D} slots of {V}")
    dev = logprobs.device
    k = topk
    topv, topi = sorted_slots(logprobs[:, :steps], k)  # [bs, steps, k]
    ar = torch.arange(k, device=dev)
    # Step 0: the beam is the slot's top-k; parents are the root.
    beam_score, beam_ids = topv[:, 0], ar.expand(bs, k)  # [bs, k]
    scores, tokens, ranks, par_ids, depths = [beam_score], [topi[:, 0]], [ar.expand(bs, k)], [torch.full((bs, k), -1, dtype=torch.long, device=dev)], [1]
    plist = [torch.arange(-1, k, device=dev).expand(bs, k + 1)]
    pos = ar.repeat_interleave(k)  # [k*k]: parent beam position of each (p, j) pair, row-major
    rank = ar.repeat(k)  # [k*k]: token rank j
    for i in range(1, steps):
        cand = (beam_score[:, :, None] + topv[:, i, None, :]).flatten(1)  # [bs, k*k]
        offset = k + k * k * (i - 1)
        scores.append(cand)
        tokens.append(topi[:, i][:, rank])
        ranks.append(rank.expand(bs, -1))
        par_ids.append(beam_ids[:, pos])
        depths.append(i + 1)
        # Next beam: the best k pairs, ties to the lower candidate id (a stable sort).
        order = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :k]  # [bs, k]
        beam_score, beam_ids = cand.gather(1, order), order + offset
        if i < steps - 1:  # SGLang drops the last step's beam from parent_list
            plist.append(beam_ids)
    parent_list = torch.cat(plist, dim=1) if steps > 1 else torch.zeros(bs, 0, dtype=torch.long, device=dev)
    all_scores = torch.cat(scores, dim=1)  # [bs, C]
    C = all_scores.shape[1]
    m = num_draft_tokens - 1
    best = torch.sort(all_scores, dim=1, descending=True, stable=True).indices[:, :m]
    sel = torch.sort(best, dim=1).values  # [bs, m] ascending ids, as organize_draft_results
    flat = torch.full((bs, C), -1, dtype=torch.long, device=dev)
    flat.scatter_(1, sel, torch.arange(1, m + 1, device=dev).expand(bs, m))
    parent_id = torch.cat(par_ids, dim=1).gather(1, sel)  # [bs, m] candidate id or -1
    parents = torch.where(parent_id < 0, 0, flat.gather(1, parent_id.clamp(min=0)))
    depth = torch.cat([torch.full((x.shape[1],), d, dtype=torch.long, device=dev) for x, d in zip(scores, depths)])
    return EagleSelection(
        parent_list=parent_list, selected_index=sel, tokens=torch.cat(tokens, dim=1).gather(1, sel),
        parents=parents, depth=depth[sel], rank=torch.cat(ranks, dim=1).gather(1, sel),
        score=all_scores.gather(1, sel),
    )


def eagle_tree(selection: EagleSelection, root_tokens: Tensor) -> Tree:
    """The selection as a flattened Tree (root first, then candidates in ascending id order)."""
    s = selection
    bs = s.tokens.shape[0]
    z = torch.zeros(bs, 1, dtype=torch.long, device=s.tokens.device)
    return Tree(
        tokens=torch.cat([root_tokens.reshape(bs, 1).long(), s.tokens], dim=1),
        parents=torch.cat([z - 1, s.parents], dim=1),
        depth=torch.cat([z, s.depth], dim=1),
        rank=torch.cat([z, s.rank], dim=1),
        score=torch.cat([z.float(), s.score], dim=1),
    )


def build_eagle_tree(logprobs: Tensor, root_tokens: Tensor, topk: int, steps: int, num_draft_tokens: int) -> Tree:
    """SGLang's EAGLE top-k-per-step tree over per-slot log-probs [bs, D, V]; n = num_draft_tokens."""
    return eagle_tree(eagle_select(logprobs, topk, steps, num_draft_tokens), root_tokens)
