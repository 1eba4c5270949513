"""The linear layers of the engine's own CPU forwards through oneDNN, with weights prepacked once.

A verify or a draft block multiplies 16-65 rows by each weight. At that size oneDNN's GEMM with the
weight packed once for its kernels beats the MKL GEMM that ``nn.Linear`` calls: the embedded target's
tree verify of 17-65 nodes ran 1.2-1.3x faster with it (float32, one thread). vLLM's CPU backend packs
its weights for oneDNN the same way. The products differ from MKL's in rounding only (about 1e-6 in
float32), as two GEMM libraries' do.

``enable(model)`` turns it on for one model (the engine's loader does, on a CPU, in float32, up to
``MAX_PACKED_BYTES`` of linear weights: the packed copy doubles their memory); ``linear_for(model)`` is
what the own forwards call for every linear layer: the packed product where enabled, ``F.linear``
(bit for bit ``nn.Linear``) otherwise. A weight changed in place or replaced is packed again at its next
use: its version counter and storage are checked on every call, so an edited model never runs stale.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MAX_PACKED_BYTES = 1 << 30  # packing copies every linear weight: at most 1 GiB of them per model
PACK_ROWS = 32  # the row count oneDNN is told to expect when packing (a verify's or a draft block's size)
# oneDNN builds a kernel for every new row count on its first use (1-5 ms each, cached after): products of up
# to 80 rows (a verify of 65 nodes, a draft block, a cycle's new context) run packed, a bounded set of
# kernels that a session warms within its first cycles; longer ones (prefills, wide batches) run as plain.
MAX_PACKED_ROWS = 80


def plain_linear(module: nn.Linear, x: Tensor) -> Tensor:
    """``nn.Linear``'s own product, without its module call (the forwards check hooks themselves)."""
    return F.linear(x, module.weight, module.bias)


class PackedLinears:
    """Per linear module: its weight packed for oneDNN, repacked whenever the weight changed."""

    def __init__(self):
        self._packed: dict[int, tuple[Tensor, int, int, Tensor]] = {}  # id(module) -> (weight, version, ptr, packed)

    def __call__(self, module: nn.Linear, x: Tensor) -> Tensor:
        w = module.weight
        if x.numel() > MAX_PACKED_ROWS * x.shape[-1] or (w.requires_grad and torch.is_grad_enabled()):
            return F.linear(x, w, module.bias)  # many rows; or a backward wanted (the packed product has none)
        entry = self._packed.get(id(module))
        if entry is None or entry[0] is not w or entry[1] != w._version or entry[2] != w.data_ptr():
            with torch.no_grad():
                packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)
            entry = self._packed[id(module)] = (w, w._version, w.data_ptr(), packed)
        return torch.ops.mkldnn._linear_pointwise(x, entry[3], module.bias, "none", [], "")


_enabled: "weakref.WeakKeyDictionary[nn.Module, PackedLinears]" = weakref.WeakKeyDictionary()


def why_not(model: nn.Module) -> str | None:
    """Why ``model``'s linear layers cannot run packed, or None when they can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch has no oneDNN"
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        return "no linear layers"
    if any(m.weight.device.type != "cpu" for m in linears):
        return "weights off the CPU"
    if any(m.weight.dtype != torch.float32 for m in linears):
        return "weights not in float32"
    size = sum(m.weight.nelement() * m.weight.element_size() for m in linears)
    if size > MAX_PACKED_BYTES:
        return f"{size / 2**30:.1f} GiB of linear weights (packing copies them; the limit is 1 GiB)"
    return None


def enable(model: nn.Module) -> bool:
    """Run ``model``'s linear layers packed in the own forwards, where ``why_not`` allows. -> whether it does."""
    if why_not(model) is not None:
        return False
    _enabled.setdefault(model, PackedLinears())
    return True


def disable(model: nn.Module) -> None:
    """Back to ``F.linear`` for ``model`` (the packed copies are dropped)."""
    _enabled.pop(model, None)


def linear_for(model: nn.Module):
    """The product the own forwards use for ``model``'s linear layers: ``(module, x) -> Tensor``."""
    return _enabled.get(model, plain_linear)
