"""The reference side of every comparison with an engine (``wb.compare``, ``wb.conform``), computed from scratch
for one context.

Everything here is what z-lab's dflash and the workbench's engine compute, without any cache, so that a
production engine's tensors for the same context can be held against it:
- ``features``: the target's hidden state after each of the drafter's layers, transformers'
  ``hidden_states[k + 1]`` for layer k, one chunk per target layer id (what the drafter's ``fc`` reads);
- ``states``: every layer's hidden state and the last layer's output before the final norm, over a context
  (the checker's features contract reads the drafter's layers and, for a mismatch, the others);
- ``node_states``: the same for every node of a tree, each from its own root-to-node path;
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
    def states(self, ids: list[int]) -> "TargetStates":
        """Every layer's hidden state over ``ids`` and the last layer's output before the final norm (one
        uncached forward; a forward pre-hook on the final norm reads its input)."""
        x = torch.tensor([ids], device=self.models.device)
        hidden, prenorm = self._forward(x)
        return TargetStates([h[0] for h in hidden], None if prenorm is None else prenorm[0], self.layer_ids)

    def _forward(self, x: Tensor) -> tuple:
        """(every layer's hidden states [B, T, H] each, the final norm's input [B, T, H] or None), on the device:
        the states stay there and are read a few rows at a time (a full-size target's would not fit the host)."""
        norm = getattr(getattr(self.target, "model", None), "norm", None)
        seen = []
        handle = None if norm is None else norm.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
        try:
            out = self.target(input_ids=x, output_hidden_states=True, use_cache=False)
        finally:
            if handle is not None:
                handle.remove()
        return out.hidden_states, (seen[-1] if seen else None)

    @torch.inference_mode()
    def node_states(self, context: list[int], tokens: list[int], parents: list[int]) -> "TargetStates":
        """Every layer's hidden state at every node of a tree (root first), each from its own root-to-node path
        after ``context`` (the root excluded): one uncached forward of context + path per node, batched and
        right-padded (causal: the padding reaches no real position). -> states over the nodes [layers + 1, n, H]."""
        n = len(tokens)
        paths = []
        for i in range(n):
            path, j = [], i
            while j >= 0:
                path.append(tokens[j])
                j = parents[j]
            paths.append(list(context) + path[::-1])
        width = max(map(len, paths))
        batch = torch.tensor([p + [p[-1]] * (width - len(p)) for p in paths], device=self.models.device)  # [n, W]
        hidden, prenorm = self._forward(batch)
        last = torch.tensor([len(p) - 1 for p in paths], device=self.models.device)
        rows = torch.arange(n, device=self.models.device)
        return TargetStates([h[rows, last] for h in hidden], None if prenorm is None else prenorm[rows, last],
                            self.layer_ids)

    @torch.inference_mode()
    def draft_logits(self, ids: list[int], k: int, features: Tensor | None = None) -> Tensor:
        """[k, V]: the drafter's logits for slots 1..k of the block [ids[-1], mask x k] after ids[:-1].
        ``features``: the context's drafter features [P, L*H] when already computed (``states(ids[:-1])``)."""
        if features is None:
            features = torch.cat(self.features(ids[:-1]), dim=-1)
        ctx = features[None].to(self.models.device, self.models.dtype)  # [1, P, L*H]
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


class TargetStates:
    """The target's hidden states over some positions (a context, or a tree's nodes), every layer's, where the
    forward left them (the device): read a few rows at a time, as float32 on the host.

    ``hidden``: transformers' ``hidden_states``, one [P, H] per entry (0: the embeddings; k + 1: after layer k,
    the last one after the final norm); ``prenorm`` [P, H]: the last layer's output before that norm (None: a
    model without a ``model.norm`` to read it from)."""

    def __init__(self, hidden, prenorm: Tensor | None, layer_ids: list[int]):
        self.hidden, self.prenorm, self.layer_ids = list(hidden), prenorm, list(layer_ids)

    @property
    def positions(self) -> int:
        return int(self.hidden[0].shape[0])

    @property
    def n_layers(self) -> int:
        return len(self.hidden) - 1

    def drafter_features(self) -> Tensor:
        """[P, L*H] float32 on the host: what the drafter reads, its target layers side by side
        (``Reference.features``, joined)."""
        return torch.cat([self.hidden[k + 1].float().cpu() for k in self.layer_ids], dim=-1)

    def layers(self, which: list[int], at: Tensor) -> Tensor:
        """[c, len(which), H] float32 on the host: the output of each layer in ``which`` (-1: the embeddings) at
        the positions ``at`` [c]."""
        idx = at.to(self.hidden[0].device)
        return torch.stack([self.hidden[k + 1][idx].float().cpu() for k in which], dim=1)

    def before_norm(self, at: Tensor) -> Tensor | None:
        """[c, H] float32 on the host: the last layer's output before the final norm at ``at`` (None: unknown)."""
        return None if self.prenorm is None else self.prenorm[at.to(self.prenorm.device)].float().cpu()


def rel_diff(a: Tensor, b: Tensor) -> float:
    """max |a - b| / max |b|: 0 for equal tensors, about 1 when they share nothing."""
    a, b = a.float(), b.float()
    if a.shape != b.shape:
        return float("inf")
    scale = float(b.abs().max()) or 1.0
    return float((a - b).abs().max()) / scale


def rms(t: Tensor) -> float:
    return float(t.float().pow(2).mean().sqrt())
