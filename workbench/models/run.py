"""One target or drafter forward through the model's own modules, leaving a ForwardRecord.

- target prefill: EXTEND; plain decoding (AR): DECODE; target verify of a chain or a tree: TARGET_VERIFY
- the DFlash drafter's block forward: TARGET_VERIFY on the draft model (as SGLang's DFlash worker runs it)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from workbench.models.config_facts import draft_value
from workbench.models.packed_linear import linear_for
from workbench.records.forward import ForwardMode, ForwardRecord, shape_of

FALLBACK_NOTE = "is falling back to its reference PyTorch implementation"


class _NoCpuFallbackNotes:
    """Drops transformers' note that a GatedDeltaNet / conv kernel runs its PyTorch reference for want of
    flash-linear-attention or causal_conv1d: those are CUDA kernels, so on a CPU the note is always true
    and says nothing (and it lands in every notebook cell that first runs a hybrid layer)."""

    def filter(self, record) -> bool:
        return FALLBACK_NOTE not in record.getMessage()


def _kernel_log():
    import logging

    return logging.getLogger("transformers.integrations.hub_kernels")


def quiet_cpu_kernel_notes() -> None:
    """Install the filter on transformers' kernel logger once (``load_models`` does, for a CPU device)."""
    log = _kernel_log()
    if not any(isinstance(f, _NoCpuFallbackNotes) for f in log.filters):
        log.addFilter(_NoCpuFallbackNotes())


class no_kernel_notes:
    """The same filter for the length of a ``with`` block (``shapes.plan``: nothing runs on the meta device)."""

    def __enter__(self):
        self._filter = _NoCpuFallbackNotes()
        _kernel_log().addFilter(self._filter)

    def __exit__(self, *exc) -> bool:
        _kernel_log().removeFilter(self._filter)
        return False


@dataclass
class TargetOutput:
    logits: Tensor  # [bs, n, V]
    features: Tensor | None  # [bs, n, len(layer_ids) * H]: the drafter's context
    record: ForwardRecord


def cache_length(cache) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


def run_target(target, ids: Tensor, positions: Tensor, cache, mode: ForwardMode, layer_ids: list[int] | None,
               mask: Tensor | None = None, capture=None, logits_to_keep: int = 0) -> TargetOutput:
    """One target forward. ids/positions [bs, n]; mask bool [bs, 1, n, past + n] or None (causal).

    ``logits_to_keep``: 0 computes logits at every position; k > 0 only at the last k (HF semantics).
    """
    from dflash.model import extract_context_feature

    from workbench.models import dense_forward

    before = cache_length(cache)
    # The engine's own forward where it applies (same ops; bit-identical on a CPU); a capture records the modules
    # of the model's own forward, so it always runs that one.
    own = None if capture else dense_forward.forward(target, ids, positions, cache, mask,
                                                     None if layer_ids is None else [i + 1 for i in layer_ids],
                                                     logits_to_keep)
    if own is not None:
        logits, chosen = own
        feats = torch.cat(chosen, dim=-1) if layer_ids is not None else None
        # What output_hidden_states would have returned: one [bs, n, hidden] per layer and the embeddings.
        hidden = (target.config.num_hidden_layers + 1, chosen[0]) if chosen else None
    else:
        with capture.forward("target", mode) if capture else nullctx():
            out = target(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache,
                         use_cache=True, output_hidden_states=layer_ids is not None, logits_to_keep=logits_to_keep)
        logits = out.logits
        hidden = (len(out.hidden_states), out.hidden_states[0]) if out.hidden_states else None
        feats = extract_context_feature(out.hidden_states, layer_ids) if layer_ids is not None else None
    inputs = {"input_ids": shape_of(ids), "positions": shape_of(positions)}
    if mask is not None:
        inputs["attention_mask"] = shape_of(mask)
    outputs = {"logits": shape_of(logits)}
    if feats is not None:
        outputs["hidden_states"] = {**shape_of(hidden[1]), "shape": [hidden[0]] + list(hidden[1].shape)}
        outputs["draft_context"] = shape_of(feats)
    rec = ForwardRecord("target", mode, inputs, outputs, before, cache_length(cache),
                        capture.take() if capture else ())
    return TargetOutput(logits, feats, rec)


def run_draft(draft, target, block_ids: Tensor, positions: Tensor, context: Tensor, cache, capture=None,
              mask: Tensor | None = None, keep: dict | None = None):
    """The drafter's block forward. block_ids [bs, B]; positions [bs, ctx + B]; context [bs, ctx, F];
    mask: additive [bs, 1, B, keys] or None (every key visible: the drafter is not causal). ``keep``: a dict
    that receives "hidden", the masked slots' final hidden states [bs, B-1, H] (the LM head's input).

    -> (logits [bs, B-1, V] for the masked slots, ForwardRecord)
    """
    from workbench.models import dense_forward

    before = cache_length(cache)
    emb = target.get_input_embeddings()
    scale = float(draft_value(draft.config, "input_embedding_scale", 1.0))
    with capture.forward("draft", ForwardMode.TARGET_VERIFY) if capture else nullctx():
        noise = emb(block_ids) * scale
        # The engine's own drafter forward where it applies (bit-identical on a CPU); a capture records dflash's.
        hidden = None if capture else dense_forward.draft_forward(draft, noise, positions, context, cache, mask)
        head = target.lm_head
        if hidden is None:
            hidden = draft(position_ids=positions, noise_embedding=noise, target_hidden=context,
                           past_key_values=cache, use_cache=True, attention_mask=mask)
        elif not (head._forward_hooks or head._forward_pre_hooks):  # the own forward ran: its product too
            lin = linear_for(target)

            def head(h: Tensor) -> Tensor:
                return lin(target.lm_head, h)
        logits = draft.compute_logits(hidden[:, 1:], head)
        if keep is not None:
            keep["hidden"] = hidden[:, 1:]
    rec = ForwardRecord(
        "draft", ForwardMode.TARGET_VERIFY,
        {"input_ids": shape_of(block_ids), "positions": shape_of(positions), "target_hidden": shape_of(context),
         **({"attention_mask": shape_of(mask)} if mask is not None else {})},
        {"logits": shape_of(logits), "hidden_states": shape_of(hidden)},
        before, cache_length(cache), capture.take() if capture else (),
    )
    return logits, rec


class nullctx:
    """The context a forward runs in when nothing captures it (cheaper than contextlib.nullcontext: no
    __init__, nothing stored)."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
