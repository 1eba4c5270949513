"""Decoding policies. All run on the same engine, models and stages; they differ in the tree."""
from __future__ import annotations

import re
from dataclasses import dataclass

MAX_BUDGET = 4096  # a tree larger than this is almost surely a typo (the paper's largest is 1024)


@dataclass(frozen=True)
class AR:
    """Plain target decoding: one token per cycle, no drafter (the baseline)."""

    name = "ar"

    def __str__(self) -> str:
        return "AR"


@dataclass(frozen=True)
class DFlash:
    """Linear DFlash: the drafter's argmax per slot, verified as a chain."""

    name = "dflash"

    def __str__(self) -> str:
        return "DFlash"


@dataclass(frozen=True)
class DDTree:
    """The ``budget`` best prefixes of the drafter's per-slot log-probs, verified as one tree.

    ``width`` caps the candidate tokens per slot (None: up to ``budget``);
    ``DDTree(budget=B-1, width=1)`` is the argmax chain, i.e. linear DFlash.
    """

    budget: int = 32
    width: int | None = None
    name = "ddtree"

    def __post_init__(self):
        b = self.budget
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"DDTree budget={b!r} must be a positive integer (e.g. DDTree(budget=32))")
        if b > MAX_BUDGET:
            raise ValueError(f"DDTree budget={b} is absurdly large; the limit is {MAX_BUDGET} nodes")
        w = self.width
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"DDTree width={w!r} must be a positive integer or None")

    def __str__(self) -> str:
        return f"DDTree({self.budget})" if self.width is None else f"DDTree({self.budget}, width={self.width})"


Policy = AR | DFlash | DDTree


# str(policy) written back: 'DDTree(32)', 'DDTree(16, width=1)', 'DDTree(budget=16, width=None)'
_DDTREE_CALL = re.compile(r"ddtree\((?:budget=)?\s*([^,()]*?)\s*(?:,\s*(?:width=)?\s*([^,()]*?)\s*)?\)")


def parse_policy(text: str) -> Policy:
    """'ar', 'dflash', 'ddtree:32' (or 'ddtree:32:1' for a width), or any ``str(policy)``
    ('AR', 'DFlash', 'DDTree(32)', 'DDTree(16, width=1)') -> a policy."""
    if not isinstance(text, str):
        raise TypeError(f"policy {text!r} is not text; use ar, dflash or ddtree:N")
    t = text.strip().lower()
    if t in ("ar", "ar()"):
        return AR()
    if t in ("dflash", "dflash()"):
        return DFlash()
    call = _DDTREE_CALL.fullmatch(t.replace(" ", ""))
    if call:
        budget, width = call.group(1), call.group(2)
        try:
            nums = [int(budget), None if width in (None, "", "none") else int(width)]
        except ValueError:
            raise ValueError(f"policy {text!r}: the budget and width must be positive integers, as in "
                             "'DDTree(32)' or 'DDTree(16, width=1)'") from None
        return DDTree(*nums)
    if t.startswith("ddtree"):
        parts = t.split(":")
        try:
            nums = [int(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"policy {text!r}: the budget must be a positive integer, as in 'ddtree:32'") from None
        if not 1 <= len(nums) <= 2:
            raise ValueError(f"policy {text!r}: write 'ddtree:N' with a budget N, e.g. 'ddtree:32'")
        return DDTree(*nums)
    raise ValueError(f"unknown policy {text!r}; use ar, dflash or ddtree:N")


def as_policy(p) -> Policy:
    if isinstance(p, (AR, DFlash, DDTree)):
        return p
    if isinstance(p, str):
        return parse_policy(p)
    if isinstance(p, type) and p in (AR, DFlash):
        return p()
    raise TypeError(f"policy={p!r} is not a policy; use wb.AR(), wb.DFlash() or wb.DDTree(budget=N)")
