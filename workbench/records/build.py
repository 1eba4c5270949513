"""Building a ``Cycle`` record from what one cycle's stages produced for one request (``CycleParts``).

The cycle (``workbench.engine.runner.Rows``) hands each request its parts; the request
(``workbench.engine.request.Request``) builds its record here and keeps it in its trace.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.records.cycle import Cycle


def to_host(**tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    """CPU copies of a cycle's record tensors. From a GPU: every copy queued without waiting, then one
    wait for them all (one host synchronisation per record instead of one per tensor)."""
    cuda = any(t.device.type == "cuda" for t in tensors.values())
    out = {k: t.to("cpu", non_blocking=cuda) for k, t in tensors.items()}
    if cuda:
        torch.cuda.current_stream().synchronize()
    return out


@dataclass
class CycleParts:
    """One request's share of one cycle, as the stages left it (device tensors)."""

    policy: object  # the Policy that built the tree
    start: int  # position of the root (= committed tokens before the cycle)
    root: int  # the root token (the previous cycle's bonus)
    drafted: object | None  # stages.Drafted, or None when no draft ran for this request
    tree: object  # the built tree (tokens, parents, depth, rank, score: [n] each)
    compiled: object  # the compiled tree (positions, EAGLE links [n], visibility [1, n, n])
    verified: object  # this row of the verify (choice, choice_prob [n], top2 [1, n, 2], record)
    committed: object  # stages.Committed: nodes, tokens, bonus, context
    kept: int  # tokens the request kept (end-of-text or its limit may cut the accepted path)
    times: dict  # the cycle's stage seconds (shared by every request of the cycle)
    state_from: torch.Tensor | None = None  # [n]: recurrent targets only
    replaced: tuple = ()  # the stages whose output a hook replaced this cycle (workbench.engine.hooks)


def cycle_record(index: int, p: CycleParts, record_topk: int, sampling) -> Cycle:
    """The ``Cycle`` record of ``p``, every tensor on the host."""
    k = record_topk
    tree, compiled, verified, drafted = p.tree, p.compiled, p.verified, p.drafted
    top = drafted.top(k) if drafted is not None and k > 0 else None  # shared with the tree build when it ran
    # One host copy per dtype, not one per array: the per-node int64 arrays stacked, then the floats
    # (top-2 as two rows each), split again on the host.
    ints = torch.cat([tree.tokens, tree.parents, tree.depth, tree.rank, compiled.positions,
                      compiled.retrieve_next_token, compiled.retrieve_next_sibling, verified.choice,
                      verified.top2_tokens[0].T])  # [10, n]
    floats = torch.cat([tree.score.float(), verified.choice_prob, verified.top2_logits[0].T])  # [4, n] float32 (promoted)
    dev = to_host(ints=ints, floats=floats, visibility=compiled.visibility[0], accepted_nodes=p.committed.nodes,
                  **({"draft_topk_logprobs": top[0][0], "draft_topk_tokens": top[1][0]} if top else {}),
                  **({} if p.state_from is None else {"state_from": p.state_from}))
    i, f = dev["ints"].unbind(0), dev["floats"].unbind(0)
    host = dict(zip(("tokens", "parents", "depth", "rank", "position_ids", "retrieve_next_token",
                     "retrieve_next_sibling", "target_choice"), i))
    host.update(score=f[0], target_prob=f[1], visibility=dev["visibility"], accepted_nodes=dev["accepted_nodes"],
                target_top2_tokens=dev["ints"][8:].T, target_top2_logits=dev["floats"][2:].T,  # [n, 2] views
                draft_topk_logprobs=dev["draft_topk_logprobs"] if top else torch.zeros(0, k),
                draft_topk_tokens=dev["draft_topk_tokens"] if top else torch.zeros(0, k, dtype=torch.long),
                **({} if p.state_from is None else {"state_from": dev["state_from"]}))
    return Cycle(
        index=index, policy=str(p.policy), start=p.start, root_token=p.root,
        accepted_tokens=host["tokens"][host["accepted_nodes"]], bonus=p.committed.bonus, committed=p.kept,
        stage_seconds=p.times,
        forwards=tuple(r for r in ((drafted.record if drafted else None), verified.record) if r is not None),
        temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, replaced=tuple(p.replaced),
        **host,
    )
