"""Tensors as JSON values, bit for bit: the one codec the wire format (``workbench.serve.wire``) and the cycle
dump (``workbench.conform.dump``) both write and read.

- ``pack_tensor``: the values as raw little-endian bytes (integers in the narrowest type that holds them,
  booleans as bits), zlib-compressed, base64 text: ``{"dtype", "shape", "as", "z"}``.
- ``tensor_to_wire``: the cheapest form to write and read: small tensors as lists (floats as raw bytes, ``"b"``),
  larger ones packed.
- ``unpack_tensor``: reads all three forms (and version 1's ``{"dtype", "shape", "data"}``).
"""
from __future__ import annotations

import base64
import math
import zlib

import numpy as np
import torch

LIST_MAX = 256  # a tensor of up to this many values travels as a JSON list (floats: raw bytes); a larger one packed
ECHO_CHARS = 80  # how much of a bad value an error message quotes
_INTS = (np.int8, np.int16, np.int32, np.int64)


def pack_tensor(t: torch.Tensor) -> dict:
    """A CPU tensor -> {"dtype", "shape", "as", "z"}: its values as raw little-endian bytes of numpy type
    ``as`` (integers in the narrowest type that holds them, exactly), zlib-compressed, base64 text."""
    a = t.detach().cpu().contiguous().numpy()
    if a.dtype == np.bool_:
        a, kind = np.packbits(a.reshape(-1)), "bits"  # 8 booleans a byte
    elif a.dtype.kind in "iu" and a.size:
        lo, hi = int(a.min()), int(a.max())
        narrow = next(n for n in _INTS if np.iinfo(n).min <= lo and hi <= np.iinfo(n).max)
        a, kind = a.astype(np.dtype(narrow).newbyteorder("<")), np.dtype(narrow).str
    else:
        a = a.astype(a.dtype.newbyteorder("<"))
        kind = a.dtype.str
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "as": kind,
            "z": base64.b64encode(zlib.compress(a.tobytes(), 6)).decode("ascii")}


def tensor_to_wire(t: torch.Tensor) -> dict:
    """A tensor as the cheapest form to write and read that keeps it bit for bit: up to ``LIST_MAX`` values,
    integers and booleans as ``{"dtype", "shape", "data": nested lists}`` and floats as their raw
    little-endian bytes, base64 (``"b"``: a float's text is long and slow to write and parse); larger ones
    packed (``pack_tensor``). ``unpack_tensor`` reads all three."""
    if t.numel() > LIST_MAX:
        return pack_tensor(t)
    if not t.is_floating_point() or t.dtype == torch.bfloat16:  # (numpy has no bfloat16; its repr is exact too)
        return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "data": t.tolist()}
    a = t.detach().cpu().contiguous().numpy()
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "as": a.dtype.str,
            "b": base64.b64encode(a.tobytes()).decode("ascii")}


def is_wire_tensor(v) -> bool:
    """Whether a JSON value is a tensor in one of the forms ``unpack_tensor`` reads."""
    return isinstance(v, dict) and "dtype" in v and ("z" in v or "b" in v or "data" in v)


def wire_dtype(d: dict) -> torch.dtype:
    """The torch dtype a tensor's JSON form names (ValueError, one line, for one torch does not have)."""
    dtype = getattr(torch, str(d.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {repr(d.get('dtype'))[:ECHO_CHARS]}")
    return dtype


def check_wire_tensor(d: dict) -> None:
    """The cheap part of ``unpack_tensor``'s checks, without unpacking: a known dtype, a shape of whole numbers,
    and a payload of the right JSON type (ValueError, one line). What it leaves (the bytes themselves) is
    checked when unpacked."""
    wire_dtype(d)
    shape = d.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ValueError(f"shape {repr(shape)[:ECHO_CHARS]} is not a list of whole numbers")
    payload = d.get("data", d.get("b", d.get("z")))
    # (a 0-d tensor's values, as tensor_to_wire writes them, are one number)
    want = (list, int, float) if "data" in d else str
    if not isinstance(payload, want):
        raise ValueError(f"its values are a {type(payload).__name__}, not {'a list' if 'data' in d else 'text'}")


def unpack_tensor(d: dict) -> torch.Tensor:
    """The inverse of ``pack_tensor``; also reads version 1's ``{"dtype", "shape", "data": nested lists}``."""
    dtype = wire_dtype(d)
    shape = [int(s) for s in d["shape"]]
    if "data" in d:  # a small tensor (and wire version 1's, and the trace files' form)
        t = torch.tensor(d["data"], dtype=dtype)
        return t if len(shape) == 1 and t.shape == (shape[0],) else t.reshape(shape)
    try:
        raw = base64.b64decode(d["b"], validate=True) if "b" in d else zlib.decompress(base64.b64decode(d["z"], validate=True))
    except zlib.error as e:  # (not a ValueError: said as one, as every other malformed value is)
        raise ValueError(f"its packed values do not decompress ({e})") from None
    count = math.prod(shape)
    if d["as"] == "bits":
        a = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=count).astype(np.bool_)
    else:
        a = np.frombuffer(raw, dtype=np.dtype(str(d["as"])), count=count)
    # a native-order copy (frombuffer's array is read-only), then the exact widening to the recorded dtype
    return torch.from_numpy(a.astype(a.dtype.newbyteorder("="))).to(dtype).reshape(shape)
