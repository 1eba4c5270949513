"""Workarounds for two silent losses of vLLM 0.32.0's DFlash path, applied at runtime (``apply()``).

Both keep vLLM's output lossless and cost acceptance only, so nothing in its outputs shows them; the
comparison report (``workbench.adapters.compare``) finds them from its own measurements, and with
``workarounds=True`` checks that the drafts then equal the reference's cycle for cycle. They patch classes
of the installed vLLM in this process, for that version only, and ``undo()`` restores them.

1. ``last_layer_feature``: vLLM captures the target's feature for a drafter layer id k inside the layer
   loop, before the final norm (``Qwen2Model.forward`` with ``aux_hidden_state_layers`` = id + 1). For k =
   the last layer that is the pre-norm residual stream, where transformers' ``hidden_states[k + 1]`` (what
   dflash trains on) is the final-normed output. The patch hands the drafter the normed output for that id.
2. ``per_layer_k_norm``: ``DFlashQwen3Model._normalize_context_k`` normalises every drafter layer's context
   keys in one ``rms_norm`` call with the layers' ``k_norm`` weights stacked [L, head_dim]; on the CPU build
   that kernel applies the first row to every layer. The patch normalises each layer with its own row.
"""
from __future__ import annotations

import functools

import torch

from workbench.adapters.vllm_tap import check_version

VERSION = "0.32.0"
_undo: list = []


def _last_layer_feature():
    from vllm.model_executor.models.qwen2 import Qwen2Model

    original = Qwen2Model.forward

    @functools.wraps(original)  # vLLM's compile decorator reads the forward's signature
    def forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        layers = tuple(getattr(self, "aux_hidden_state_layers", ()) or ())
        if isinstance(out, tuple) and len(out) == 2 and len(self.layers) in layers:
            hidden, aux = out
            aux = list(aux)
            aux[sorted(layers).index(len(self.layers))] = hidden  # the final-normed output, as transformers gives it
            return hidden, aux
        return out

    Qwen2Model.forward = forward
    return lambda: setattr(Qwen2Model, "forward", original)


def _per_layer_k_norm():
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    original = DFlashQwen3Model._normalize_context_k

    @functools.wraps(original)
    def normalize(self, all_k: torch.Tensor) -> torch.Tensor:  # all_k [L, n_ctx, n_kv, head_dim]
        w = self._k_norm_weights  # [L, head_dim]: row l is layer l's k_norm
        x = all_k.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._rms_norm_eps)
        return w[:, None, None, :] * x.to(all_k.dtype)

    DFlashQwen3Model._normalize_context_k = normalize
    return lambda: setattr(DFlashQwen3Model, "_normalize_context_k", original)


PATCHES = {"last_layer_feature": _last_layer_feature, "per_layer_k_norm": _per_layer_k_norm}


def apply(names=tuple(PATCHES)) -> tuple[str, ...]:
    """Patch the installed vLLM (must be 0.32.0) before an engine loads; returns the names applied."""
    v = check_version()
    if v.split("+")[0] != VERSION:
        raise RuntimeError(f"these workarounds are for vLLM {VERSION}, not {v}")
    unknown = [n for n in names if n not in PATCHES]
    if unknown:
        raise ValueError(f"unknown workaround(s) {unknown}; known: {sorted(PATCHES)}")
    undo()
    for n in names:
        _undo.append(PATCHES[n]())
    return tuple(names)


def undo() -> None:
    while _undo:
        _undo.pop()()
