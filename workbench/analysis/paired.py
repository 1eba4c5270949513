"""Paired comparisons: one figure per unit (a prompt, a batch, a repeat) for two settings, compared pair by pair.

    r = paired_ratio(ddtree_tok_s, dflash_tok_s, "DDTree(16)", "DFlash")   # per-prompt tokens/s, same prompts
    r.median, r.iqr, r.wilcoxon_p, r.sign_p, r.order   # 'DDTree(16) > DFlash' or 'no order (p=0.31)'

The effect is the per-unit ratio a/b (> 1: ``a`` is higher). Machine load that slows a whole unit cancels in
its ratio, so pairs resolve differences that the two sides' ranges hide. Significance comes from
scipy.stats: the Wilcoxon signed-rank test on the log ratios (two-sided) decides; the sign test (a binomial
test on how many units ``a`` wins) is shown beside it. Fewer than ``MIN_PAIRS`` units are refused: with
n < 10 a paired test cannot resolve the few-percent differences these comparisons are about.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_PAIRS = 10  # the fewest units a paired comparison is made on
ALPHA = 0.05  # an order is claimed only where the Wilcoxon p-value is below this


def check_pairs(n: int, what: str = "prompts", need: int = MIN_PAIRS) -> None:
    """Refuse fewer than ``need`` paired units, in one line that says how many more are needed."""
    if n < need:
        raise ValueError(f"{n} {what} give {n} paired values; a paired test needs at least {need}: "
                         f"give {need - n} more")


def wilcoxon_p(log_ratios) -> float:
    """Two-sided Wilcoxon signed-rank p-value of the per-unit log ratios (1.0 when every one is 0)."""
    from scipy import stats

    d = np.asarray(log_ratios, dtype=float)
    if d.size == 0 or not np.any(d != 0):
        return 1.0
    return float(stats.wilcoxon(d).pvalue)


def sign_p(log_ratios) -> float:
    """Two-sided sign test: a binomial test (p = 1/2) on the units where ``a`` is higher, ties left out."""
    from scipy import stats

    d = np.asarray(log_ratios, dtype=float)
    wins, losses = int(np.sum(d > 0)), int(np.sum(d < 0))
    if wins + losses == 0:
        return 1.0
    return float(stats.binomtest(wins, wins + losses, 0.5).pvalue)


@dataclass(frozen=True)
class PairedRatio:
    """Per-unit ratios a/b, their median and spread, and whether they order a and b."""

    label: str
    baseline: str
    ratios: tuple  # a_i / b_i per unit, in unit order
    wilcoxon_p: float
    sign_p: float
    alpha: float = ALPHA

    @property
    def n(self) -> int:
        return len(self.ratios)

    @property
    def median(self) -> float:
        return float(np.median(self.ratios))

    @property
    def iqr(self) -> tuple[float, float]:
        """The 25th and 75th percentiles of the ratios: the noise beside the median effect."""
        q = np.percentile(self.ratios, [25, 75])
        return float(q[0]), float(q[1])

    @property
    def tails(self) -> tuple[float, float]:
        """The smallest and largest ratio: the worst and best unit, never hidden."""
        return float(min(self.ratios)), float(max(self.ratios))

    @property
    def wins(self) -> int:
        return sum(r > 1 for r in self.ratios)

    @property
    def losses(self) -> int:
        return sum(r < 1 for r in self.ratios)

    @property
    def significant(self) -> bool:
        return self.wilcoxon_p < self.alpha

    @property
    def order(self) -> str:
        """'a > b', 'a < b', or 'no order (p=...)' where the test does not separate them."""
        if not self.significant:
            return f"no order (p={self.wilcoxon_p:.2g})"
        return f"{self.label} {'>' if self.median > 1 else '<'} {self.baseline}"

    def __str__(self) -> str:
        lo, hi = self.iqr
        tl, th = self.tails
        return (f"{self.label} / {self.baseline}: median {self.median:.3f}x (IQR {lo:.3f}-{hi:.3f}, "
                f"min {tl:.3f}, max {th:.3f}; {self.wins} of {self.n} higher), Wilcoxon p={self.wilcoxon_p:.2g}, "
                f"sign p={self.sign_p:.2g}: {self.order}")

    def to_dict(self) -> dict:
        return {"label": self.label, "baseline": self.baseline, "n": self.n, "median": self.median,
                "iqr": list(self.iqr), "min": self.tails[0], "max": self.tails[1], "wins": self.wins,
                "losses": self.losses, "wilcoxon_p": self.wilcoxon_p, "sign_p": self.sign_p,
                "significant": self.significant, "order": self.order, "ratios": list(self.ratios)}


def paired_ratio(a, b, label: str = "a", baseline: str = "b", min_pairs: int = MIN_PAIRS,
                 what: str = "prompts", alpha: float = ALPHA) -> PairedRatio:
    """Compare per-unit figures ``a`` and ``b`` (same units, same order; higher is better, e.g. tokens/s).

    Refuses unequal lengths, fewer than ``min_pairs`` units and values that are not positive and finite."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) != len(b):
        raise ValueError(f"{label} has {len(a)} values and {baseline} {len(b)}; a paired comparison needs one "
                         "value of each per unit")
    check_pairs(len(a), what, min_pairs)
    bad = next((x for x in a + b if not (math.isfinite(x) and x > 0)), None)
    if bad is not None:
        raise ValueError(f"paired values must be positive and finite; got {bad!r} ({label} vs {baseline})")
    d = np.log(a) - np.log(b)
    return PairedRatio(label, baseline, tuple(x / y for x, y in zip(a, b)), wilcoxon_p(d), sign_p(d), alpha)
