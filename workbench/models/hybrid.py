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
from typing import Callable

import torch
from torch import Tensor
from transformers.cache_utils import Cache, LinearAttentionLayer

from ddtree_kernels.gdn_tree import commit_nodes
from workbench.records.forward import ForwardMode, shape_of
from workbench.models.run import run_target
from workbench.models.gdn_layer import gdn_layer_tree_forward
from workbench.models.layout import TreeLayout
from workbench.models.base import StepOut
from workbench.models.dense_target import DenseKV
from workbench.models.held_install import HeldInstall
from workbench.models.kv_buffers import KVBuffers, kv_specs
from workbench.models.registry import StateSpec, check_supported, layer_kinds, linear_attention

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

    def __init__(self, config, lengths: list[int], kv: KVBuffers | None = None):
        """``kv``: the attention layers' buffers to hold (default: new ones, ``lengths`` rows)."""
        types = list(layer_kinds(config))
        self.attn_ids = [i for i, t in enumerate(types) if t != "linear_attention"]
        self.linear_ids = [i for i, t in enumerate(types) if t == "linear_attention"]
        self.kv = KVBuffers(config, lengths, num_layers=len(self.attn_ids)) if kv is None else kv
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


def _route_gdn_forwards(model) -> Callable[[], None]:
    """Wrap every GatedDeltaNet module's forward (see ``_gdn_forward``). -> undo: restores each module's
    original forward (its class's, or an instance forward another library had set)."""
    wrapped = []
    for module in model.modules():
        if hasattr(module, "conv1d") and hasattr(module, "A_log"):
            wrapped.append((module, module.__dict__.get("forward")))
            module.forward = _gdn_forward(module, module.forward)

    def undo() -> None:
        for module, before in wrapped:
            if before is None:
                del module.forward  # the instance attribute: the class's forward shows again
            else:
                module.forward = before

    return undo


# Held by each HybridGDN; removed when the last state on the model ends (its session's end or collection).
GDN_FORWARDS = HeldInstall(_route_gdn_forwards)


def install(model, owner) -> Callable[[], None]:
    """Route ``model``'s GatedDeltaNet forwards for as long as ``owner`` lives. -> release (idempotent)."""
    return GDN_FORWARDS.hold(owner, model)


# ------------------------------------------------------------------------------------------- the state
class HybridGDN:
    """``TargetState`` of a hybrid target: its attention layers are a ``DenseKV`` (``attention``: K/V in
    ``KVBuffers``, the ragged-prefill and tree-verify masks, the layout checks) over the composite cache's
    attention buffers, and each linear-attention layer keeps a conv window and a recurrent state per
    request (``GDNSlot``), forked per tree node in a verify and committed from the deepest accepted node.

    ``kernel_backend`` (set by the cycle from the session's setting before each verify): "torch" (level by
    level, kernels/gdn_tree_fast.py), "sglang" or "sglang-triton" (SGLang's Triton tree kernels) for the linear layers.
    """

    # The attention part could preallocate; the linear layers' tree forward is not checked for fixed shapes
    # and host reads, so a hybrid runs with dynamic shapes only (static_shapes=True is refused in one line).
    supports_static_shapes = False

    def __init__(self, models, capture=None, rows: int = 0):
        check_supported(models.target.config)
        self.models, self.capture = models, capture
        self.cache = HybridCache(models.target.config, [0] * rows)
        self.attention = DenseKV(models, cache=self.cache.kv, run=self._run)
        self.kernel_backend = "torch"
        self.state_from: Tensor | None = None  # [B, N] of the last verify: the node each node's state continued
        self._route: TreeRoute | None = None  # the tree forward's route while a verify runs
        self.graphs = None  # dynamic shapes only (supports_static_shapes): never captured
        self._release_forwards = install(models.target, self)

    @property
    def lengths(self) -> list[int]:
        return self.attention.lengths

    @property
    def rows(self) -> int:
        return self.attention.rows

    # ---------------------------------------------------------------------------------------- forwards
    def prefill(self, prompts: list[list[int]]) -> StepOut:
        """The attention part's prefill (ragged prompts: its mask); the linear layers run each prompt alone."""
        ragged = any(len(x) != len(prompts[0]) for x in prompts)
        self.cache.prompt_lengths = [len(x) for x in prompts] if ragged else None
        try:
            return self.attention.prefill(prompts)
        finally:
            self.cache.prompt_lengths = None

    def _run(self, ids: Tensor, positions: Tensor, mode: ForwardMode, mask: Tensor | None) -> StepOut:
        """One forward of every layer over the composite cache (the attention part's forward)."""
        m, route = self.models, self._route
        self.cache.route = route
        try:
            out = run_target(m.target, ids, positions, self.cache, mode, m.target_layer_ids, mask, self.capture)
        finally:
            self.cache.route = None
        rec = dataclasses.replace(out.record, states=self._state_records(mode, route))
        if route is not None:
            rec.inputs["retrieve_parent_token"] = shape_of(route.parents)
        return StepOut(out.logits, out.features, rec)

    def verify(self, layout: TreeLayout, mode: ForwardMode = ForwardMode.TARGET_VERIFY) -> StepOut:
        """The attention part's verify, its linear layers routed over the layout's tree."""
        parents = layout.parents
        if layout.padded:  # inert padding nodes (parent -1) hang off the root: a valid tree, outputs unread
            idx = torch.arange(layout.N, device=parents.device)
            parents = torch.where(idx == 0, -1, parents.clamp(min=0))
        c = layout.compiled
        self._route = TreeRoute(self.kernel_backend, parents, c.retrieve_next_token, c.retrieve_next_sibling)
        try:
            out = self.attention.verify(layout, mode)
        finally:
            self._route = None
        self.state_from = parents
        return out

    decode = DenseKV.decode  # the one-node check, then this state's verify

    @property
    def observe_verify(self):
        """The attention part's (``DenseKV.observe_verify``): its verify is this state's forward."""
        return self.attention.observe_verify

    @observe_verify.setter
    def observe_verify(self, fn) -> None:
        self.attention.observe_verify = fn

    def preallocate(self, rows: int, capacity: int) -> None:
        raise ValueError(f"static_shapes=True: {type(self).__name__} runs with dynamic shapes only (its "
                         "linear-attention tree forward has no static-shape path)")

    # ---------------------------------------------------------------------------------------- commit
    def commit(self, layout: TreeLayout, nodes: list[Tensor]) -> None:
        """Attention K/V: keep the accepted rows. Linear layers: the deepest accepted node's window and
        state become the request's (``nodes[b][-1]``; the root when nothing was accepted)."""
        last = torch.stack([x[-1] for x in nodes])  # [B], on the device: no host read
        for slot in self.cache.slots:
            conv, slot.ssm = commit_nodes(*slot.scratch, last)  # scratch: [B, N, conv_dim, K-1], [B, N, HV, Dk, Dv]
            slot.conv, slot.scratch = conv.to(slot.conv.dtype), None
        self.attention.commit(layout, nodes)

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
        self.attention.select(rows)

    def admit(self, other: "HybridGDN") -> None:
        """Append ``other``'s rows: attention K/V through the dense part, each linear layer's window and state."""
        for mine, theirs in zip(self.cache.slots, other.cache.slots):
            if theirs.conv is None:
                continue
            if mine.conv is None and self.rows:
                raise ValueError("admit: these rows have no linear-attention state yet (prefill them first)")
            mine.conv = theirs.conv if mine.conv is None else torch.cat([mine.conv, theirs.conv])
            mine.ssm = theirs.ssm if mine.ssm is None else torch.cat([mine.ssm, theirs.ssm])
        self.attention.admit(other.attention)

    def take(self, rows: list[int]) -> "HybridGDN":
        """A new state holding copies of ``rows`` (this one is unchanged)."""
        out = HybridGDN(self.models, self.capture)
        kv = self.cache.kv.take(rows)
        out.cache = HybridCache(self.models.target.config, kv.lengths, kv=kv)
        out.attention = DenseKV(self.models, cache=kv, run=out._run)
        idx = torch.tensor(rows, dtype=torch.long, device=self.models.device)
        for mine, theirs in zip(out.cache.slots, self.cache.slots):
            if theirs.conv is not None:
                mine.conv, mine.ssm = theirs.conv.index_select(0, idx), theirs.ssm.index_select(0, idx)
        return out

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
        total = self.attention.nbytes()
        for slot in self.cache.slots:
            if slot.conv is not None:
                total += slot.conv.nbytes + slot.ssm.nbytes
        return total

    def describe(self, batch: int | None = None, length: int | None = None, nodes: int = 0) -> list[StateSpec]:
        """The attention part's K/V per token; per linear layer the committed conv window and state per
        request, and with ``nodes`` the per-node scratch a tree verify keeps (SGLang's intermediate buffers)."""
        batch = self.rows if batch is None else batch
        return self.attention.describe(batch, length, nodes) + linear_specs(
            self.models.target.config, batch, nodes, self.models.dtype)

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


def describe(config, batch: int, length: int, nodes: int, dtype: torch.dtype) -> list[StateSpec]:
    """A hybrid config's whole state without a model: its attention layers' K/V (``dense.kv_specs``) and its
    linear layers' state (``linear_specs``), as ``HybridGDN.describe`` gives it for a loaded one."""
    return kv_specs(config, batch, length, dtype) + linear_specs(config, batch, nodes, dtype)


def linear_specs(config, batch: int, nodes: int, dtype: torch.dtype) -> list[StateSpec]:
    """A hybrid config's linear-attention state at ``batch`` rows (conv windows in ``dtype``, recurrent states
    in float32) and, with ``nodes`` tree nodes per row, a verify's per-node scratch and parent links."""
    lin = linear_attention(config)
    n_lin = layer_kinds(config).count("linear_attention")
    conv, ssm = lin.conv_shape, (lin.value_heads, lin.key_dim, lin.value_dim)  # ours: [HV, Dk, Dv] (transformers')
    out = [StateSpec("conv_window", "per_request", n_lin, (batch, *conv), dtype),
           StateSpec("ssm_state", "per_request", n_lin, (batch, *ssm), torch.float32)]
    if nodes:
        out += [StateSpec("intermediate_conv_window", "scratch_per_node", n_lin, (batch, nodes, *conv), dtype),
                StateSpec("intermediate_ssm_state", "scratch_per_node", n_lin, (batch, nodes, *ssm), torch.float32),
                StateSpec("retrieve_parent_token", "scratch_per_node", 1, (batch, nodes), torch.int64)]
    return out
