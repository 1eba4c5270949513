"""The drafter-features contract: every context row the drafter's forward was handed against the target's own
hidden states at that row's committed position and the drafter's target layers, and, where a row differs, what
it equals instead.

The reference (``workbench.models.drafter_reference.Reference.states``: one uncached forward of the committed
context, every layer's hidden state and the last layer's before the final norm) is shared with the reference
drafter, which reads the same features: the contract adds no target forward of its own. A row that differs is
held against what an integration gets wrong, cheapest first, one layer-row (a row's H values of one target
layer) at a time:

- the same layer ``k`` positions away (``shift:k``, |k| <= 3): features handed over a row or more off;
- another layer at the same position (``layer:d``, d = that layer - the drafter's): a layer index off by d;
- the last layer's output before the final norm (``prenorm:d``; d = 0 where the drafter reads the last layer);
- a node of the previous step's tree that was not accepted (``rejected``): features kept in tree order, not
  compacted to the accepted path (one more forward, of that tree's paths; only when the rest explain nothing).

A layer-row that equals none of them is ``unexplained``. The evidence names the first differing row, how many
differ and what they equal; ``facts`` (counts per explanation) feed ``workbench.conform.causes``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import Tensor

SHIFTS = (-1, 1, -2, 2, -3, 3)  # positions tried, nearest first


@dataclass
class FeatureVerdict:
    problem: str | None  # one line of evidence, or None: every row checked is the target's own
    checked: int = 0  # context rows held to the reference (rows at committed positions)
    facts: dict = field(default_factory=dict)  # rows, of, units, explained {label: layer-rows}


def features_problem(engine, positions: list[int], states, layer_ids: list[int], previous=None) -> FeatureVerdict:
    """``engine``: the record's features (``workbench.conform.features.EngineRows``); ``positions`` [c] the
    positions the drafter gave its rows; ``states``: the target's states over the committed context
    (``TargetStates``, positions 0..start-1); ``previous``: None, or a callable -> (the previous step's tree
    node states, its accepted nodes) for the ``rejected`` explanation."""
    P = states.positions
    keep = [i for i, p in enumerate(positions) if 0 <= p < P]  # rows past the committed context: not judged here
    if not keep:
        return FeatureVerdict(None)
    rows = torch.tensor(keep)
    pos = torch.tensor([positions[i] for i in keep])  # [c]
    off = engine.off(states.layers(layer_ids, pos), rows)  # [c, L]
    bad = off > 1
    if not bool(bad.any()):
        return FeatureVerdict(None, len(keep))
    labels = explain(engine, rows, pos, bad, states, layer_ids, previous)  # [(row, layer) -> label]
    counts = Counter(labels.values())
    r, j = (int(x) for x in bad.nonzero()[0])
    first = labels[(r, j)]
    n_rows = int(bad.any(1).sum())
    facts = {"rows": n_rows, "of": len(keep), "units": int(bad.sum()), "explained": dict(counts)}
    evidence = (f"{n_rows} of {len(keep)} context rows differ from the target's own features (first: position "
                f"{int(pos[r])}, target layer {layer_ids[j]}, {float(off[r, j]):.3g} x the tolerance: it "
                f"{describe(first, layer_ids[j])}); " + summary(counts))
    return FeatureVerdict(evidence, len(keep), facts)


def explain(engine, rows: Tensor, pos: Tensor, bad: Tensor, states, layer_ids: list[int], previous) -> dict:
    """Each differing layer-row (row index, layer index) -> the first explanation it matches (module docstring)."""
    P, L = states.positions, len(layer_ids)
    n_layers = states.n_layers
    open_ = {(int(r), int(j)) for r, j in bad.nonzero()}
    out: dict = {}

    def take(label, match: Tensor) -> None:  # match: bool [c, L]; label: text, or layer index -> text
        for r, j in list(open_):
            if bool(match[r, j]):
                out[(r, j)] = label(j) if callable(label) else label
                open_.discard((r, j))

    for k in SHIFTS:
        if not open_:
            break
        at = pos + k
        valid = ((at >= 0) & (at < P))[:, None].expand(-1, L)
        take(f"shift:{k}", valid & (engine.off(states.layers(layer_ids, at.clamp(0, P - 1)), rows) <= 1))
    for d in sorted({b - a for a in layer_ids for b in range(-1, n_layers)} - {0}, key=lambda d: (abs(d), d)):
        if not open_:
            break
        which = [a + d for a in layer_ids]
        valid = torch.tensor([-1 <= b < n_layers for b in which])[None].expand(len(pos), -1)
        cand = states.layers([min(max(b, -1), n_layers - 1) for b in which], pos)  # [c, L, H]
        take(f"layer:{d}", valid & (engine.off(cand, rows) <= 1))
    prenorm = states.before_norm(pos) if open_ else None  # [c, H]
    if prenorm is not None:  # every drafter layer against the last layer's output before the final norm
        take(lambda j: f"prenorm:{n_layers - 1 - layer_ids[j]}",
             engine.off(prenorm[:, None].expand(-1, L, -1), rows) <= 1)
    if open_ and previous is not None:
        got = previous()
        if got is not None:
            nodes, accepted = got
            for i in range(nodes.positions):
                if i in accepted or not open_:
                    continue
                cand = nodes.layers(layer_ids, torch.tensor([i])).expand(len(pos), -1, -1)  # [c, L, H]
                take("rejected", engine.off(cand, rows) <= 1)
    for key in open_:
        out[key] = "unexplained"
    return out


def describe(label: str, layer: int) -> str:
    """What one layer-row equals, in words (``layer``: the drafter's target layer it should have been)."""
    kind, _, arg = label.partition(":")
    if kind == "shift":
        k = int(arg)
        return f"equals the target's features {abs(k)} position{'s' if abs(k) > 1 else ''} " \
               f"{'earlier' if k < 0 else 'later'} (off by {k:+d} row{'s' if abs(k) > 1 else ''})"
    if kind == "layer":
        d = int(arg)
        return (f"equals the target's layer {layer + d} there (a layer index off by {d:+d})" if layer + d >= 0 else
                "equals the target's embeddings there (a layer index off by " + f"{d:+d})")
    if kind == "prenorm":
        return ("equals the last layer's output before the final norm" + ("" if arg == "0" else
                f" (another layer, off by {int(arg):+d})"))
    if kind == "rejected":
        return "equals the features of a node of the previous step's tree that was not accepted"
    return "equals none of: the same layer 1-3 positions away, another layer, the last layer before the final " \
           "norm, a node the previous step did not accept"


def summary(counts: Counter) -> str:
    """The explanations of every differing layer-row, most frequent first."""
    total = sum(counts.values())
    return "; ".join(f"{'all' if n == total else f'{n} of {total}'} differing layer-rows: {phrase(label)}"
                     for label, n in counts.most_common())


def phrase(label: str) -> str:
    kind, _, arg = label.partition(":")
    if kind == "shift":
        return f"the same layer {abs(int(arg))} position{'s' if abs(int(arg)) > 1 else ''} " \
               f"{'earlier' if int(arg) < 0 else 'later'}"
    if kind == "layer":
        return f"another layer at the same position, off by {int(arg):+d}"
    if kind == "prenorm":
        return "the last layer before the final norm" + ("" if arg == "0" else f" (layer offset {int(arg):+d})")
    if kind == "rejected":
        return "a node of the previous step's tree that was not accepted"
    return "nothing the checker tries"
