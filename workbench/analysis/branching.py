"""Why siblings help (or do not): where the target's token sits among the drafter's candidates, from traces.

After a run the target's continuation is known (greedy output is the target's own choice; sampled output is
its sample), so for every cycle and drafted slot d (predicting depth d + 1) the rank of the target's token
among the drafter's recorded candidates for that slot is known too. Everything here is a conditional rate
over those ranks; nothing replays another tree shape (``workbench.analysis.budget`` does that, and its
single-trace counterfactual is biased: the run that made the trace stopped exactly where continuing was hard).

    b = wb.analysis.branching(trace)          # a DFlash (or any drafted) run, one trace or a list
    b.hit_rates()                             # [depth, rank] share of slots whose target token has that rank
    b.continuation()                          # after a spine hit vs after a sibling hit: next depth right?
    print(b)

Ranks: 0 = the drafter's top-1, 1 = its runner-up (the rank-1 sibling), ...; ``k`` (the recorded width,
``record_topk``) = not among the recorded candidates; -1 = no target token there (past the end of the output).
A block-diffusion drafter drafts every slot from one forward, conditioned on its own argmax path; the
continuation rates say whether a slot's candidates still fit once the target left that path.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.analysis.budget import continuation_stream
from workbench.records.cycle import Trace

CONT_TOPS = (1, 2, 4)  # "right within the top-j" after a hit, for these j


def slot_ranks(topk_tokens, topk_logprobs, targets) -> np.ndarray:
    """Rank of each slot's target token among its candidates, in the tree build's order (log-prob descending,
    equal log-probs by token id ascending).

    topk_tokens, topk_logprobs: [D, k]; targets: [D] (-1: unknown) -> int [D]: 0..k-1, k when not among them,
    -1 when unknown."""
    ids = np.asarray(topk_tokens, dtype=np.int64)
    lp = np.asarray(topk_logprobs, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    D, k = ids.shape if ids.ndim == 2 else (0, 0)
    out = np.full(len(y), -1, dtype=np.int64)
    for d in range(min(D, len(y))):
        if y[d] < 0:
            continue
        order = np.lexsort((ids[d], -lp[d]))  # last key first: log-prob descending, then id ascending
        hit = np.nonzero(ids[d][order] == y[d])[0]
        out[d] = int(hit[0]) if hit.size else k
    return out


def trace_ranks(trace: Trace) -> tuple[np.ndarray, int]:
    """[cycles, Dmax] ranks of the target's token per cycle and slot (-1 where unknown or not drafted), and k."""
    cycles = [c for c in trace.cycles if c.draft_topk_tokens.numel()]
    if not cycles:
        raise ValueError("no drafted cycles in this trace (AR drafts nothing); record a DFlash, DDTree or "
                         "spine run")
    stream, roots = continuation_stream(trace)
    index = {id(c): r for c, r in zip(trace.cycles, roots)}
    k = int(cycles[0].draft_topk_tokens.shape[1])
    D = max(int(c.draft_topk_tokens.shape[0]) for c in cycles)
    out = np.full((len(cycles), D), -1, dtype=np.int64)
    for i, c in enumerate(cycles):
        r = index[id(c)]
        d = int(c.draft_topk_tokens.shape[0])
        y = [stream[r + j] if r + j < len(stream) else -1 for j in range(1, d + 1)]
        out[i, :d] = slot_ranks(c.draft_topk_tokens.numpy(), c.draft_topk_logprobs.float().numpy(), y)
    return out, k


@dataclass(frozen=True)
class Branching:
    """Ranks of the target's token per cycle and slot, and the rates read from them."""

    ranks: np.ndarray  # int [cycles, D]: 0..k-1, k = beyond the recorded candidates, -1 = unknown
    k: int  # recorded candidates per slot
    policy: str

    @property
    def cycles(self) -> int:
        return int(self.ranks.shape[0])

    @property
    def depths(self) -> int:
        return int(self.ranks.shape[1])

    def hit_rates(self) -> np.ndarray:
        """float [D, k + 1]: row d-1 = depth d; column r = share of that depth's known slots whose target
        token has rank r (column k: not among the recorded candidates). Each row sums to 1 (nan: no data)."""
        out = np.full((self.depths, self.k + 1), np.nan)
        for d in range(self.depths):
            col = self.ranks[:, d]
            col = col[col >= 0]
            if col.size:
                out[d] = np.bincount(col, minlength=self.k + 1)[: self.k + 1] / col.size
        return out

    def _spine_prefix(self) -> np.ndarray:
        """bool [cycles, D]: every slot before d has the target's token at rank 0 (the chain reached d)."""
        top1 = self.ranks == 0
        pre = np.ones_like(top1)
        pre[:, 1:] = np.cumprod(top1[:, :-1], axis=1).astype(bool)
        return pre

    def first_miss(self) -> dict:
        """Where the chain first misses (the slot after an all-top-1 prefix whose token is not the top-1):
        the share of those misses whose target token is rank 1, ranks 1-3, and beyond the recorded ones."""
        at = self._spine_prefix() & (self.ranks > 0)
        r = self.ranks[at]
        n = int(r.size)
        if not n:
            return {"misses": 0, "rank1": float("nan"), "rank1_3": float("nan"), "beyond": float("nan")}
        return {"misses": n, "rank1": float(np.mean(r == 1)), "rank1_3": float(np.mean((r <= 3) & (r < self.k))),
                "beyond": float(np.mean(r == self.k))}

    def continuation(self, tops=CONT_TOPS) -> dict:
        """After the chain reached depth d and the target's token at d was the top-1 ("spine") or a rank-1+
        candidate ("sibling"), how often depth d+1's target token is within the drafter's top-j, j in ``tops``.

        -> {"spine": {"n": slots, "top1": rate, ...}, "sibling": {...}, "by_depth": [{depth, spine_n,
        spine_top1, sibling_n, sibling_top1}, ...]} (depth = d, 1-based; rates nan where n = 0)."""
        pre = self._spine_prefix()[:, :-1]
        here, nxt = self.ranks[:, :-1], self.ranks[:, 1:]
        known = nxt >= 0
        groups = {"spine": pre & (here == 0) & known, "sibling": pre & (here >= 1) & (here < self.k) & known}

        def rates(mask, cols=None) -> dict:
            m = mask if cols is None else mask[:, cols]
            v = (nxt if cols is None else nxt[:, cols])[m]
            return {"n": int(v.size), **{f"top{j}": float(np.mean(v < min(j, self.k))) if v.size else float("nan")
                                         for j in tops}}

        by_depth = []
        for d in range(self.depths - 1):
            s, b = rates(groups["spine"], [d]), rates(groups["sibling"], [d])
            by_depth.append({"depth": d + 1, "spine_n": s["n"], "spine_top1": s["top1"],
                             "sibling_n": b["n"], "sibling_top1": b["top1"]})
        return {"spine": rates(groups["spine"]), "sibling": rates(groups["sibling"]), "by_depth": by_depth}

    def to_dict(self) -> dict:
        h = self.hit_rates()
        return {"policy": self.policy, "cycles": self.cycles, "k": self.k,
                "hit_rates": [[None if np.isnan(x) else float(x) for x in row] for row in h],
                "first_miss": self.first_miss(), "continuation": self.continuation()}

    def table(self, ranks: int = 4, depths: int | None = None) -> str:
        """Hit rates per depth for ranks 0..ranks-1, the rest of the recorded ones, and beyond; then the
        continuation rates after a spine hit and after a sibling hit at that depth."""
        from workbench.records.texttable import legend, text_table

        h = self.hit_rates()
        cont = self.continuation()["by_depth"]
        rows = []
        for d in range(min(self.depths, depths or self.depths)):
            if np.isnan(h[d, 0]):
                continue
            c = cont[d] if d < len(cont) else None
            pct = [f"{100 * h[d, r]:.0f}" for r in range(min(ranks, self.k))]
            rest = 100 * np.sum(h[d, ranks: self.k]) if self.k > ranks else 0.0

            def rate(x, n):
                return "-" if not n else f"{100 * x:.0f} ({n})"

            rows.append([str(d + 1), *pct, f"{rest:.0f}", f"{100 * h[d, self.k]:.0f}",
                         rate(c["spine_top1"], c["spine_n"]) if c else "-",
                         rate(c["sibling_top1"], c["sibling_n"]) if c else "-"])
        head = ["depth", *(f"rank {r} %" for r in range(min(ranks, self.k))), f"rank {ranks}-{self.k - 1} %",
                f"beyond top-{self.k} %", "next top-1 after spine % (n)", "next top-1 after sibling % (n)"]
        return text_table(head, rows) + "\n" + legend([
            ("rank r %", "share of cycles whose target token at that depth is the drafter's rank-r candidate"),
            ("next top-1 after spine", "the chain reached this depth and the target took the top-1 here: how "
                                       "often the next depth's top-1 is the target's token"),
            ("next top-1 after sibling", "the same after the target took a rank-1+ candidate here (a sibling)")])

    def __str__(self) -> str:
        fm, c = self.first_miss(), self.continuation()
        s, b = c["spine"], c["sibling"]
        return (f"branching ({self.policy}, {self.cycles} cycles, top-{self.k} recorded): at the chain's first miss "
                f"the target's token is the rank-1 sibling {100 * fm['rank1']:.0f}% of the time (ranks 1-3: "
                f"{100 * fm['rank1_3']:.0f}%, beyond top-{self.k}: {100 * fm['beyond']:.0f}%; {fm['misses']} misses); "
                f"the next depth's top-1 is right {100 * s['top1']:.0f}% after a spine hit (n={s['n']}) and "
                f"{100 * b['top1']:.0f}% after a sibling hit (n={b['n']}; top-2 {100 * b['top2']:.0f}%, "
                f"top-4 {100 * b['top4']:.0f}%)")


def branching(trace) -> Branching:
    """The ranks of the target's tokens in ``trace`` (one Trace, or a list: pooled cycle by cycle)."""
    traces = list(trace) if isinstance(trace, (list, tuple)) else [trace]
    if not traces:
        raise ValueError("branching got an empty list of traces")
    for t in traces:
        if not isinstance(t, Trace):
            raise TypeError(f"branching takes a session's Trace (or a list of them), got {type(t).__name__}")
    parts = [trace_ranks(t) for t in traces]
    ks = {k for _, k in parts}
    if len(ks) > 1:
        raise ValueError(f"the traces recorded different candidate counts per slot ({sorted(ks)}); record them "
                         "with one record_topk")
    D = max(r.shape[1] for r, _ in parts)
    ranks = np.concatenate([np.pad(r, ((0, 0), (0, D - r.shape[1])), constant_values=-1) for r, _ in parts])
    return Branching(ranks, ks.pop(), " + ".join(sorted({t.policy for t in traces})))


def siblings_to_share(spine_tpf: dict, chain_tpf: float, tree_tpf: float, share: float = 0.9) -> int | None:
    """The fewest siblings k whose spine reaches ``share`` of the tree's gain in tokens per forward over the
    chain (end-to-end figures: {k: tokens per forward of Spine(k)}); None when no measured k does, or when
    the tree gains nothing."""
    gain = tree_tpf - chain_tpf
    if gain <= 0:
        return None
    for k in sorted(spine_tpf):
        if spine_tpf[k] - chain_tpf >= share * gain:
            return k
    return None
