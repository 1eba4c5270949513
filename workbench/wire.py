"""The wire format between ``python -m workbench serve`` and ``wb.connect``: versioned JSON (docs/wire-format.md).

Shared by the server and the client, so it imports neither. Cycles travel as
``Cycle.to_dict()`` (the same records as trace files), so fields added to ``Cycle``
travel without a change here. Any change to what a message means bumps WIRE_VERSION.
"""
from __future__ import annotations

import dataclasses
import json
import ipaddress

from workbench.cycle import Cycle, Trace
from workbench.forward import ForwardRecord
from workbench.policies import AR, DDTree, DFlash, parse_policy

WIRE_VERSION = 1  # the one place the wire version lives
VERSION_HEADER = "X-Workbench-Wire"
POLICIES = {cls.name: cls for cls in (AR, DFlash, DDTree)}


class WireVersionError(RuntimeError):
    """The client and the server speak different wire versions."""


def version_mismatch(client: object, server: object) -> str:
    return (f"wire version mismatch: the client speaks version {client}, the server speaks version {server}; "
            "install the same workbench version on both sides")


# ------------------------------------------------------------------------------------------ JSON
def dumps(obj) -> bytes:
    # allow_nan: log-probs can be -inf; Python's json reads these tokens back (documented in the format).
    return json.dumps(obj, allow_nan=True, separators=(",", ":")).encode()


def loads(raw: bytes):
    return json.loads(raw)


# ------------------------------------------------------------------------------------------ policies
def policy_to_wire(p) -> dict:
    """AR() -> {"name": "ar"}; DDTree(32) -> {"name": "ddtree", "budget": 32, "width": None}."""
    return {"name": p.name, **{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}}


def policy_from_wire(w):
    """The inverse of policy_to_wire; a string such as "ddtree:32" is accepted too (handy with curl)."""
    if isinstance(w, str):
        return parse_policy(w)
    if not isinstance(w, dict) or not isinstance(w.get("name"), str):
        raise ValueError(f"policy {w!r} must be a string like 'ddtree:32' or an object with a 'name'")
    cls = POLICIES.get(w["name"].lower())
    if cls is None:
        raise ValueError(f"unknown policy name {w['name']!r}; use one of {', '.join(POLICIES)}")
    known = {f.name for f in dataclasses.fields(cls)}
    extra = set(w) - known - {"name"}
    if extra:
        raise ValueError(f"policy {w['name']!r} has no field(s) {', '.join(sorted(extra))}")
    return cls(**{k: v for k, v in w.items() if k != "name"})


# ------------------------------------------------------------------------------------------ traces
def cycles_to_wire(cycles) -> list[dict]:
    return [c.to_dict() for c in cycles]


def cycles_from_wire(items) -> list[Cycle]:
    return [Cycle.from_dict(d) for d in items]


def _head_fields() -> list:
    return [f for f in dataclasses.fields(Trace) if f.name != "cycles"]


def _is_record(f) -> bool:
    return "ForwardRecord" in str(f.type)


def trace_head_to_wire(trace: Trace) -> dict:
    """A trace without its cycles (they travel separately, from an index on). Every other Trace
    field travels, so one added to Trace needs no change here."""
    out = {}
    for f in _head_fields():
        v = getattr(trace, f.name)
        out[f.name] = v.to_dict() if _is_record(f) and v is not None else v
    return out


def trace_from_wire(head: dict, cycles=()) -> Trace:
    kw = {}
    for f in _head_fields():
        if f.name in head:
            v = head[f.name]
            kw[f.name] = ForwardRecord.from_dict(v) if _is_record(f) and v is not None else v
    return Trace(cycles=list(cycles), **kw)


def copy_trace_head(src: Trace, dst: Trace) -> None:
    """Update ``dst`` in place (its cycles list untouched) to ``src``'s head fields."""
    for f in _head_fields():
        setattr(dst, f.name, getattr(src, f.name))


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
