"""A production engine's step as a ``Cycle``: the records an engine that drafts a chain writes per step.

An engine whose step verifies one chain of drafts (vLLM's DFlash) hands the tensors of that step here:
the drafts, the drafter's logits, the target's logits at every verified slot and the accepted tokens;
an engine step without speculation is one target decode. These read no engine: any engine module
(``workbench.adapters.vllm_engine``; an SGLang one) turns its step into the same record.
"""
from __future__ import annotations

import torch

from workbench.records.cycle import Cycle
from workbench.records.forward import ForwardMode, ForwardRecord, shape_of

RECORD_TOPK = 8  # the drafter's top-k kept per slot in a production engine's cycle


def chain_arrays(n: int, start: int) -> dict:
    """A chain of n nodes (the root and n - 1 drafts) in the Cycle's tree arrays."""
    ar = torch.arange(n)
    nxt = torch.where(ar + 1 < n, ar + 1, torch.full_like(ar, -1))
    return dict(parents=ar - 1, depth=ar.clone(), rank=torch.zeros(n, dtype=torch.long), position_ids=start + ar,
                visibility=torch.ones(n, n, dtype=torch.bool).tril(), retrieve_next_token=nxt,
                retrieve_next_sibling=torch.full((n,), -1))


def chain_forwards(n: int, vocab: int, context_features, target_logits, device) -> tuple[ForwardRecord, ...]:
    """The drafter's and the target's forward of a chain step (n nodes), as records of what they read."""
    d = n - 1
    ids = lambda k: {"shape": [k], "dtype": "int64", "device": str(device)}  # noqa: E731
    return (
        ForwardRecord("draft", ForwardMode.TARGET_VERIFY,
                      {"input_ids": ids(1 + d), "target_hidden": shape_of(context_features)},
                      {"logits": {"shape": [d, int(vocab)], "dtype": "float32", "device": str(device)}}),
        ForwardRecord("target", ForwardMode.TARGET_VERIFY, {"input_ids": ids(n)}, {"logits": shape_of(target_logits)}),
    )


def chain_cycle(index: int, start: int, root: int, drafts, draft_logits, target_logits, accepted, committed: int,
                stage_seconds: dict, forwards: tuple = (), policy: str = "DFlash", topk: int = RECORD_TOPK) -> Cycle:
    """The Cycle of one step that verified a chain.

    drafts: int64 [K] the proposal (the first d are verified); draft_logits: [K, V] or None (not captured);
    target_logits: [d + 1, V] at the root and each verified draft; accepted: int64 [d + 1] the accepted
    drafts then the bonus, -1 padded; committed: tokens the request kept (fewer than accepted + 1 when it
    reached max_new_tokens: the tree is then cut to the root and the kept drafts, its last kept token the bonus)."""
    # A request that reached its limit inside the block kept only the first ``committed`` of its accepted
    # drafts and bonus. The cycle records the tree the workbench's engine (which drafts no further than the
    # limit) would have verified: the root and the committed - 1 drafts it kept, its last kept token the bonus;
    # the accept length and per-position acceptance are then the same on the same drafts.
    accepted = accepted[accepted >= 0]
    if 1 <= committed < int(accepted.numel()):
        accepted = accepted[:committed]
        target_logits = target_logits[:committed]
    d = int(target_logits.shape[0]) - 1
    n = d + 1
    probs = torch.softmax(target_logits, dim=-1)
    choice = target_logits.argmax(dim=-1)  # [n]
    tokens = torch.cat([torch.tensor([root]), drafts[:d]])  # [n]
    if draft_logits is not None:
        lp = torch.log_softmax(draft_logits[:d], dim=-1)  # [d, V]
        # a stable sort lists tied tokens by id, the one argmax (and so a greedy draft) picks first
        vals, idx = torch.sort(lp, dim=-1, descending=True, stable=True)
        chain_lp = lp.gather(-1, drafts[:d, None])[:, 0]
        score = torch.cat([torch.zeros(1), chain_lp.cumsum(0)])
        top_tokens, top_lp = idx[:, :topk], vals[:, :topk].float()
    else:
        score, top_tokens, top_lp = torch.zeros(n), torch.zeros(0, topk, dtype=torch.long), torch.zeros(0, topk)
    nodes = torch.arange(int(accepted.numel()))
    return Cycle(
        index=index, policy=policy, start=start, root_token=int(root),
        draft_topk_tokens=top_tokens, draft_topk_logprobs=top_lp, tokens=tokens, score=score.float(),
        target_choice=choice, target_prob=probs.gather(-1, choice[:, None])[:, 0],
        accepted_nodes=nodes, accepted_tokens=tokens[nodes], bonus=int(accepted[-1]),
        committed=int(committed), stage_seconds=stage_seconds, forwards=forwards, **chain_arrays(n, start))


def decode_cycle(index: int, start: int, root: int, new_tokens: list[int], seconds: float,
                 topk: int = RECORD_TOPK) -> Cycle:
    """The Cycle of one target decode step (no drafts): the root alone, the new token as its bonus."""
    tok = torch.tensor([root])
    nxt = int(new_tokens[0]) if new_tokens else int(root)
    return Cycle(index=index, policy="AR", start=start, root_token=int(root),
                 draft_topk_tokens=torch.zeros(0, topk, dtype=torch.long), draft_topk_logprobs=torch.zeros(0, topk),
                 tokens=tok, score=torch.zeros(1), target_choice=torch.tensor([nxt]), target_prob=torch.ones(1),
                 accepted_nodes=torch.zeros(1, dtype=torch.long), accepted_tokens=tok, bonus=nxt,
                 committed=len(new_tokens), stage_seconds={"verify": seconds}, forwards=(), **chain_arrays(1, start))
