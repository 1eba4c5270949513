"""Greedy acceptance without the engine: what linear DFlash and DDTree(budget) would accept on a
target's own greedy continuation, from transformers' forwards of the target and the drafter alone.

Under greedy verification a cycle rooted at position s (the token there is committed) accepts
the longest drafted prefix equal to the target's greedy continuation after s, and that
continuation does not depend on the drafter. So it is generated once (transformers' own cache:
right for recurrent layers too), the drafter's context features come from one causal forward
over prompt + continuation, and the drafts of every possible root are computed in one drafter
forward; each policy's cycles are then a walk over the roots. A correct engine measures the
same tau up to float rounding (features from one forward, not from cached verify forwards) and
argmax ties. Used for the hybrid pair until the engine runs hybrid targets.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """One prompt's greedy continuation and the drafter's proposals at each root."""

    ids: list[int]  # prompt + continuation, cut after the first EOS
    prompt_len: int
    max_len: int  # prompt_len + new tokens: nothing is generated past it
    full: torch.Tensor  # [R, B-1, V] log-probs, root s = prompt_len + r drafting a whole block (the engine)
    tail: torch.Tensor  # [R, B-1, V] the same, blocks cut at max_len (dflash_generate's verify size)
    prefill_agreement: float  # share of continuation tokens that one full forward's argmax also gives


def block_inputs(roots: torch.Tensor, lengths: torch.Tensor, ids: torch.Tensor, mask_id: int):
    """One drafter block per root: [root token, MASK * (length-1)] at positions root .. root+length-1,
    seeing the context strictly before its root and its whole block (as in training and decoding).
    roots, lengths [R], ids [T] -> block_ids [1, N], attention mask [1, 1, N, T + N], position ids
    [1, T + N], first [R] (each block's offset), with N = lengths.sum()"""
    T, R = ids.shape[0], roots.shape[0]
    blk = torch.arange(R).repeat_interleave(lengths)  # [N]: which block each query is in
    first = torch.cumsum(lengths, 0) - lengths  # [R]
    block_pos = roots[blk] + torch.arange(blk.shape[0]) - first[blk]  # [N]
    block_ids = torch.full_like(block_pos, mask_id)
    block_ids[first] = ids[roots]
    see_ctx = torch.arange(T)[None, :] < roots[blk][:, None]  # [N, T]
    see_blk = blk[:, None] == blk[None, :]  # [N, N]
    mask = torch.cat([see_ctx, see_blk], dim=1)[None, None]
    pos = torch.cat([torch.arange(T), block_pos])[None]
    return block_ids[None], mask, pos, first


def draft_blocks(target, draft, ids: torch.Tensor, ctx: torch.Tensor, roots: torch.Tensor,
                 lengths: torch.Tensor) -> torch.Tensor:
    """The drafter's per-slot log-probs for a block of ``lengths[r]`` at each root, in one forward.
    ids [T], ctx [1, T, F], roots/lengths [R] -> [R, B-1, V] (slots past a block's end: 0, never read)"""
    B = int(draft.block_size)
    block_ids, mask, pos, first = block_inputs(roots, lengths, ids, int(draft.mask_token_id))
    h = draft(position_ids=pos, attention_mask=mask, noise_embedding=target.get_input_embeddings()(block_ids),
              target_hidden=ctx)
    logits = draft.compute_logits(h, target.lm_head).float()[0]  # [N, V]
    lp = logits.new_zeros(len(roots), B - 1, logits.shape[-1])
    for r, (f, n) in enumerate(zip(first.tolist(), lengths.tolist())):
        lp[r, : n - 1] = logits[f + 1 : f + n].log_softmax(-1)
    return lp


@torch.no_grad()
def rollout(target, draft, prompt_ids: list[int], new_tokens: int, eos: int) -> Rollout:
    """The target's greedy continuation (transformers' own ``generate``) and the drafter's per-slot
    log-probs at every root of it."""
    from dflash.model import extract_context_feature

    P, B = len(prompt_ids), int(draft.block_size)
    x = torch.tensor([prompt_ids])
    cont = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                           eos_token_id=eos, pad_token_id=eos)[0, P:].tolist()
    cont = cont[: cont.index(eos) + 1] if eos in cont else cont
    ids = torch.tensor(prompt_ids + cont)  # [T]
    out = target(input_ids=ids[None], output_hidden_states=True)
    agree = (out.logits[0, P - 1 : -1].argmax(-1) == ids[P:]).float().mean().item()
    ctx = extract_context_feature(out.hidden_states, draft.target_layer_ids)  # [1, T, L*H]
    roots = torch.arange(P, len(ids) - 1)  # a root needs one token after it to be judged
    full = draft_blocks(target, draft, ids, ctx, roots, torch.full_like(roots, B))
    # dflash_generate drafts a shorter block near max_len; a block's slots see each other, so
    # those proposals differ from the whole block's.
    tail = full.clone()
    cut = (P + new_tokens - roots) < B
    if cut.any():
        tail[cut] = draft_blocks(target, draft, ids, ctx, roots[cut], P + new_tokens - roots[cut])
    return Rollout(ids.tolist(), P, P + new_tokens, full, tail, agree)


def accepted_on_tree(tree, truth: list[int]) -> int:
    """Depth of the deepest tree node whose path from the root equals ``truth`` (the tokens after the root)."""
    tokens, parents = tree.tokens[0].tolist(), tree.parents[0].tolist()
    children: dict[int, dict[int, int]] = {}
    for i in range(1, len(tokens)):
        children.setdefault(parents[i], {})[tokens[i]] = i
    node, depth = 0, 0
    for tok in truth:
        node = children.get(node, {}).get(tok)
        if node is None:
            break
        depth += 1
    return depth


def accepted(lp: torch.Tensor, root: int, truth: list[int], budget: int | None) -> int:
    """Greedy acceptance of one cycle: lp [depth, V]; ``budget`` None: the argmax chain (linear
    DFlash), else the DDTree(budget) tree."""
    from ddtree_kernels import build_tree

    if budget is not None:
        return accepted_on_tree(build_tree(lp[None], torch.tensor([root]), budget), truth)
    n = 0
    for tok, want in zip(lp.argmax(-1).tolist(), truth):
        if tok != want:
            break
        n += 1
    return n


def cycles(r: Rollout, budget: int | None, eos: int, convention: str = "engine") -> list[int]:
    """Tokens per cycle (accepted + bonus) of greedy linear DFlash (``budget`` None) or DDTree(budget).

    ``convention``: "engine" (workbench's Session: whole blocks, depth <= new tokens left - 1,
    accept length = accepted + 1) or "dflash_generate" (the reference: blocks cut at max_len,
    lengths cut at EOS and max_len)."""
    if convention not in ("engine", "dflash_generate"):
        raise ValueError(f"convention={convention!r} is not 'engine' or 'dflash_generate'")
    ids, P, out = r.ids, r.prompt_len, []
    start = P
    if ids[start] == eos:  # the prefill's token ends the text: no cycle
        return out
    while True:
        made = start - P + 1  # tokens generated so far, the root included
        if convention == "engine":
            if made >= r.max_len - P:
                return out
            depth = min(r.full.shape[1], r.max_len - P - made - 1)
            lp = r.full[start - P, :depth]
        else:
            if start + 1 >= r.max_len:
                return out
            depth = min(r.tail.shape[1], r.max_len - start - 1)
            lp = r.tail[start - P, :depth]
        truth = ids[start + 1 : start + 1 + depth]
        n = accepted(lp, ids[start], truth, budget) if depth else 0
        kept = min(n + 1, r.max_len - start - 1)  # the bonus past max_len is dropped
        new = ids[start + 1 : start + 1 + kept]
        if eos in new:
            kept = new.index(eos) + 1
        out.append(n + 1 if convention == "engine" else kept)
        start += kept
        if eos in new:
            return out


def slot_agreement(r: Rollout) -> tuple[list[int], list[int]]:
    """Per block slot j (1 .. B-1): (drafter argmax == target's greedy token j after the root, roots
    judged), counted over every root of the continuation."""
    D = r.full.shape[1]
    hits, seen = [0] * D, [0] * D
    top = r.full.argmax(-1).tolist()  # [R, D]
    for ri, row in enumerate(top):
        s = r.prompt_len + ri
        for j in range(D):
            if s + 1 + j >= len(r.ids):
                break
            seen[j] += 1
            hits[j] += int(row[j] == r.ids[s + 1 + j])
    return hits, seen


def figures(target, draft, tokenizer, prompts: list[dict], new_tokens: int, budget: int) -> tuple[dict, list]:
    """Simulated greedy tau of linear DFlash and DDTree(budget), pooled over ``prompts`` (all accepted
    tokens / all cycles, as the dense report), and the drafter's per-slot top-1 agreement.
    -> (figures, each prompt's greedy continuation ids)"""
    eos = tokenizer.eos_token_id
    lin, tree, agree, continuations = [], [], [], []
    hits, seen = None, None
    for item in prompts:
        ids = tokenizer(item["prompt"], add_special_tokens=False)["input_ids"]
        r = rollout(target, draft, ids, new_tokens, eos)
        continuations.append(r.ids[r.prompt_len :])
        lin += cycles(r, None, eos, "dflash_generate")  # as the dense report's dflash_tau
        tree += cycles(r, budget, eos, "engine")  # as its ddtree tau
        agree.append(r.prefill_agreement)
        h, s = slot_agreement(r)
        hits = h if hits is None else [a + b for a, b in zip(hits, h)]
        seen = s if seen is None else [a + b for a, b in zip(seen, s)]
    dflash_tau = sum(lin) / max(1, len(lin))
    tree_tau = sum(tree) / max(1, len(tree))
    return {
        "sim_dflash_tau": dflash_tau,
        f"sim_ddtree{budget}_tau": tree_tau,
        f"sim_ddtree{budget}_over_dflash": tree_tau / dflash_tau if dflash_tau else None,
        "slot_top1_agreement": [h / s if s else None for h, s in zip(hits or [], seen or [])],
        "prefill_vs_cached_greedy_agreement": sum(agree) / max(1, len(agree)),
        "prompts": len(prompts),
    }, continuations
