"""The engine's own forwards: Llama-layout dense targets (Qwen3, Qwen3-MoE, Qwen2, Llama, Mistral) and
DFlash drafters.

transformers' model forward wraps the same decoder layers in generic machinery: output recorders that
hook every layer for ``output_hidden_states``, a mask builder, keyword plumbing through every module,
and an RMSNorm of six or seven ops. For the small models this workbench runs on a CPU, where a verify is
bound by op dispatch rather than arithmetic, that machinery is about a quarter of a verify's time. This
forward runs the same modules' weights layer by layer with the same ops (RMSNorm through the fused
``F.rms_norm``), so on a CPU its outputs equal the model's own forward bit for bit
(``tests/models/test_dense_forward.py``; on CUDA the fused RMSNorm kernel may round differently: not run), the
way SGLang runs a checkpoint through its own model code.

``plan(target)`` says once per model whether it applies (else the caller runs the model's own forward):
a supported family, only full-attention layers, SDPA attention, no MLA. ``draft_plan(draft)`` the same
for a drafter: DFlash (not DFlash 2's convolutions) with non-causal, unwindowed layers. Both forwards
also step aside while any module they would bypass carries a hook (a user's forward hook, accelerate's
device hooks, the drafter's per-layer mask hook), so hooks always see what they expect.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from workbench.models.config_facts import FAMILY_OF_MODEL_TYPE, layer_kinds
from workbench.models.packed_linear import linear_for


_plans: "weakref.WeakKeyDictionary[torch.nn.Module, Plan | None]" = weakref.WeakKeyDictionary()
_draft_plans: "weakref.WeakKeyDictionary[torch.nn.Module, Plan | None]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Plan:
    model: torch.nn.Module  # the decoder stack (``target.model``; the drafter itself)
    bypassed: tuple  # modules whose own forward is not called: a hook on one of them means "step aside"
    heads: int
    kv_heads: int
    head_dim: int
    gated_mlps: tuple  # per layer: True where the MLP is down(act(gate(x)) * up(x)), run here linear by linear


# MLPs whose forward is exactly down_proj(act_fn(gate_proj(x)) * up_proj(x)), without biases of their own.
GATED_MLPS = frozenset({"Qwen3MLP", "Qwen2MLP", "LlamaMLP", "MistralMLP", "Qwen3MoeMLP"})


def _linears(module) -> list:
    """The linear layers the own forwards call directly (their hooks, too, mean "step aside")."""
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def _gated(mlp) -> bool:
    return type(mlp).__name__ in GATED_MLPS and all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))


def _why_not(target) -> str | None:
    cfg = target.config
    row = FAMILY_OF_MODEL_TYPE.get(cfg.model_type)
    if row is None or not row.own_forward:
        return f"family {cfg.model_type!r}"
    if any(t != "full_attention" for t in layer_kinds(cfg)):
        return "sliding-window layers"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "a sliding window"
    if getattr(cfg, "_attn_implementation", "sdpa") != "sdpa":
        return f"attention {cfg._attn_implementation!r}"
    model = getattr(target, "model", None)
    layers = getattr(model, "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") for layer in layers):
        return "an unknown module layout"
    return None


def plan(target) -> Plan | None:
    """How ``forward`` runs ``target``, or None when it does not (cached per model)."""
    if target in _plans:
        return _plans[target]
    p = None
    if _why_not(target) is None:
        model, cfg = target.model, target.config
        bypassed = [target, model, model.norm, target.lm_head]
        gated = tuple(_gated(layer.mlp) for layer in model.layers)
        for layer, own_mlp in zip(model.layers, gated):
            a = layer.self_attn
            bypassed += [layer, a, layer.input_layernorm, layer.post_attention_layernorm, *_linears(a)]
            bypassed += [m for m in (getattr(a, "q_norm", None), getattr(a, "k_norm", None)) if m is not None]
            if own_mlp:
                bypassed += [layer.mlp, *_linears(layer.mlp)]
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        p = Plan(model, tuple(bypassed), cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, gated)
    _plans[target] = p
    return p


# transformers' own output recorders: hooks it installs on first use that act only inside its own forward.
_RECORDERS = "transformers.utils.output_capturing"


def draft_plan(draft) -> Plan | None:
    """How ``draft_forward`` runs a DFlash drafter, or None when it does not (cached per model)."""
    if draft in _draft_plans:
        return _draft_plans[draft]
    p = None
    layers = getattr(draft, "layers", None)
    plain = type(draft).__name__ == "DFlashDraftModel" and layers is not None and all(
        getattr(layer, "attention_conv", None) is None and getattr(layer, "mlp_conv", None) is None
        and not layer.self_attn.is_causal and layer.self_attn.sliding_window is None for layer in layers)
    if plain:
        cfg = draft.config
        bypassed = [draft, draft.norm, draft.hidden_norm, draft.fc]
        gated = tuple(_gated(layer.mlp) for layer in layers)
        for layer, own_mlp in zip(layers, gated):
            a = layer.self_attn
            bypassed += [layer, a, layer.input_layernorm, layer.post_attention_layernorm, a.q_norm, a.k_norm,
                         *_linears(a)]
            if own_mlp:
                bypassed += [layer.mlp, *_linears(layer.mlp)]
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        p = Plan(draft, tuple(bypassed), cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, gated)
    _draft_plans[draft] = p
    return p


def _hooked(p: Plan) -> bool:
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    for m in p.bypassed:
        if m._forward_pre_hooks or "_hf_hook" in m.__dict__:
            return True
        if m._forward_hooks and any(getattr(h, "__module__", None) != _RECORDERS for h in m._forward_hooks.values()):
            return True
    return False


def _rms(x: Tensor, norm) -> Tensor:
    """transformers' RMSNorm: normalise in float32, cast back, then scale (fused when already float32)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), None, norm.variance_epsilon).to(x.dtype)


def _mlp(mlp, x: Tensor, gated: bool, lin) -> Tensor:
    """A layer's MLP: a gated one linear by linear through ``lin``; any other through its own forward."""
    if not gated:
        out = mlp(x)
        return out[0] if isinstance(out, tuple) else out
    return lin(mlp.down_proj, mlp.act_fn(lin(mlp.gate_proj, x)) * lin(mlp.up_proj, x))


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def forward(target, ids: Tensor, positions: Tensor, cache, mask: Tensor | None, hidden_ids: list[int] | None,
            logits_to_keep: int = 0) -> tuple[Tensor, list[Tensor]] | None:
    """One forward of ``target`` over ``ids`` [bs, n] at ``positions`` [bs, n], writing K/V into ``cache``.

    mask: [bs, 1, n, keys] (additive or bool) or None (causal from an empty cache, or one token per row).
    hidden_ids: which entries of transformers' ``hidden_states`` to return (0 = embeddings, i = layer i's
    output, the last one after the final norm). -> (logits [bs, n or logits_to_keep, V], those hidden
    states), or None when this forward does not apply and the model's own must run.
    """
    p = plan(target)
    bs, n = ids.shape
    if p is None or _hooked(p) or (mask is None and n > 1 and cache.get_seq_length() > 0):
        return None
    model, last = p.model, len(p.model.layers)
    lin = linear_for(target)  # every linear layer's product (oneDNN-packed where the loader enabled it)
    x = model.embed_tokens(ids)  # [bs, n, hidden]
    cos, sin = model.rotary_emb(x, positions)  # [bs, n, head_dim]
    cos, sin = cos[:, None], sin[:, None]
    want = set(hidden_ids or ())
    hidden = {0: x} if 0 in want else {}
    for i, layer in enumerate(model.layers):
        a = layer.self_attn
        h = _rms(x, layer.input_layernorm)
        q = lin(a.q_proj, h).view(bs, n, p.heads, p.head_dim)
        k = lin(a.k_proj, h).view(bs, n, p.kv_heads, p.head_dim)
        v = lin(a.v_proj, h).view(bs, n, p.kv_heads, p.head_dim).transpose(1, 2)  # [bs, kv_heads, n, head_dim]
        if getattr(a, "q_norm", None) is not None:  # Qwen3: per-head norms before the rotation
            q, k = _rms(q, a.q_norm), _rms(k, a.k_norm)
        q = _rotate(q.transpose(1, 2), cos, sin)  # [bs, heads, n, head_dim]
        k = _rotate(k.transpose(1, 2), cos, sin)
        keys, values = cache.update(k, v, i)  # [bs, kv_heads, keys, head_dim]
        m = None if mask is None else mask[:, :, :, : keys.shape[-2]]
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=m, is_causal=mask is None and n > 1,
                                           scale=a.scaling, enable_gqa=p.heads != p.kv_heads)
        x = x + lin(a.o_proj, o.transpose(1, 2).reshape(bs, n, -1))
        x = x + _mlp(layer.mlp, _rms(x, layer.post_attention_layernorm), p.gated_mlps[i], lin)
        if i + 1 in want and i + 1 < last:
            hidden[i + 1] = x
    x = _rms(x, model.norm)
    if last in want:
        hidden[last] = x
    logits = lin(target.lm_head, x if logits_to_keep == 0 else x[:, -logits_to_keep:])
    return logits, [hidden[j] for j in (hidden_ids or ())]


def draft_forward(draft, noise: Tensor, positions: Tensor, context: Tensor, cache,
                  mask: Tensor | None) -> Tensor | None:
    """One DFlash block forward: ``noise`` [bs, block, hidden] (the block's embeddings, scaled) at the
    last ``block`` of ``positions`` [bs, ctx + block], after ``context`` [bs, ctx, F] (target features).
    mask: additive [bs, 1, block, keys] or None (every key visible). -> the final hidden states [bs,
    block, hidden] (dflash's own forward's output), or None when this forward does not apply."""
    p = draft_plan(draft)
    if p is None or _hooked(p):
        return None
    bs, n = noise.shape[:2]
    lin = linear_for(draft)
    ctx = _rms(lin(draft.fc, context), draft.hidden_norm)  # [bs, ctx, hidden]
    m = ctx.shape[1]
    cos, sin = draft.rotary_emb(noise, positions)  # [bs, ctx + block, head_dim]
    cos, sin = cos[:, None], sin[:, None]
    x = noise
    for i, layer in enumerate(draft.layers):
        a = layer.self_attn
        h = _rms(x, layer.input_layernorm)
        q = _rms(lin(a.q_proj, h).view(bs, n, p.heads, p.head_dim), a.q_norm).transpose(1, 2)
        # Keys and values over the context, then the block: each query sees both (no causal order).
        k = torch.cat([lin(a.k_proj, ctx), lin(a.k_proj, h)], dim=1).view(bs, m + n, p.kv_heads, p.head_dim)
        v = torch.cat([lin(a.v_proj, ctx), lin(a.v_proj, h)], dim=1).view(bs, m + n, p.kv_heads, p.head_dim)
        k = _rms(k, a.k_norm).transpose(1, 2)
        q = _rotate(q, cos[..., -n:, :], sin[..., -n:, :])
        k = _rotate(k, cos, sin)
        keys, values = cache.update(k, v.transpose(1, 2), i)
        att = None if mask is None else mask[:, :, :, : keys.shape[-2]]
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=att, scale=a.scaling,
                                           enable_gqa=p.heads != p.kv_heads)
        x = x + lin(a.o_proj, o.transpose(1, 2).reshape(bs, n, -1))
        x = x + _mlp(layer.mlp, _rms(x, layer.post_attention_layernorm), p.gated_mlps[i], lin)
    return _rms(x, draft.norm)
