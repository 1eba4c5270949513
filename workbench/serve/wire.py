"""The wire format between ``python -m workbench serve`` and ``wb.connect``: versioned JSON (docs/wire-format.md).

Shared by the server and the client, so it imports neither. A cycle travels as its
``Cycle.to_dict()`` record, each tensor as a JSON list when small (up to ``tensor_codec.LIST_MAX`` values:
the cheapest to write and to read) and packed when large (``workbench.records.tensor_codec.pack_tensor``: raw little-endian
bytes in the narrowest integer type that holds the values, zlib, base64), and without its
``visibility`` when that is the tree's ancestor-or-self matrix, which the receiver rebuilds
from ``parents`` (a DDTree(1024) cycle: ~40 KiB instead of ~7 MB of JSON booleans). A *view*
record (``records="view"``, what a step's reply carries unless the client asks for more) leaves
out the fields in ``VIEW_LEAVES_OUT``; the client fetches them when first read
(``workbench.serve.lazy_cycle``). Fields added to ``Cycle`` travel without a change here. Any
change to what a message means bumps WIRE_VERSION.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json

import torch

from workbench.records.cycle import Cycle, Trace
from workbench.records.forward import ForwardRecord
from workbench.records.tensor_codec import is_wire_tensor, tensor_to_wire, unpack_tensor
from workbench.engine import policies
from workbench.serve.lazy_cycle import LazyCycle

# The one place the wire version lives. 2: packed tensors, visibility from parents, pages; 3: view records
# (the rest fetched when read), replies that carry what changed since the client's last one, /run streams.
WIRE_VERSION = 3
VERSION_HEADER = "X-Workbench-Wire"
ECHO_CHARS = 80  # how much of a client's value an error message quotes
RECORDS = ("view", "full")  # what a reply's cycles carry: what a view reads, or every field
# What a view record leaves out: the drafter's top-k, the target's top-2 logits, the forward records and the
# verify's inputs (mask, positions, retrieve arrays, recurrent-state parents). The views (the tree, the token
# stream, the Stepper) and a trace's summary read none of them.
VIEW_LEAVES_OUT = frozenset({"draft_topk_tokens", "draft_topk_logprobs", "target_top2_tokens", "target_top2_logits",
                             "forwards", "visibility", "position_ids", "retrieve_next_token",
                             "retrieve_next_sibling", "state_from"})
CYCLE_FIELDS = dataclasses.fields(Cycle)  # (looked up once: fields() rebuilds its tuple at every call)
# Why a /run stream may end with its session unfinished: one of the server's per-stream bounds (the client asks
# again, from the cycles it holds)
STREAM_BOUNDS = ("max_stream_cycles", "max_stream_bytes", "max_stream_seconds")


class WireVersionError(RuntimeError):
    """The client and the server speak different wire versions."""


def version_mismatch(client: object, server: object) -> str:
    return (f"wire version mismatch: the client speaks version {str(client)[:40]}, the server speaks version "
            f"{str(server)[:40]}; install the same workbench version on both sides")


def short(value, limit: int = ECHO_CHARS) -> str:
    """repr(value), cut to ``limit`` characters: error messages never echo unbounded client input."""
    r = repr(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else str(value)
    if len(r) > limit:  # a 5000-digit integer or a megabyte prompt: say how long it was instead
        r = f"{r[:limit - 20]}...({len(r)} chars)"
    return r


# ------------------------------------------------------------------------------------------ JSON
def dumps(obj) -> bytes:
    # allow_nan: log-probs can be -inf; Python's json reads these tokens back (documented in the format).
    return json.dumps(obj, allow_nan=True, separators=(",", ":")).encode()


def loads(raw: bytes):
    return json.loads(raw)


# ------------------------------------------------------------------------------------------ policies
def policy_to_wire(p) -> dict:
    """AR() -> {"name": "ar"}; DDTree(32) -> {"name": "ddtree", "budget": 32, "width": None}: the policy
    registry's ``to_wire``. A policy the wire cannot carry (a TreePolicy holds a Python function) is refused."""
    return policies.to_wire(p)


def policy_from_wire(w):
    """The inverse of policy_to_wire; a string such as "ddtree:32" is accepted too (handy with curl)."""
    if isinstance(w, str):
        return policies.parse_policy(w[:200])  # parse_policy quotes its input in errors
    if not isinstance(w, dict) or not isinstance(w.get("name"), str):
        raise ValueError(f"policy {short(w)} must be a string like 'ddtree:32' or an object with a 'name'")
    return policies.from_wire(w)


def tree_visibility(parents: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """parents/depth int64 [n] -> bool [n, n] ancestor-or-self: what tree compile gives for a tree."""
    from ddtree_kernels.tree_compile import ancestor_matrix

    max_depth = int(depth.max()) if depth.numel() else 0
    return ancestor_matrix(parents[None], max_depth)[0]


# ------------------------------------------------------------------------------------------ cycles
def check_records(records) -> str:
    if records not in RECORDS:
        raise ValueError(f"records={short(records)} must be 'view' (what a view reads; the rest is fetched when "
                         "read) or 'full' (every field)")
    return records


def cycle_to_wire(c: Cycle, records: str = "full") -> dict:
    """``c.to_dict()`` with small tensors as lists and large ones packed; ``visibility`` left out when
    ``parents`` implies it. ``records="view"``: without the fields of ``VIEW_LEAVES_OUT``, marked
    ``"view": true``."""
    view = check_records(records) == "view"
    out = {}
    for f in CYCLE_FIELDS:
        if view and f.name in VIEW_LEAVES_OUT:
            continue
        v = getattr(c, f.name)
        if isinstance(v, torch.Tensor):
            if f.name == "visibility" and torch.equal(v, tree_visibility(c.parents, c.depth)):
                continue  # the receiver rebuilds it; only a mask that is not the tree's travels
            out[f.name] = tensor_to_wire(v)
        elif f.name == "forwards":
            out[f.name] = [r.to_dict() for r in v]
        else:
            out[f.name] = v
    if view:
        out["view"] = True
    return out


def cycle_from_wire(d: dict, fetch=None) -> Cycle:
    """The inverse of ``cycle_to_wire``; a version 1 record (``Cycle.to_dict()``) reads too. A view record
    becomes a ``LazyCycle`` whose other fields ``fetch(index)`` fills when first read."""
    if not isinstance(d, dict):
        raise ValueError(f"a cycle record is a JSON object, not {type(d).__name__}")
    if d.get("view") is True:  # its tensors are unpacked when first read
        return LazyCycle.from_view({k: v for k, v in d.items() if k != "view"}, fetch)
    d = {k: unpack_tensor(v) if is_wire_tensor(v) else v for k, v in d.items()}
    if "visibility" not in d and "parents" in d and "depth" in d:
        d["visibility"] = tree_visibility(d["parents"], d["depth"])
    return Cycle.from_dict(d)


def cycles_to_wire(cycles, records: str = "full") -> list[dict]:
    return [cycle_to_wire(c, records) for c in cycles]


def cycles_from_wire(items, fetch=None) -> list[Cycle]:
    return [cycle_from_wire(d, fetch) for d in items]


# ------------------------------------------------------------------------------------------ traces
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
