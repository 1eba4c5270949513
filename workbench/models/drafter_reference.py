"""The workbench's side of a conformance comparison, computed from scratch for one context.

Everything here is what z-lab's dflash and the workbench's engine compute, without any cache, so that a
production engine's tensors for the same context can be held against it:
- ``features``: the target's hidden state after each of the drafter's layers, transformers'
  ``hidden_states[k + 1]`` for layer k, one chunk per target layer id (what the drafter's ``fc`` reads);
- ``draft_logits``: the drafter's logits for the block [last token, mask x K] after a context;
- ``attention`` / ``mlp``: one drafter layer's attention or MLP on given inputs (the production engine's
  own inputs, so that a difference is that layer's and not its inputs').
"""
from __future__ import annotations

import torch
from torch import Tensor

from workbench.models.config_facts import draft_value


class Reference:
    """Reference computations on a loaded pair (``workbench.engine.loading.Models``), float32 on its device."""

    def __init__(self, models):
        self.models = models
        self.target, self.draft = models.target, models.draft
        self.layer_ids = list(models.target_layer_ids)
        self.hidden = int(self.target.config.get_text_config(decoder=True).hidden_size)

    @torch.inference_mode()
    def features(self, ids: list[int]) -> list[Tensor]:
        """One [len(ids), H] chunk per drafter layer id: the target's hidden state after that layer
        (transformers' ``hidden_states[k + 1]``: the final-normed output for the last layer)."""
        x = torch.tensor([ids], device=self.models.device)
        out = self.target(input_ids=x, output_hidden_states=True, use_cache=False)
        return [out.hidden_states[k + 1][0].float().cpu() for k in self.layer_ids]

    @torch.inference_mode()
    def draft_logits(self, ids: list[int], k: int) -> Tensor:
        """[k, V]: the drafter's logits for slots 1..k of the block [ids[-1], mask x k] after ids[:-1]."""
        ctx = torch.cat(self.features(ids[:-1]), dim=-1)[None].to(self.models.device, self.models.dtype)  # [1, P, L*H]
        p = len(ids) - 1
        block = torch.tensor([[ids[-1]] + [self.models.mask_token_id] * k], device=self.models.device)
        emb = self.target.get_input_embeddings()
        noise = emb(block) * float(draft_value(self.draft.config, "input_embedding_scale", 1.0))
        positions = torch.arange(p + k + 1, device=self.models.device)[None]
        hidden = self.draft(position_ids=positions, noise_embedding=noise, target_hidden=ctx, use_cache=False)
        return self.draft.compute_logits(hidden[:, 1:], self.target.lm_head)[0].float().cpu()

    @torch.inference_mode()
    def attention(self, layer: int, query_in: Tensor, context_states: Tensor, positions: Tensor | None = None) -> Tensor:
        """Layer ``layer``'s attention output [Q, H] for its (normed) query input [Q, H] and the context after
        the drafter's ``fc`` [P, H] (the drafter's ``hidden_norm`` is applied here, as dflash does).
        ``positions`` [P + Q]: the context's then the block's (default 0 .. P + Q - 1, the reference's own);
        a production engine's own positions make a difference here the layer's, not its positions'."""
        dev, dt = self.models.device, self.models.dtype
        q = query_in[None].to(dev, dt)
        ctx = self.draft.hidden_norm(context_states[None].to(dev, dt))
        n = ctx.shape[1] + q.shape[1]
        pos = torch.arange(n) if positions is None else positions.reshape(-1).long()
        if pos.numel() != n:
            raise ValueError(f"positions has {pos.numel()} entries; the context and block have {n} rows")
        cos_sin = self.draft.rotary_emb(q, pos.to(dev)[None])
        out = self.draft.layers[layer].self_attn(hidden_states=q, target_hidden=ctx, position_embeddings=cos_sin,
                                                 attention_mask=None)[0]
        return out[0].float().cpu()

    @torch.inference_mode()
    def mlp(self, layer: int, x: Tensor) -> Tensor:
        dev, dt = self.models.device, self.models.dtype
        return self.draft.layers[layer].mlp(x.to(dev, dt)).float().cpu()

    @torch.inference_mode()
    def fc(self, features: Tensor) -> Tensor:
        """The drafter's ``fc`` over raw features [n, L * H] -> [n, H] (before its hidden_norm)."""
        return self.draft.fc(features.to(self.models.device, self.models.dtype)).float().cpu()


def rel_diff(a: Tensor, b: Tensor) -> float:
    """max |a - b| / max |b|: 0 for equal tensors, about 1 when they share nothing."""
    a, b = a.float(), b.float()
    if a.shape != b.shape:
        return float("inf")
    scale = float(b.abs().max()) or 1.0
    return float((a - b).abs().max()) / scale


def rms(t: Tensor) -> float:
    return float(t.float().pow(2).mean().sqrt())
