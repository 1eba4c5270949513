"""``PaysOff`` as strict JSON: no NaN or infinity (most JSON parsers refuse Python's bare ``NaN``).

A value that is not a finite number becomes null, and a sibling key ``<key>_note`` says why, so a reader
never has to guess whether null means "not measured" or "zero of zero". Pure: data -> data.
"""
from __future__ import annotations

import math


def why_not_a_number(key: str, value: float, siblings: dict) -> str:
    """The reason beside a null: a rate over no cycles names its count (``spine_top1`` beside ``spine_n``)."""
    if math.isinf(value):
        return f"{value} (a ratio over zero) written as null"
    prefix = key.split("_")[0]
    count = siblings.get(f"{prefix}_n")
    if count == 0:
        return f"no cycles to rate ({prefix}_n=0): not a number, written as null"
    return "not a number (computed from no data, 0/0), written as null"


def not_finite(v) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def strict_json(data):
    """A copy of ``data`` (dicts, lists, tuples, scalars) with every non-finite float null and explained."""
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if not_finite(v):
                out[k], out[f"{k}_note"] = None, why_not_a_number(str(k), v, data)
            elif isinstance(v, (list, tuple)) and any(not_finite(x) for x in v):
                out[k] = strict_json(v)
                out[f"{k}_note"] = "null entries: not a number (computed from no data, 0/0) or infinite"
            else:
                out[k] = strict_json(v)
        return out
    if isinstance(data, (list, tuple)):
        return [None if not_finite(x) else strict_json(x) for x in data]
    return data
