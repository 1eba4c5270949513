"""Hybrid targets (Qwen3-Next, Qwen3.5 / 3.6 text): gated full attention interleaved with GatedDeltaNet
linear attention, behind the same ``TargetState`` interface as a dense target.

``HybridGDN`` is a composite, like SGLang's ``HybridLinearAttnBackend``: the full-attention layers keep
per-token K/V in dense.py's ``KVBuffers`` with its ``PrefixMask`` (tree verify = scratch rows past each
length, then compaction); every linear-attention layer keeps, per request, its committed conv window
``[conv_dim, K-1]`` and recurrent state ``[HV, Dk, Dv]`` (SGLang's ``conv_state`` / ``temporal`` pool rows,
transformers' state layout).

- Prefill (EXTEND): the model's own chunked path (transformers' ``causal_conv1d_fn`` and chunked delta
  rule) into a transformers linear-attention cache layer, whose state is then taken over.
- Tree verify (TARGET_VERIFY) and decode: a recurrent layer takes no mask, so each linear layer runs
  ``gdn_layer_tree_forward`` instead: every node convolves its ancestor chain and starts from its
  parent's state (the root from the request's committed state), through the session's kernel backend
  (torch's level-batched path, checked against the per-node oracle, or SGLang's Triton kernels). Each node's window and state are kept as scratch
  (SGLang's ``intermediate_conv_window`` / ``intermediate_states_buffer``); committed state is untouched.
- Commit: the deepest accepted node's window and state become the request's (SGLang's
  ``update_mamba_state_after_mtp_verify``); the attention K/V compacts as for a dense target. Nothing is
  recomputed, and there is no crop: a recurrent state cannot be rolled back without a checkpoint.

The swap: transformers hands the same cache object to every layer (``cache_params`` for a linear layer),
so each GatedDeltaNet module's forward is wrapped once to ask that object how to run (``HybridCache.
gdn_forward``); a forward with any other cache runs the module's own code. No global state.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers.cache_utils import Cache, LinearAttentionLayer

from ddtree_kernels.gdn_tree import commit_nodes
from workbench.records.forward import ForwardMode, shape_of
from workbench.models.run import run_target
from workbench.models.gdn_layer import gdn_layer_tree_forward
from workbench.models.layout import TreeLayout
from workbench.models.base import StateSpec, StepOut, register_target_state
from workbench.models.dense import KVBuffers, PrefixMask, additive

# Text model types whose GatedDeltaNet layer ``gdn_layer_tree_forward`` knows (Qwen3-Next's interleaved
# qkvz projection, Qwen3.5's split one). A nested Qwen3.5 / 3.6 checkpoint loads as its text model.
SUPPORTED = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


def text_config(config):
    return config.get_text_config(decoder=True)


def is_hybrid(config) -> bool:
    """Any target with linear-attention layers (the dense state would verify it wrongly)."""
    return "linear_attention" in (getattr(text_config(config), "layer_types", None) or ())


def check_supported(config) -> None:
    """Raise a one-line ValueError for a hybrid this state cannot run."""
    c = text_config(config)
    if c.model_type not in SUPPORTED:
        raise ValueError(f"target model_type {c.model_type!r} has linear-attention layers, but hybrid tree verify "
                         f"supports only {', '.join(SUPPORTED)}")


# -------------------------------------------------------------------------------------------- the cache
@dataclass
class TreeRoute:
    """How the linear layers run in the current forward: over a tree, through ``backend``."""

    backend: str
    parents: Tensor  # int64 [B, N]: -1 at the root; padding nodes hang off the root (inert)
    next_token: Tensor  # int64 [B, N]: the EAGLE links SGLang's kernels read
    next_sibling: Tensor


class GDNSlot:
    """One linear-attention layer's committed state for every row: ``conv`` [B, conv_dim, K-1] (the last
    K-1 inputs of the q|k|v conv, oldest first; the model's dtype) and ``ssm`` [B, HV, Dk, Dv] float32."""

    is_sliding = False  # what transformers' Cache asks of every layer
    is_compileable = False
    supports_early_init = False

    def __init__(self):
        self.conv: Tensor | None = None
        self.ssm: Tensor | None = None
        self.scratch: tuple[Tensor, Tensor] | None = None  # last verify: per-node windows, states


class HybridCache(Cache):
    """The one cache object the target's forward sees: ``KVLayer``s (owned by ``kv``) at the attention
    layers, ``GDNSlot``s at the linear ones, and the route the swapped GatedDeltaNet forwards read."""

    def __init__(self, config, lengths: list[int]):
        types = list(text_config(config).layer_types)
        self.attn_ids = [i for i, t in enumerate(types) if t != "linear_attention"]
        self.linear_ids = [i for i, t in enumerate(types) if t == "linear_attention"]
        self.kv = KVBuffers(config, lengths, num_layers=len(self.attn_ids))
        kv_layers = iter(self.kv.layers)
        super().__init__(layers=[GDNSlot() if t == "linear_attention" else next(kv_layers) for t in types])
        self.route: TreeRoute | None = None  # set for a tree forward; None: prefill
        self.prompt_lengths: list[int] | None = None  # set for a ragged prefill

    @property
    def slots(self) -> list[GDNSlot]:
        return [self.layers[i] for i in self.linear_ids]

    # transformers' Cache asks these of layer 0, which may be linear: answer from the attention buffers.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv.width()

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.layers[self.attn_ids[0]].get_mask_sizes(query_length)

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return False  # never read: every linear forward goes through gdn_forward

    def gdn_forward(self, module, original, hidden: Tensor, attention_mask, kwargs) -> Tensor:
        """A GatedDeltaNet layer's forward in a forward over this cache. hidden: [B, n, hidden]."""
        slot = self.layers[module.layer_idx]
        if self.route is not None:
            r = self.route
            out = gdn_layer_tree_forward(module, hidden, slot.conv, slot.ssm, r.parents, r.next_token,
                                         r.next_sibling, r.backend)
            slot.scratch = (out.conv_windows, out.states)
            return out.out
        return self._prefill_layer(module, original, slot, hidden, kwargs)

    def _prefill_layer(self, module, original, slot: GDNSlot, hidden: Tensor, kwargs) -> Tensor:
        """The model's own chunked path over each prompt (a ragged batch row by row: a recurrence must not
        run over padding), into a transformers linear-attention cache layer whose state becomes the slot's."""
        lens = self.prompt_lengths
        groups = [(slice(None), hidden.shape[1])] if lens is None else [(slice(b, b + 1), n) for b, n in enumerate(lens)]
        out = hidden.new_zeros(hidden.shape)  # padding rows stay 0: nothing reads them
        convs, ssms = [], []
        for rows, n in groups:
            tmp = Cache(layers=[LinearAttentionLayer() for _ in range(module.layer_idx + 1)])
            out[rows, :n] = original(hidden[rows, :n], cache_params=tmp, **kwargs)
            layer = tmp.layers[module.layer_idx]
            convs.append(layer.conv_states[0][..., 1:])  # transformers keeps K columns; a width-K conv reads K-1
            ssms.append(layer.recurrent_states[0].float())
        slot.conv, slot.ssm = torch.cat(convs), torch.cat(ssms)
        slot.scratch = None
        return out


def _gdn_forward(module, original):
    def forward(hidden_states, cache_params=None, attention_mask=None, **kwargs):
        route = getattr(cache_params, "gdn_forward", None)
        if route is None:  # any other cache (generate, the oracles): the module's own code
            return original(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
        return route(module, original, hidden_states, attention_mask, kwargs)

    return forward


def install(model) -> None:
    """Wrap every GatedDeltaNet module's forward once (idempotent); see ``_gdn_forward``."""
    for module in model.modules():
        if hasattr(module, "conv1d") and hasattr(module, "A_log") and not getattr(module, "_wb_tree_forward", False):
            module.forward = _gdn_forward(module, module.forward)
            module._wb_tree_forward = True


# ------------------------------------------------------------------------------------------- the state
def _linear_dims(c) -> dict:
    key_dim = c.linear_num_key_heads * c.linear_key_head_dim
    return dict(conv_dim=2 * key_dim + c.linear_num_value_heads * c.linear_value_head_dim,
                K=c.linear_conv_kernel_dim, HV=c.linear_num_value_heads, Dk=c.linear_key_head_dim,
                Dv=c.linear_value_head_dim)


class HybridGDN:
    """``TargetState`` of a hybrid target: ``KVBuffers`` + ``PrefixMask`` for the attention layers, a conv
    window and a recurrent state per request for each linear-attention layer.

    ``kernel_backend`` (set by the cycle from the session's setting before each verify): "torch" (level by
    level, kernels/gdn_tree_fast.py), "sglang" or "sglang-triton" (SGLang's Triton tree kernels) for the linear layers.
    """

    def __init__(self, models, capture=None, rows: int = 0):
        check_supported(models.target.config)
        self.models, self.capture = models, capture
        self.cache = HybridCache(models.target.config, [0] * rows)
        self.masks = PrefixMask(models.dtype, models.device)
        self.kernel_backend = "torch"
        self.state_from: Tensor | None = None  # [B, N] of the last verify: the node each node's state continued
        install(models.target)

    @property
    def lengths(self) -> list[int]:
        return self.cache.kv.lengths

    @property
    def rows(self) -> int:
        return self.cache.kv.rows

    # ---------------------------------------------------------------------------------------- forwards
    def prefill(self, prompts: list[list[int]]) -> StepOut:
        m = self.models
        dev = m.device
        B, P = len(prompts), max(len(p) for p in prompts)
        self.cache.kv.set_lengths([0] * B)
        self.masks.reset()
        ids = torch.zeros(B, P, dtype=torch.long, device=dev)
        for b, x in enumerate(prompts):
            ids[b, : len(x)] = torch.tensor(x, device=dev)
        mask = None
        ragged = any(len(x) != P for x in prompts)
        if ragged:  # attention: causal within each prompt (padding queries see their prompt: never an empty row)
            lens = torch.tensor([len(x) for x in prompts], device=dev)
            col = torch.arange(P, device=dev)
            visible = (col[None, None] <= col[None, :, None]) & (col[None, None] < lens[:, None, None])
            mask = additive(visible[:, None], m.dtype)  # [B, 1, P, P]
        self.cache.prompt_lengths = [len(x) for x in prompts] if ragged else None
        try:
            out = self._forward(ids, torch.arange(P, device=dev).expand(B, P), ForwardMode.EXTEND, mask)
        finally:
            self.cache.prompt_lengths = None
        self.cache.kv.set_lengths([len(x) for x in prompts])
        last = out.logits[torch.arange(B, device=dev), torch.tensor([len(x) - 1 for x in prompts], device=dev)]
        return StepOut(last[:, None], out.features, out.record)

    def _forward(self, ids: Tensor, positions: Tensor, mode: ForwardMode, mask: Tensor | None,
                 route: TreeRoute | None = None) -> StepOut:
        m = self.models
        self.cache.route = route
        try:
            out = run_target(m.target, ids, positions, self.cache, mode, m.target_layer_ids, mask, self.capture)
        finally:
            self.cache.route = None
        rec = dataclasses.replace(out.record, states=self._state_records(mode, route))
        if route is not None:
            rec.inputs["retrieve_parent_token"] = shape_of(route.parents)
        return StepOut(out.logits, out.features, rec)

    def _check(self, layout: TreeLayout) -> None:
        if layout.starts != self.lengths:
            raise ValueError(f"layout roots at {layout.starts} but the rows hold {self.lengths} tokens")

    def verify(self, layout: TreeLayout, mode: ForwardMode = ForwardMode.TARGET_VERIFY) -> StepOut:
        self._check(layout)
        mask = None
        if layout.N > 1 or not self.cache.kv.uniform():
            mask = self.masks.tree(layout.visibility, layout.starts)
        parents = layout.parents
        if layout.padded:  # inert padding nodes (parent -1) hang off the root: a valid tree, outputs unread
            idx = torch.arange(layout.N, device=parents.device)
            parents = torch.where(idx == 0, -1, parents.clamp(min=0))
        c = layout.compiled
        route = TreeRoute(self.kernel_backend, parents, c.retrieve_next_token, c.retrieve_next_sibling)
        self.state_from = parents
        return self._forward(layout.tokens, layout.positions, mode, mask, route)

    def decode(self, layout: TreeLayout) -> StepOut:
        if layout.N != 1:
            raise ValueError(f"decode takes one token per row, got a layout of {layout.N} nodes; use verify")
        return self.verify(layout, ForwardMode.DECODE)

    # ---------------------------------------------------------------------------------------- commit
    def commit(self, layout: TreeLayout, nodes: list[Tensor]) -> None:
        """Attention K/V: keep the accepted rows. Linear layers: the deepest accepted node's window and
        state become the request's (``nodes[b][-1]``; the root when nothing was accepted)."""
        last = torch.stack([x[-1] for x in nodes])  # [B], on the device: no host read
        for slot in self.cache.slots:
            conv, slot.ssm = commit_nodes(*slot.scratch, last)  # scratch: [B, N, conv_dim, K-1], [B, N, HV, Dk, Dv]
            slot.conv, slot.scratch = conv.to(slot.conv.dtype), None
        self.cache.kv.keep_rows(layout.starts, nodes)

    def can_crop(self, lengths: list[int]) -> bool:
        """Only to where the rows are now: a recurrent state keeps no checkpoint to roll back to."""
        return list(lengths) == self.lengths

    def crop(self, lengths: list[int]) -> None:
        if not self.can_crop(lengths):
            raise ValueError(f"crop({lengths}): a hybrid target's linear-attention state cannot be rolled back "
                             f"from {self.lengths} (no checkpoint is kept); start a new session instead")

    def select(self, rows: list[int]) -> None:
        idx = torch.tensor(rows, dtype=torch.long, device=self.models.device)
        for slot in self.cache.slots:
            if slot.conv is not None:
                slot.conv, slot.ssm = slot.conv.index_select(0, idx), slot.ssm.index_select(0, idx)
        self.cache.kv.select(rows)
        self.masks.select(rows)

    # ---------------------------------------------------------------------------------------- views
    def view(self, row: int) -> list[tuple[Tensor, Tensor]]:
        """Per model layer, row ``row``'s committed state: attention (keys, values) [1, kv_heads, len, head_dim];
        linear (conv window [1, conv_dim, K-1], recurrent state [1, HV, Dk, Dv])."""
        kv = iter(self.cache.kv.kv(row))
        out = []
        for layer in self.cache.layers:
            if isinstance(layer, GDNSlot):
                if layer.conv is None:
                    return []
                out.append((layer.conv[row : row + 1], layer.ssm[row : row + 1]))
            else:
                out.append(next(kv))
        return out

    def nbytes(self) -> int:
        total = self.cache.kv.nbytes()
        for slot in self.cache.slots:
            if slot.conv is not None:
                total += slot.conv.nbytes + slot.ssm.nbytes
        return total

    def describe(self, batch: int | None = None, length: int | None = None, nodes: int = 0) -> list[StateSpec]:
        """Attention K/V per token; per linear layer the committed conv window and state per request, and
        with ``nodes`` the per-node scratch a tree verify keeps (SGLang's intermediate buffers)."""
        c = text_config(self.models.target.config)
        batch = self.rows if batch is None else batch
        length = max(self.lengths, default=0) if length is None else length
        return describe(c, batch, length, nodes, self.models.dtype)

    def _state_records(self, mode: ForwardMode, route: TreeRoute | None) -> tuple:
        """The recurrent tensors this forward read and wrote, per linear layer, as the shapes tables show them."""
        slots = self.cache.slots
        if not slots or slots[0].conv is None:
            return ()
        s = slots[0]
        rows = [("conv_window", "in" if route is not None else "out", s.conv),
                ("ssm_state", "in" if route is not None else "out", s.ssm)]
        if route is not None and s.scratch is not None:
            rows += [("intermediate_conv_window", "out", s.scratch[0]), ("intermediate_ssm_state", "out", s.scratch[1])]
        return tuple({"name": name, "io": io, "layers": list(self.cache.linear_ids), **shape_of(t)}
                     for name, io, t in rows)


def describe(c, batch: int, length: int, nodes: int, dtype: torch.dtype) -> list[StateSpec]:
    """A hybrid text config's state at ``batch`` rows of ``length`` tokens with ``nodes`` tree nodes per row."""
    types = list(c.layer_types)
    n_lin = types.count("linear_attention")
    n_attn = len(types) - n_lin
    d = _linear_dims(c)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = (batch, c.num_key_value_heads, length + nodes, head_dim)
    out = [StateSpec(name, "per_token", n_attn, kv, dtype) for name in ("keys", "values")]
    out += [StateSpec("conv_window", "per_request", n_lin, (batch, d["conv_dim"], d["K"] - 1), dtype),
            StateSpec("ssm_state", "per_request", n_lin, (batch, d["HV"], d["Dk"], d["Dv"]), torch.float32)]
    if nodes:
        out += [StateSpec("intermediate_conv_window", "scratch_per_node", n_lin,
                          (batch, nodes, d["conv_dim"], d["K"] - 1), dtype),
                StateSpec("intermediate_ssm_state", "scratch_per_node", n_lin,
                          (batch, nodes, d["HV"], d["Dk"], d["Dv"]), torch.float32),
                StateSpec("retrieve_parent_token", "scratch_per_node", 1, (batch, nodes), torch.int64)]
    return out


register_target_state(is_hybrid, lambda models, capture: HybridGDN(models, capture))
