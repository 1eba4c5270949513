"""A DFlash drafter's inputs in a production engine held against the reference's, one input at a time.

For a block rooted at position ``start`` (the last committed token, the root, sits there), the reference
drafter (``workbench.models.drafter_reference``, z-lab's dflash) reads:
- the context: the committed tokens before the root, at positions 0 .. start - 1, and the target's
  features there (one chunk per target layer it reads; compared in ``workbench.adapters.compare``);
- the block: the root, then K mask tokens, at positions start .. start + K.

A production engine hands its drafter the context a verify at a time (vLLM: every token of the target's
last forward, the rejected drafts after the accepted ones) and the block as the drafter forward's input ids
and positions. ``aligned_context`` lines the engine's context rows up with the committed positions (each
proposal's first rows are the ones its verify accepted), so that a token and its position are judged
apart: a context shifted by one position shows as "context positions", not as every token differing.
``compare_inputs`` then holds each input against the reference's and names the first difference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

CONTEXT_FIELDS = ("context_tokens", "context_positions", "context_features", "context_states")


@dataclass
class InputCheck:
    """One drafter input against the reference's: values compared, how many differ, the first in words;
    ``missing`` says why it could not be compared (then ``compared`` is 0)."""

    name: str
    compared: int
    differ: int
    first: str = ""
    missing: str = ""

    @property
    def equal(self) -> bool:
        return not self.missing and self.differ == 0

    def to_dict(self) -> dict:
        return {"input": self.name, "compared": self.compared, "differ": self.differ, "first": self.first,
                "missing": self.missing, "equal": self.equal}


def compare_values(name: str, production, reference: list, where: str, missing: str = "") -> InputCheck:
    """``production`` (a list or int tensor, or None when not recorded) against ``reference`` element by
    element; ``where`` names an element ("position", "slot") in the first difference's words."""
    if production is None:
        return InputCheck(name, 0, 0, missing=missing or "not recorded by the production engine's hooks")
    prod = production.tolist() if isinstance(production, Tensor) else list(production)
    n = min(len(prod), len(reference))
    bad = [i for i in range(n) if prod[i] != reference[i]]
    first = f"{where} {bad[0]}: production {prod[bad[0]]}, reference {reference[bad[0]]}" if bad else ""
    if len(prod) != len(reference):
        extra = f"production has {len(prod)} values, the reference {len(reference)}"
        first = f"{first}; {extra}" if first else extra
    return InputCheck(name, n, len(bad) + abs(len(prod) - len(reference)), first)


def aligned_context(proposals: list, starts: list[int]) -> tuple[dict, str]:
    """The context rows a production drafter read, lined up with the committed positions.

    ``proposals[i]``: the proposal whose drafts cycle i verified (an object with ``CONTEXT_FIELDS``, each
    [rows, ...] or None, one request per proposal); ``starts[i]``: cycle i's root position. Proposal i's
    first ``starts[i] - starts[i - 1]`` rows (``starts[0]`` for the prefill's) are the ones its verify
    committed; the rest are rejected drafts the drafter must not see. -> ({field: [starts[-1], ...] tensor
    or None}, a note naming rows the engine did not hand over, "" when none)."""
    out: dict = {}
    short = []
    for name in CONTEXT_FIELDS:
        parts = []
        for i, p in enumerate(proposals):
            t = getattr(p, name, None)
            if t is None:
                parts = None
                break
            want = starts[i] - (starts[i - 1] if i else 0)
            if t.shape[0] < want and name == "context_tokens":
                short.append(f"cycle {i}: {t.shape[0]} of {want} rows")
            parts.append(t[:want])
        out[name] = torch.cat(parts) if parts else None
    note = ("the production drafter was handed fewer context rows than its verifies committed ("
            + "; ".join(short) + ")") if short else ""
    return out, note


def compare_inputs(context: list[int], start: int, k: int, mask_token_id: int, aligned: dict,
                   block_tokens: Tensor | None, block_positions: Tensor | None) -> list[InputCheck]:
    """Every token and position input of one drafter call against the reference's. ``context``: the
    committed tokens, the root (at ``start``) last; ``k``: drafted slots; ``aligned``: ``aligned_context``'s
    rows; ``block_*``: the drafter forward's [1 + k] input ids and positions for this request."""
    root = context[start] if len(context) > start else context[-1]
    return [
        compare_values("context tokens", aligned.get("context_tokens"), context[:start], "position"),
        compare_values("context positions", aligned.get("context_positions"), list(range(start)), "row"),
        compare_values("block tokens", block_tokens, [root] + [mask_token_id] * k, "slot"),
        compare_values("block positions", block_positions, list(range(start, start + k + 1)), "slot"),
    ]
