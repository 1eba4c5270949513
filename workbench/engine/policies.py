"""Decoding policies. All run on the same engine, models and stages; they differ in the tree."""
from __future__ import annotations

import re
from collections.abc import Callable
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


@dataclass(frozen=True)
class EagleTree:
    """SGLang's EAGLE tree over the DFlash drafter's per-slot log-probs: ``topk`` tokens per step,
    each later step expanding the best ``topk`` paths, ``steps`` deep; the best
    ``num_draft_tokens - 1`` candidates are verified with the root (SGLang's
    ``speculative_eagle_topk``, ``speculative_num_steps``, ``speculative_num_draft_tokens``).

    ``EagleTree(num_draft_tokens=N + 1)`` verifies as many tokens as ``DDTree(budget=N)``.
    """

    topk: int = 4
    steps: int = 5
    num_draft_tokens: int = 16
    name = "eagle"

    def __post_init__(self):
        from ddtree_kernels.eagle_tree import check_eagle_shape

        check_eagle_shape(self.topk, self.steps, self.num_draft_tokens)
        if self.num_draft_tokens - 1 > MAX_BUDGET:
            raise ValueError(f"EagleTree num_draft_tokens={self.num_draft_tokens} is absurdly large; the limit is "
                             f"{MAX_BUDGET + 1}")

    @property
    def budget(self) -> int:
        return self.num_draft_tokens - 1

    def __str__(self) -> str:
        return f"EagleTree({self.topk}, {self.steps}, {self.num_draft_tokens})"


@dataclass(frozen=True)
class TreePolicy:
    """Your own tree: ``build(logprobs [bs, D, V], root_tokens [bs], budget) -> ddtree_kernels.Tree``.

    The engine checks every tree it returns (``ddtree_kernels.validate_tree``: root first, parents
    before children, at most ``budget`` drafted nodes, depth <= D, tokens in the vocabulary,
    distinct sibling tokens) and stops with a one-line error naming the first violation.
    """

    build: Callable
    name: str = "custom"
    budget: int = 32

    def __post_init__(self):
        if not callable(self.build):
            raise TypeError(f"TreePolicy build={self.build!r} is not callable; pass fn(logprobs, root_tokens, budget)")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TreePolicy name={self.name!r} must be a non-empty string")
        b = self.budget
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BUDGET:
            raise ValueError(f"TreePolicy budget={b!r} must be an integer in [1, {MAX_BUDGET}]")

    def __str__(self) -> str:
        return f"{self.name}({self.budget})"


Policy = AR | DFlash | DDTree | EagleTree | TreePolicy


# str(policy) written back: 'DDTree(32)', 'DDTree(16, width=1)', 'DDTree(budget=16, width=None)'
_DDTREE_CALL = re.compile(r"ddtree\((?:budget=)?\s*([^,()]*?)\s*(?:,\s*(?:width=)?\s*([^,()]*?)\s*)?\)")


def parse_policy(text: str) -> Policy:
    """'ar', 'dflash', 'ddtree:32' (or 'ddtree:32:1' for a width), or any ``str(policy)``
    ('AR', 'DFlash', 'DDTree(32)', 'DDTree(16, width=1)'), or 'eagle:TOPK:STEPS:N' -> a policy."""
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
    if t.startswith("eagle"):
        # 'eagle:4:5:16', or str / repr written back: 'EagleTree(4, 5, 16)', 'EagleTree(topk=4, ...)'
        args = t[len("eagletree("):-1].split(",") if t.startswith("eagletree(") and t.endswith(")") else t.split(":")[1:]
        try:
            nums = [int(a.split("=")[-1]) for a in args]
        except ValueError:
            nums = []
        if len(nums) != 3:
            raise ValueError(f"policy {text!r}: write 'eagle:TOPK:STEPS:N', e.g. 'eagle:4:5:16'")
        return EagleTree(*nums)
    raise ValueError(f"unknown policy {text!r}; use ar, dflash, ddtree:N or eagle:TOPK:STEPS:N")


def as_policy(p) -> Policy:
    if isinstance(p, (AR, DFlash, DDTree, EagleTree, TreePolicy)):
        return p
    if isinstance(p, str):
        return parse_policy(p)
    if isinstance(p, type) and p in (AR, DFlash):
        return p()
    raise TypeError(f"policy={p!r} is not a policy; use wb.AR(), wb.DFlash() or wb.DDTree(budget=N)")
