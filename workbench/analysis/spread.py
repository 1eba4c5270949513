"""Conclusions that hold across the spread: order policies by a speed figure only where their
ranges over interleaved repeats do not overlap, and say "too noisy" where they do.

    res = bench(engine, policies, prompts, repeats=5)        # interleaved: A B C A B C ...
    v = wb.analysis.order_verdict(res.summary)               # speedup over AR, repeat by repeat
    print(v)   # "order holds across spread: DDTree(16) > DFlash > AR" or "too noisy to order: ..."

A repeat's speedup is measured within that repeat (the policy's tok/s over AR's in the same pass over
the prompts), so load that slows a whole pass cancels; what is left is the spread this reports.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class OrderVerdict:
    metric: str
    values: dict  # label -> [value per repeat]
    order: list  # labels, best median first
    holds: bool  # every neighbour pair in ``order`` is separated: the worse one's max < the better one's min
    overlapping: list  # [(better, worse)] neighbour pairs whose ranges overlap

    def spread(self, label: str) -> tuple[float, float]:
        v = self.values[label]
        return min(v), max(v)

    @property
    def repeats(self) -> int:
        return min(len(v) for v in self.values.values())

    def __str__(self) -> str:
        def show(label):
            lo, hi = self.spread(label)
            return f"{label} {statistics.median(self.values[label]):.2f} [{lo:.2f}-{hi:.2f}]"

        ranges = ", ".join(show(x) for x in self.order)
        if self.repeats < 2:
            return f"{self.metric}: one repeat shows no spread, so no order is claimed ({ranges})"
        if self.holds:
            return f"{self.metric}: order holds across spread ({self.repeats} repeats): " + " > ".join(self.order) + \
                f" ({ranges})"
        pairs = "; ".join(f"{a} and {b} overlap" for a, b in self.overlapping)
        return f"{self.metric}: too noisy to order ({self.repeats} repeats): {pairs} ({ranges})"


def order_values(values: dict, metric: str = "value", higher_is_better: bool = True) -> OrderVerdict:
    """{label: [value per repeat]} -> the order by median and whether the min-max ranges separate it."""
    if not values or any(not v for v in values.values()):
        raise ValueError("order_values needs at least one value per label")
    sign = 1 if higher_is_better else -1
    order = sorted(values, key=lambda k: -sign * statistics.median(values[k]))
    overlapping = []
    for better, worse in zip(order, order[1:]):
        b, w = values[better], values[worse]
        separated = min(b) > max(w) if higher_is_better else max(b) < min(w)
        if not separated:
            overlapping.append((better, worse))
    repeats = min(len(v) for v in values.values())
    return OrderVerdict(metric, {k: list(v) for k, v in values.items()}, order,
                        repeats >= 2 and not overlapping, overlapping)


def order_verdict(summary: dict, metric: str = "speedup_vs_ar", labels=None) -> OrderVerdict:
    """The verdict for a bench summary: ``metric`` is ``speedup_vs_ar`` (per repeat, within the repeat)
    or ``tokens_per_s`` (per repeat)."""
    key = {"speedup_vs_ar": "speedup_vs_ar_per_repeat", "tokens_per_s": "tokens_per_s_per_repeat"}.get(metric)
    if key is None:
        raise ValueError(f"metric={metric!r}: use 'speedup_vs_ar' or 'tokens_per_s'")
    labels = list(summary) if labels is None else list(labels)
    missing = [x for x in labels if x not in summary or summary[x].get(key) is None]
    if missing:
        raise ValueError(f"no per-repeat {metric} for {missing}: run bench with AR in the policies (for speedups)")
    return order_values({x: summary[x][key] for x in labels}, metric)
