"""Where two runs of the same prompt first differ, and why: a near-tie or a real difference.

Greedy speculative decoding is token-for-token lossless in float32 and lossless up
to near-ties in reduced precision: a tree-verify forward and a one-token decode
(or a CPU and a CUDA kernel) round differently, so when the target's two best
tokens are almost tied, the argmax can flip. Every ``Cycle`` records the
target's top-2 tokens and logits at each verified node (and the trace records
them for the first token, from the prefill), so the divergence can be read off
both runs without re-running anything::

    d = wb.first_divergence(trace_bf16, trace_fp32)   # None when the outputs are equal
    d.cause     # 'near-tie: margin 0.0312 in bfloat16 ...' or 'not a near-tie: ...'
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.records.cycle import Trace

# The largest logit margin, relative to the logit magnitude, that numerics alone can flip. In 16-bit
# types every layer's output is rounded to the storage type: a few machine epsilons (bfloat16 keeps 8
# bits). In float32 the reduction order of different kernels and devices dominates: 1e-4 is generous.
NEAR_TIE_RELATIVE = {"bfloat16": 8 * 2**-7, "float16": 8 * 2**-10, "float32": 1e-4, "float64": 1e-10}
KINDS = ("near-tie", "near-tie (3+ tokens)", "not a near-tie", "sampled", "ended", "unknown")


@dataclass(frozen=True)
class Top2:
    """The target's two best tokens and their logits at one output position."""

    tokens: tuple[int, int]
    logits: tuple[float, float]

    @property
    def margin(self) -> float:
        return self.logits[0] - self.logits[1]


@dataclass(frozen=True)
class RunAt:
    """One run at the divergence position."""

    label: str  # policy, dtype, device
    dtype: str
    token: int | None  # None: this run's output ended before the position
    top2: Top2 | None  # None: not recorded (an older trace)
    where: str  # "prefill" or "cycle 3, node 5": where the target made this choice
    temperature: float = 0.0


@dataclass(frozen=True)
class Divergence:
    position: int  # index into the generated tokens (0 = the first generated token)
    prompt_tokens: int  # the absolute position is prompt_tokens + position
    a: RunAt
    b: RunAt
    kind: str  # one of KINDS
    cause: str  # the kind, in words, with the margins
    token_text: dict  # token id -> text, when a tokenizer was given

    @property
    def near_tie(self) -> bool:
        """Explained by numerics: the runs' best tokens were (likely) tied within the dtype's precision."""
        return self.kind.startswith("near-tie")

    def _tok(self, t) -> str:
        return f"{t}" + (f" {self.token_text[t]!r}" if t in self.token_text else "")

    def _side(self, r: RunAt) -> str:
        if r.token is None:
            return f"{r.label}: output ended"
        if r.top2 is None:
            return f"{r.label}: chose {self._tok(r.token)} (no top-2 recorded)"
        toks, logits = r.top2.tokens, r.top2.logits
        k = toks.index(r.token) if r.token in toks else 0  # on an exact tie argmax and topk may order differently
        return (f"{r.label}: chose {self._tok(toks[k])} ({logits[k]:.4g}) over {self._tok(toks[1 - k])} "
                f"({logits[1 - k]:.4g}), margin {logits[k] - logits[1 - k]:.3g}")

    def __repr__(self) -> str:
        return (f"Divergence(token {self.position} (position {self.prompt_tokens + self.position}): "
                f"{self._side(self.a)} | {self._side(self.b)} -> {self.cause})")

    __str__ = __repr__


def output_with_top2(trace: Trace) -> tuple[list[int], list[tuple[str, Top2 | None]]]:
    """The generated tokens of a trace and, for each, where it was chosen and the target's top-2 there."""
    first = trace.meta.get("prefill_top2")
    first_top2 = Top2(tuple(first["tokens"]), tuple(first["logits"])) if first else None
    if trace.cycles:
        tokens = [trace.cycles[0].root_token]
    elif first and trace.new_tokens:
        tokens = [first["tokens"][0]]
    else:
        return [], []
    where: list[tuple[str, Top2 | None]] = [("prefill", first_top2)]
    for c in trace.cycles:
        new = (c.accepted_tokens[1:].tolist() + [c.bonus])[: c.committed]
        for j, _ in enumerate(new):  # new[j] is the target's choice at the j-th accepted node
            node = int(c.accepted_nodes[j])
            top2 = None
            if c.target_top2_tokens is not None:
                top2 = Top2(tuple(c.target_top2_tokens[node].tolist()), tuple(c.target_top2_logits[node].tolist()))
            where.append((f"cycle {c.index}, node {node}", top2))
        tokens += new
    return tokens, where


def _relative(dtype: str) -> float:
    return NEAR_TIE_RELATIVE.get(dtype, NEAR_TIE_RELATIVE["float32"])


def near_tie_tolerance(dtype: str, scale: float) -> float:
    """Largest logit margin that numerics in ``dtype`` can flip at logit magnitude ``scale``."""
    return _relative(dtype) * max(1.0, abs(scale))


def _as_trace(x, name: str) -> Trace:
    t = getattr(x, "trace", x)
    if not isinstance(t, Trace):
        raise TypeError(f"{name} is a {type(x).__name__}; give a wb.Trace (or a Session)")
    return t


def _label(t: Trace) -> str:
    m = t.meta
    return ", ".join(str(v) for v in (m.get("policy"), m.get("dtype"), m.get("device")) if v is not None)


def _explain(a: RunAt, b: RunAt, tolerance: float | None) -> tuple[str, str]:
    """(kind, cause) from both runs' top-2 at the divergence; kind is one of KINDS."""
    if a.token is None or b.token is None:
        short = a if a.token is None else b
        return "ended", f"not a divergence of choice: the {short.label} output ended first"
    sampled = [r for r in (a, b) if r.temperature]
    if sampled:
        return "sampled", f"sampled, not greedy (temperature {sampled[0].temperature}): sampled outputs may differ"
    if a.top2 is None or b.top2 is None:
        return "unknown", "unknown: no top-2 logits recorded at this position (a trace from an older workbench)"
    low = max((a, b), key=lambda r: _relative(r.dtype))  # the lower-precision run decides what numerics can do
    tol = tolerance if tolerance is not None else near_tie_tolerance(
        low.dtype, max(abs(v) for r in (a, b) for v in r.top2.logits))
    worst = max((a, b), key=lambda r: r.top2.margin)
    margins = f"margins {a.top2.margin:.3g} ({a.dtype}) and {b.top2.margin:.3g} ({b.dtype})"
    within = f"within the {tol:.3g} that {low.dtype} numerics can flip"
    if {a.token, b.token} == set(a.top2.tokens) == set(b.top2.tokens):
        # Both runs rank the same two tokens first, in swapped order: how close were they?
        if worst.top2.margin <= tol:
            return "near-tie", f"near-tie: margin {worst.top2.margin:.3g} in {worst.dtype} ({margins}, {within})"
        return "not a near-tie", (f"not a near-tie: margin {worst.top2.margin:.3g} in {worst.dtype} ({margins}) "
                                  f"is beyond the {tol:.3g} that {low.dtype} numerics can flip; "
                                  "the runs compute different logits")
    if worst.top2.margin <= tol:
        return "near-tie (3+ tokens)", (
            f"likely a near-tie among three or more tokens: {margins} are {within}, but the runs' top 2 "
            f"differ ({a.top2.tokens[0]}, {a.top2.tokens[1]} vs {b.top2.tokens[0]}, {b.top2.tokens[1]})")
    r, other = (a, b) if b.token not in a.top2.tokens else (b, a)
    return "not a near-tie", (f"not a near-tie: {r.label} does not rank {other.token} in its top 2 "
                              f"({r.top2.tokens[0]}, {r.top2.tokens[1]}, margin {r.top2.margin:.3g}); "
                              "the runs compute different logits (other weights, settings or a bug)")


def first_divergence(trace_a, trace_b, tokenizer=None, tolerance: float | None = None) -> Divergence | None:
    """The first generated token where two runs of the same prompt differ, and why; None when equal.

    ``tolerance`` overrides the largest logit margin counted as a near-tie (default: NEAR_TIE_RELATIVE
    of the lower-precision run's dtype times the logit magnitude)."""
    ta, tb = _as_trace(trace_a, "trace_a"), _as_trace(trace_b, "trace_b")
    pa, pb = ta.meta.get("prompt_ids"), tb.meta.get("prompt_ids")
    if pa != pb:
        raise ValueError(f"the two runs have different prompts ({len(pa or [])} vs {len(pb or [])} tokens); "
                         "first_divergence compares runs of the same prompt")
    toks_a, where_a = output_with_top2(ta)
    toks_b, where_b = output_with_top2(tb)
    n = min(len(toks_a), len(toks_b))
    i = next((k for k in range(n) if toks_a[k] != toks_b[k]), None)
    if i is None:
        if len(toks_a) == len(toks_b):
            return None
        i = n

    def at(t: Trace, toks, where) -> RunAt:
        w, top2 = where[i] if i < len(where) else ("after the end", None)
        return RunAt(_label(t), str(t.meta.get("dtype", "float32")), toks[i] if i < len(toks) else None, top2, w,
                     float(t.meta.get("temperature", 0.0) or 0.0))

    a, b = at(ta, toks_a, where_a), at(tb, toks_b, where_b)
    kind, cause = _explain(a, b, tolerance)
    text = {}
    if tokenizer is not None:
        ids = {t for r in (a, b) if r.top2 for t in r.top2.tokens} | {r.token for r in (a, b) if r.token is not None}
        text = {t: tokenizer.decode([t]) for t in ids}
    return Divergence(i, len(pa or []), a, b, kind, cause, text)
