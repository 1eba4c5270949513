"""What the calibrated policies share: their calibration, bound to the pair before any decode, the
path-conditioned tree they start from, and their spelling.

A calibrated policy (``PathTree``, ``CostTree``, ``CutTree``) has a ``calibration`` field: a shipped
calibration's name ('dense', 'hybrid'), a file's path, or None for "the shipped calibration made on the pair
this runs on". ``for_pair`` (called as a request starts, and whenever its policy is set) loads it, refuses a
file made on another pair in one line, and returns a copy bound to it; the copy is equal to the original
(binding changes no field, so labels, the wire and replays are unchanged).

The tree they start from is the path-conditioned tree (``ddtree_kernels.path_tree``): each candidate's
increment is log q from the calibration's acceptance model, so a node's score estimates the log-probability
that the target accepts its whole path.
"""
from __future__ import annotations

import dataclasses
import re

from ddtree_kernels import Tree
from ddtree_kernels.path_tree import path_tree
from ddtree_kernels.tree_build import sorted_slots
from workbench.engine.policies.base import MAX_BUDGET, Policy, spelled_args
from workbench.engine.policies.calibration import MAKE, SHIPPED, Calibration, CalibrationError, load, shipped_for


def check_budget(who: str, value, name: str = "budget") -> None:
    """A positive integer up to MAX_BUDGET, else one line."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BUDGET:
        raise ValueError(f"{who} {name}={value!r} must be an integer from 1 to {MAX_BUDGET}")


def check_calibration_field(who: str, value) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{who} calibration={value!r} must be a shipped calibration's name ('dense', 'hybrid'), "
                         "a file's path, or None (the one shipped for the pair)")


def rows_of(drafted) -> int:
    """Rows the drafter drafted for in this cycle (the batch the verify will hold), from its forward's record."""
    shape = (drafted.record.inputs.get("input_ids") or {}).get("shape") if drafted.record is not None else None
    return int(shape[0]) if shape else 1


def first_nodes(tree: Tree, n: int) -> Tree:
    """The root and the first ``n`` drafted nodes of a best-first tree: parents precede their children, so any
    prefix of the node order is a tree."""
    return Tree(*(getattr(tree, f)[:, : n + 1] for f in ("tokens", "parents", "depth", "rank", "score")))


def spelled(text: str, names) -> tuple[list, dict] | None:
    """'cut:16:0.2' or 'cuttree(16, threshold=0.2, calibration=dense)' -> ([16, 0.2], {}) / ([16],
    {'threshold': 0.2, 'calibration': 'dense'}); None when the name is not one of ``names`` (the shared
    spellings of ``base.spelled_args``, with ints, floats, none or text as values)."""
    return spelled_args(text, names, value_of)


def value_of(text: str):
    """'none' -> None, '16' -> 16, '0.2' -> 0.2, "'dense'" / 'Dense' -> 'dense' (a shipped calibration's name, in
    any case); any other text as written (a calibration file's path keeps its case)."""
    if text.lower() == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    text = text.strip("'\"")
    return text.lower() if text.lower() in SHIPPED else text


class Calibrated(Policy):
    """The shared behaviour; subclasses are frozen dataclasses with a ``calibration`` field, registered."""

    calibration: str | None

    @property
    def short(self) -> str:
        """The spelling's name for messages ('PathTree(32)')."""
        return str(self)

    def for_pair(self, pair: dict) -> "Calibrated":
        if self.calibration is None:
            cal = shipped_for(pair)
            if cal is None:
                raise CalibrationError(f"{self.short}: no shipped calibration was made on this pair (vocabulary "
                                       f"{pair.get('vocab')}, block size {pair.get('block_size')}); make one with "
                                       f"{MAKE} and pass calibration=FILE")
        else:
            cal = load(self.calibration)
            cal.check_pair(pair)
        self.check_calibration(cal, pair)
        bound = dataclasses.replace(self)
        object.__setattr__(bound, "_bound", cal)  # not a field: equality, labels and the wire stay the same
        return bound

    def check_calibration(self, cal: Calibration, pair: dict | None = None) -> None:
        """A subclass refuses (one line) a calibration that lacks what it needs (``pair``: the pair it will run
        on, when known)."""

    def calibration_data(self) -> Calibration:
        """The bound calibration, or the named one when the policy is used outside a session."""
        cal = self.__dict__.get("_bound")
        if cal is not None:
            return cal
        if self.calibration is None:
            raise CalibrationError(f"{self.short} is not bound to a pair: start it through a session "
                                   "(engine.session / batch_session), or name a calibration (calibration='dense')")
        cal = load(self.calibration)
        self.check_calibration(cal)
        return cal

    def likely_tree(self, drafted, roots, budget: int, width: int | None, sync_free: bool) -> Tree:
        """The ``budget`` prefixes most likely accepted, their scores the estimated log-probability that the
        target accepts the whole path; at most ``width`` candidates per slot (and never more than the
        calibration was fitted on)."""
        cal = self.calibration_data()
        lp = drafted.logprobs  # [1, D, V]
        k = min(budget, width or budget, cal.width, lp.shape[-1])
        topv, topi = sorted_slots(lp, k) if sync_free else drafted.top(k)  # [1, D, k] each
        inc = cal.model.log_q(topv)  # [1, D, k, S]
        return path_tree(inc, topi, roots, budget, sync_free)

    def capacity(self, slots: int, vocab: int) -> int | None:
        width = getattr(self, "width", None)
        budget = getattr(self, "budget")
        w = min(width or vocab, vocab)
        total, p = 0, 1
        for _ in range(slots):
            p *= w
            total += p
            if total >= budget:
                return None
        return total

    keeps_case = True  # a calibration=FILE's path keeps its case; the name and the keys are read in any case

    @classmethod
    def parse(cls, text: str):
        text = re.sub(r"(^\s*[A-Za-z][A-Za-z0-9_]*|[(,]\s*[A-Za-z_]+\s*=)", lambda m: m.group(0).lower(), text)
        args = spelled(text, (cls.kind, cls.__name__.lower()))
        if args is None:
            return None
        pos, kw = args
        try:
            return cls(*pos, **kw)
        except TypeError:
            raise ValueError(f"policy {text!r}: write {cls.usage!r} or {cls.__name__}(...) with its fields "
                             f"({', '.join(f.name for f in dataclasses.fields(cls))})") from None

    def label_args(self) -> list[str]:
        """The fields that differ from their defaults after the first, as 'name=value' ('calibration=dense')."""
        out = []
        for f in dataclasses.fields(self)[1:]:
            v = getattr(self, f.name)
            if v != f.default:
                out.append(f"{f.name}={v}")
        return out

    def __str__(self) -> str:
        first = dataclasses.fields(self)[0].name
        return f"{type(self).__name__}({', '.join([str(getattr(self, first)), *self.label_args()])})"
