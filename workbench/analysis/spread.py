"""Conclusions that hold across the noise: order policies by a speed figure only where a paired test
separates them, and say "too noisy" where it does not.

    res = compare_policies(engine, policies, prompts, repeats=3)   # interleaved: A B C A B C ...
    v = wb.analysis.order_verdict(res.summary)               # speedup over AR, prompt by prompt
    print(v)   # "order holds (paired, 24 prompts): DDTree(16) > DFlash > AR" or "too noisy to order: ..."

The values are paired: entry i of every label is the same unit (a prompt, or a repeat: the same pass over
the prompts), so load that slows a whole unit cancels in the ratio of its two values. Neighbours in the
median order are compared pair by pair (``workbench.analysis.paired``: Wilcoxon signed-rank, sign test
beside it); an order is claimed only where every neighbour pair is separated at p < 0.05 over at least
``MIN_PAIRS`` units. Ranges are shown; they decide nothing.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from workbench.analysis.paired import ALPHA, MIN_PAIRS, paired_ratio


@dataclass(frozen=True)
class OrderVerdict:
    metric: str
    values: dict  # label -> [value per unit], entry i of every label the same unit
    order: list  # labels, best median first
    holds: bool  # >= MIN_PAIRS units and every neighbour pair in ``order`` separated by the paired test
    overlapping: list  # [(better, worse)] neighbour pairs the paired test does not separate
    p_values: dict  # (better, worse) -> Wilcoxon signed-rank p over the units' paired values
    unit: str = "repeats"

    def spread(self, label: str) -> tuple[float, float]:
        v = self.values[label]
        return min(v), max(v)

    @property
    def repeats(self) -> int:
        """Paired units (repeats or prompts) behind the verdict."""
        return min(len(v) for v in self.values.values())

    def __str__(self) -> str:
        def show(label):
            lo, hi = self.spread(label)
            return f"{label} {statistics.median(self.values[label]):.2f} [{lo:.2f}-{hi:.2f}]"

        ranges = ", ".join(show(x) for x in self.order)
        n = self.repeats
        if n < 2:
            return f"{self.metric}: one {self.unit[:-1]} shows no spread, so no order is claimed ({ranges})"
        ps = "; ".join(f"{a} vs {b} p={p:.2g}" for (a, b), p in self.p_values.items())
        if n < MIN_PAIRS:
            return (f"{self.metric}: too few pairs to order ({n} {self.unit}; a paired test needs >= {MIN_PAIRS}), "
                    f"too noisy to claim an order ({ranges})")
        if self.holds:
            return (f"{self.metric}: order holds (paired over {n} {self.unit}, Wilcoxon): " + " > ".join(self.order)
                    + f" ({ps}; {ranges})")
        pairs = "; ".join(f"{a} and {b} not separated (p={self.p_values[a, b]:.2g})" for a, b in self.overlapping)
        return f"{self.metric}: too noisy to order (paired over {n} {self.unit}): {pairs} ({ranges})"


def order_values(values: dict, metric: str = "value", higher_is_better: bool = True,
                 unit: str = "repeats") -> OrderVerdict:
    """{label: [value per unit]} (paired: entry i is the same unit for every label) -> the order by median
    and whether the paired test separates every neighbour pair."""
    if not values or any(not v for v in values.values()):
        raise ValueError("order_values needs at least one value per label")
    lens = {len(v) for v in values.values()}
    if len(lens) > 1:
        raise ValueError(f"order_values pairs entry i of every label; the labels have {sorted(lens)} values: "
                         "give each the same units")
    sign = 1 if higher_is_better else -1
    order = sorted(values, key=lambda k: -sign * statistics.median(values[k]))
    n = lens.pop()
    overlapping, p_values = [], {}
    for better, worse in zip(order, order[1:]):
        b, w = values[better], values[worse]
        if n >= 2 and all(x > 0 for x in b + w):
            num, den = (b, w) if higher_is_better else (w, b)
            p = paired_ratio(num, den, better, worse, min_pairs=1).wilcoxon_p
        else:
            p = 1.0
        p_values[better, worse] = p
        if n < MIN_PAIRS or p >= ALPHA:
            overlapping.append((better, worse))
    return OrderVerdict(metric, {k: list(v) for k, v in values.items()}, order,
                        n >= MIN_PAIRS and not overlapping, overlapping, p_values, unit)


NOT_POLICIES = ("settings", "reference", "ops_per_cycle")  # what `bench --json` prints beside the policies


def policy_summaries(summary) -> dict:
    """{label: summary}: from ``res.summary``, the ``BenchResult`` itself, or the object ``bench --json``
    prints (its settings, reference comparison and op counts sit beside the policies)."""
    summary = getattr(summary, "summary", summary)  # a BenchResult
    if not isinstance(summary, dict):
        raise TypeError(f"order_verdict takes a bench summary (res.summary, or the object `bench --json` prints), "
                        f"got {type(summary).__name__}")
    return {k: v for k, v in summary.items() if k not in NOT_POLICIES}


def order_verdict(summary: dict, metric: str = "speedup_vs_ar", labels=None) -> OrderVerdict:
    """The verdict for a bench summary (``policy_summaries``: ``res.summary``, the result, or ``bench --json``'s
    object): ``metric`` is ``speedup_vs_ar`` or ``tokens_per_s``, paired by prompt (each prompt's median over
    repeats) or by repeat (each repeat's pooled figure), whichever gives more pairs."""
    keys = {"speedup_vs_ar": "speedup_vs_ar_per_", "tokens_per_s": "tokens_per_s_per_"}
    if metric not in keys:
        raise ValueError(f"metric={metric!r}: use 'speedup_vs_ar' or 'tokens_per_s'")
    summary = policy_summaries(summary)
    labels = list(summary) if labels is None else list(labels)
    best = None
    for unit in ("prompt", "repeat"):
        key = keys[metric] + unit
        if all(x in summary and summary[x].get(key) is not None for x in labels):
            vals = {x: summary[x][key] for x in labels}
            n = min(len(v) for v in vals.values())
            if best is None or n > best[2]:
                best = (vals, unit + "s", n)
    if best is None:
        missing = [x for x in labels if x not in summary]
        if missing:
            raise ValueError(f"labels {missing} are not in this summary (its policies: {', '.join(summary)})")
        if metric == "speedup_vs_ar" and "AR" not in summary:
            raise ValueError(f"no speedup over AR for {labels}: run bench with AR in the policies")
        raise ValueError(f"no paired {metric} per prompt or per repeat for {labels}: a summary from an older "
                         "bench; run it again")
    return order_values(best[0], metric, unit=best[1])
