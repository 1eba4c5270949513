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
    max_len: int  # prompt_len + new tokens: no cycle verifies past it
    logprobs: torch.Tensor  # [R, B-1, V]: root s = prompt_len + r drafts slots for s+1 .. s+B-1
    prefill_agreement: float  # share of continuation tokens that one full forward's argmax also gives


def block_inputs(roots: torch.Tensor, ids: torch.Tensor, B: int, mask_id: int):
    """One drafter block per root: [root token, MASK * (B-1)] at positions root .. root+B-1, seeing the
    context strictly before its root and its whole block (as in training).
    roots [R], ids [T] -> block_ids [1, R*B], attention mask [1, 1, R*B, T + R*B], position ids [1, T + R*B]"""
    T, R = ids.shape[0], roots.shape[0]
    block_pos = (roots[:, None] + torch.arange(B)).flatten()  # [R*B]
    block_ids = torch.full_like(block_pos, mask_id)
    block_ids[::B] = ids[roots]
    see_ctx = torch.arange(T)[None, :] < roots.repeat_interleave(B)[:, None]  # [R*B, T]
    blk = torch.arange(R).repeat_interleave(B)
    see_blk = blk[:, None] == blk[None, :]  # [R*B, R*B]
    mask = torch.cat([see_ctx, see_blk], dim=1)[None, None]
    pos = torch.cat([torch.arange(T), block_pos])[None]
    return block_ids[None], mask, pos


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
    if not len(roots):
        return Rollout(ids.tolist(), P, P + new_tokens, torch.zeros(0, B - 1, 1), agree)
    # A block near the end runs past the sequence: those slots are never judged.
    block_ids, mask, pos = block_inputs(roots, ids, B, int(draft.mask_token_id))
    h = draft(position_ids=pos, attention_mask=mask, noise_embedding=target.get_input_embeddings()(block_ids),
              target_hidden=ctx)
    logits = draft.compute_logits(h, target.lm_head).float().view(len(roots), B, -1)[:, 1:]  # [R, B-1, V]
    return Rollout(ids.tolist(), P, P + new_tokens, logits.log_softmax(-1), agree)


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


def cycles(r: Rollout, budget: int | None, eos: int) -> list[int]:
    """Tokens produced per cycle (accepted + bonus), as dflash_generate counts them (cut at EOS and at
    ``max_len``). ``budget`` None: linear DFlash (the argmax chain); else DDTree(budget)."""
    from ddtree_kernels import build_tree

    produced_per_cycle = []
    start, ids = r.prompt_len, r.ids
    if ids[start] == eos:
        return []
    while start + 1 < min(r.max_len, len(ids)):
        depth = min(r.logprobs.shape[1], r.max_len - start - 1)
        truth = ids[start + 1 : start + 1 + depth]
        lp = r.logprobs[start - r.prompt_len, :depth]  # [depth, V]
        if budget is None:
            acc = 0
            for tok, want in zip(lp.argmax(-1).tolist(), truth):
                if tok != want:
                    break
                acc += 1
        else:
            acc = accepted_on_tree(build_tree(lp[None], torch.tensor([ids[start]]), budget), truth)
        produced = min(acc + 1, r.max_len - start - 1)
        new = ids[start + 1 : start + 1 + produced]
        if eos in new:
            produced = new.index(eos) + 1
        produced_per_cycle.append(produced)
        start += produced
        if eos in new:
            break
    return produced_per_cycle


def slot_agreement(r: Rollout) -> tuple[list[int], list[int]]:
    """Per block slot j (1 .. B-1): (drafter argmax == target's greedy token j after the root, roots
    judged), counted over every root of the continuation."""
    D = r.logprobs.shape[1]
    hits, seen = [0] * D, [0] * D
    top = r.logprobs.argmax(-1).tolist()  # [R, D]
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
        lin += cycles(r, None, eos)
        tree += cycles(r, budget, eos)
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
