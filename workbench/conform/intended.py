"""Fields a writer recorded as the engine meant them, not as a forward consumed them (the header's ``intended``).

A writer records each input where the forward consumed it (the drafter's features at its ``fc``, the verify's
mask and positions as its attention got them): a fault between a caller and the forward then shows under the
input's own contract. Where an engine gives a writer no such point, the header names the fields it recorded
from the caller instead, ``"intended": {field: why}``, and the report prints that beside every verdict resting
on them (``lines``): a verdict on an intended field can pass while the forward consumed something else.
"""
from __future__ import annotations

from workbench.conform.dump import FIELDS

HEADER_KEY = "intended"


def intended(head: dict) -> dict:
    """field -> why, from the header (names this version does not know, and a malformed entry, are left out)."""
    raw = head.get(HEADER_KEY)
    if not isinstance(raw, dict):
        return {}
    return {str(k): str(v) for k, v in raw.items() if k in FIELDS["cycle"]}


def contracts_on(field: str) -> list[str]:
    """The contracts whose verdict reads ``field``: the contract it feeds, and any that needs it."""
    from workbench.conform.replay_contracts import NEEDS

    fed = FIELDS["cycle"][field].contract
    return [name for name, needs in NEEDS.items() if name == fed or field in needs]


def lines(head: dict, results: dict) -> list[str]:
    """One line per judged contract (passed or broken) that rests on an intended field: which, and why."""
    fields = intended(head)
    out = []
    for name, r in results.items():
        on = [f for f in fields if name in contracts_on(f)]
        if on and r.checked:
            why = "; ".join(f"{f}: {fields[f]}" for f in on)
            out.append(f"  {name} ({r.status}) rests on what the engine intended, not what its forward consumed: "
                       f"{why}")
    return (["intended, not observed (the writer's header):"] + out) if out else []
