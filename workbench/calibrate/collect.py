"""The calibration's raw material: for every drafted cycle, the drafter's top-K per slot and where the target's
own continuation sits among them.

Greedy decodes of the calibration prompts, half with DFlash's chain and half with DDTree(16), so cycles start
both where a chain stops and where a tree stops (a tree run moves every later cycle boundary; pays-off's
counterfactual section shows that this matters). The target's continuation is its own greedy output, the same
whichever policy decoded it, so every slot of every cycle is an observation: the rank of the target's token
among the drafter's K recorded candidates (``workbench.analysis.branching.trace_ranks``), including slots past
where that cycle's own tree stopped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from workbench.analysis.branching import trace_ranks
from workbench.analysis.budget import continuation_stream
from workbench.engine.policies import DDTree, DFlash

POLICIES = (DFlash(), DDTree(16))


@dataclass(frozen=True)
class Cycles:
    """Every drafted cycle's candidates and the target's ranks among them."""

    topv: np.ndarray  # float32 [C, D, K]: each slot's top-K log-probs, log-prob descending (id ascending on ties)
    topi: np.ndarray  # int64 [C, D, K]: their token ids (-1 where a slot was not drafted)
    ranks: np.ndarray  # int [C, D]: the target's token's rank 0..K-1, K = not among them, -1 = unknown / not drafted
    path: np.ndarray  # int64 [C, D + 1]: the root, then the target's own tokens at depths 1..D (-1: unknown)
    prompts: np.ndarray  # int [C]: which prompt each cycle came from (to split prompts, never cycles of one)
    seconds: float  # wall time of the decodes
    tokens: int  # tokens generated
    # per decoded prompt: (its ids followed by the target's tokens, the prompt's length); what the drafter's states
    # at any block of the continuation are recomputed from (``workbench.train.cond_data.blocks_of``)
    sequences: tuple = ()

    @property
    def K(self) -> int:
        return int(self.topv.shape[2])

    def subset(self, keep: np.ndarray) -> "Cycles":
        return Cycles(self.topv[keep], self.topi[keep], self.ranks[keep], self.path[keep], self.prompts[keep],
                      self.seconds, self.tokens, self.sequences)


def sorted_top(tokens: np.ndarray, logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[D, K] recorded candidates -> (log-probs, ids) in the tree build's order (log-prob desc, id asc)."""
    order = np.stack([np.lexsort((tokens[d], -logprobs[d])) for d in range(tokens.shape[0])])
    return np.take_along_axis(logprobs, order, 1), np.take_along_axis(tokens, order, 1)


def collect(engine, prompts: list[str], max_new_tokens: int, width: int, progress=None) -> Cycles:
    """Decode ``prompts`` greedily (policies alternating, ``POLICIES``) recording the top-``width`` per slot."""
    t0 = time.perf_counter()
    tops, ids, ranks, paths, which, tokens, seqs = [], [], [], [], [], 0, []
    D = engine.models.block_size - 1
    for i, text in enumerate(prompts):
        s = engine.session(text, policy=POLICIES[i % len(POLICIES)], max_new_tokens=max_new_tokens,
                           record_topk=width)
        trace = s.run()
        tokens += len(s.generated)
        seqs.append((list(s.prompt_ids) + list(s.generated), len(s.prompt_ids)))
        drafted = [c for c in trace.cycles if c.draft_topk_tokens.numel()]
        if progress is not None:
            progress(i + 1, len(prompts))
        if not drafted:  # the target ended at once (an end-of-text first token): nothing was drafted
            continue
        r, k = trace_ranks(trace)  # [cycles, D'] over the cycles that drafted, in order
        stream, roots = continuation_stream(trace)
        at = {id(c): j for c, j in zip(trace.cycles, roots)}
        for c, row in zip(drafted, r):
            top = np.full((D, width), -np.inf, dtype=np.float32)
            tid = np.full((D, width), -1, dtype=np.int64)
            v, t = sorted_top(c.draft_topk_tokens.numpy(), c.draft_topk_logprobs.float().numpy())
            top[: v.shape[0], : v.shape[1]], tid[: t.shape[0], : t.shape[1]] = v, t
            rk = np.full(D, -1, dtype=np.int64)
            rk[: len(row)] = row
            j = at[id(c)]
            path = np.array([stream[j + n] if j + n < len(stream) else -1 for n in range(D + 1)], dtype=np.int64)
            tops.append(top)
            ids.append(tid)
            ranks.append(rk)
            paths.append(path)
            which.append(i)
    return Cycles(np.stack(tops), np.stack(ids), np.stack(ranks), np.stack(paths), np.array(which),
                  time.perf_counter() - t0, tokens, tuple(seqs))
