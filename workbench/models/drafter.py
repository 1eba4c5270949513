"""``DraftKV``: the DFlash drafter's state (``base.DraftState``): its K/V in ``KVBuffers`` (full, causal or
sliding layers) and each row's pending target context."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from workbench.models.base import DraftInput
from workbench.models.held_install import HeldInstall
from workbench.models.kv_buffers import KVBuffers, StaticInputs, kv_specs
from workbench.models.masks import additive
from workbench.models.registry import StateSpec, kv_layout
from workbench.models.run import run_draft
from workbench.records.forward import ForwardRecord


# ------------------------------------------------------------------------------------------ the drafter
def _layer_kind(attn) -> tuple[bool, int | None]:
    """(causal, sliding window or None) of one DFlash attention module."""
    return bool(getattr(attn, "is_causal", False)), getattr(attn, "sliding_window", None)


def _swap_layer_mask(module, args, kwargs):
    """Forward pre-hook on a drafter attention module: in a forward whose layers need different masks,
    take this layer's from the cache the model hands every layer (no global state)."""
    masks = getattr(kwargs.get("past_key_values"), "layer_masks", None)
    if masks is not None and module.layer_idx in masks:
        kwargs["attention_mask"] = masks[module.layer_idx]
        return args, kwargs
    return None


def _mask_hooks(draft) -> Callable[[], None]:
    """The per-layer mask pre-hook on every attention module of ``draft``. -> undo (removes them)."""
    handles = [layer.self_attn.register_forward_pre_hook(_swap_layer_mask, with_kwargs=True) for layer in draft.layers]
    return lambda: [h.remove() for h in handles]


# Held by each DraftKV that batches layers of different kinds, removed when the last such state ends (the
# engine's own drafter forward steps aside while a hook is on, so it gets the drafter back afterwards).
MASK_HOOKS = HeldInstall(_mask_hooks)


class DraftKV:
    """The DFlash drafter's state: its K/V rows (``[0, start)`` per row after each draft) and each row's
    pending target context (features of committed positions not yet in its cache).

    One row runs exactly as dflash's own generation does: no mask, so each layer (full, causal or
    sliding) builds its own. More rows pad the context to the longest, and the mask is built per layer
    kind from each key's and query's real position: the same rule dflash applies, per row.
    """

    supports_static_shapes = True

    def __init__(self, models, capture=None, rows: int = 0):
        self.models, self.capture = models, capture
        self.cache = KVBuffers(models.draft.config, [0] * rows)
        self.context: list[Tensor] = []  # per row [1, m_b, F]
        self.kinds = [_layer_kind(layer.self_attn) for layer in models.draft.layers]
        self.static: StaticInputs | None = None
        self._static_bufs: dict = {}
        self.graphs = None  # a workbench.engine.graphs.Graphs: the static draft captured and replayed
        self._seen: list | None = None  # while an observed draft runs: per row, the pieces its forwards read
        self.kernel_backend = "torch"  # the drafter's forward runs no kernel of its own
        self._hooks: Callable[[], None] | None = None  # releases MASK_HOOKS (held from the first mixed-mask draft)
        # the last draft's masked slots' final hidden states [B, block - 1, H] (what a conditioned head reads)
        self.hidden: Tensor | None = None
        self._kept: dict = {}

    def preallocate(self, rows: int, capacity: int) -> None:
        """Static shapes from now on: every draft forward is [rows, block] queries over ``block`` context
        slots (a row's new context, padded; a longer one, as after the prefill, goes in block-sized
        chunks first) and ``capacity`` key columns, in buffers allocated once."""
        m = self.models
        self.cache.preallocate(rows, capacity, kv_layout(m.draft.config), m.dtype, m.device)
        self.static = StaticInputs(rows, m.device)
        self._static_bufs = {}

    @property
    def lengths(self) -> list[int]:
        return self.cache.lengths

    def start(self, features: list[Tensor]) -> None:
        """Rows begin empty with the prefill's features as pending context ([1, P_b, F] each)."""
        self.cache.set_lengths([0] * len(features))
        self.context = list(features)

    def add_context(self, features: list[Tensor | None]) -> None:
        """Append each row's newly committed features [1, k_b, F] to its pending context."""
        self.context = [c if f is None else torch.cat([c, f], dim=1) for c, f in zip(self.context, features)]

    def draft(self, roots: list[int], starts: list[int], observe=None) -> tuple[Tensor, ForwardRecord]:
        """One block forward for every row: [root, MASK x (block - 1)] at positions [start, start + block).
        -> (logits [B, block - 1, V], record). Afterwards row b's cache holds exactly [0, starts[b]).
        ``observe``: None, or a callable given each row's ``DraftInput`` after the forward (copies of the
        tensors it was handed: the ``cycle.hook_draft_input`` hook point)."""
        if observe is not None:  # each forward path notes what it hands over (None: one test per forward)
            self._seen = [{"features": [], "positions": [], "block": None} for _ in roots]
        try:
            logits, rec = self._draft(roots, starts)
            self.hidden = self._kept.pop("hidden", None)
            if observe is not None:
                observe(self._observed())
        finally:
            self._seen = None
        # The block's own K/V must not stay: next cycle's block sits at other positions.
        self.cache.set_lengths(starts)
        self.context = [c[:, :0] for c in self.context]
        return logits, rec

    def _draft(self, roots: list[int], starts: list[int]) -> tuple[Tensor, ForwardRecord]:
        """The forward(s) of ``draft``: static shapes, one row, or several rows padded."""
        m = self.models
        dev, Bk = m.device, m.block_size
        B = len(roots)
        if self.static is not None:
            return self._draft_static(roots, starts)
        if B == 1:
            block = torch.full((1, Bk), m.mask_token_id, dtype=torch.long, device=dev)
            block[0, 0] = roots[0]
            ctx = self.context[0]
            positions = torch.arange(starts[0] - ctx.shape[1], starts[0] + Bk, device=dev)[None]
            if self._seen is not None:
                self._note(block, positions, ctx, [ctx.shape[1]], ctx.shape[1])
            return run_draft(m.draft, m.target, block, positions, ctx, self.cache, self.capture, keep=self._kept)
        return self._draft_rows(roots, starts)

    def _note(self, block: Tensor, positions: Tensor, ctx: Tensor, real: list[int], slots: int) -> None:
        """What one forward is handed, per row: its ``real[b]`` context rows (of ``slots``; the rest padding),
        their positions, its block and the block's positions. block [B, Bk]; positions [B, slots + Bk];
        ctx [B, slots, F]. Copies: the static path reuses its buffers."""
        for b, seen in enumerate(self._seen):
            seen["features"].append(ctx[b, : real[b]].clone())
            seen["positions"].append(positions[b, : real[b]].clone())
            seen["block"] = (block[b].clone(), positions[b, slots:].clone())

    def _observed(self) -> list:
        """Each row's ``DraftInput``, its context joined over the forwards that took it in."""
        return [DraftInput(torch.cat(s["features"]), torch.cat(s["positions"]).long(), s["block"][0].long(),
                           s["block"][1].long()) for s in self._seen]

    def _draft_rows(self, roots: list[int], starts: list[int]) -> tuple[Tensor, ForwardRecord]:
        m = self.models
        dev, Bk = m.device, m.block_size
        B = len(roots)
        ctx_lens = [c.shape[1] for c in self.context]
        M = max(ctx_lens)
        ctx = self.context[0].new_zeros(B, M, self.context[0].shape[-1])
        pos = torch.zeros(B, M + Bk, dtype=torch.long, device=dev)
        for b, (c, s) in enumerate(zip(self.context, starts)):
            ctx[b, : c.shape[1]] = c[0]
            pos[b, : c.shape[1]] = torch.arange(s - c.shape[1], s, device=dev)
            pos[b, M:] = torch.arange(s, s + Bk, device=dev)
        block = torch.full((B, Bk), m.mask_token_id, dtype=torch.long, device=dev)
        block[:, 0] = torch.tensor(roots, device=dev)
        # Keys of row b: its cache rows [0, L_b) (positions 0..L_b-1), its M context rows (m_b real, at
        # positions L_b..start_b-1), its block rows (positions start_b..): every real key's column is
        # L_b + j for context row j, so position = column there; padding is hidden.
        L = torch.tensor(self.cache.lengths, device=dev)[:, None]
        col = torch.arange(max(self.cache.lengths) + M + Bk, device=dev)[None]  # [1, W]
        mlen = torch.tensor(ctx_lens, device=dev)[:, None]
        st = torch.tensor(starts, device=dev)[:, None]
        masks = {k: additive(v, m.dtype) for k, v in self._visible(L, mlen, st, col, M).items()}
        first = masks[self.kinds[0]]
        if len(masks) > 1:  # layers differ: each takes its own from the cache (see _swap_layer_mask)
            self._install_hooks()
            self.cache.layer_masks = {i: masks[k] for i, k in enumerate(self.kinds)}
        if self._seen is not None:
            self._note(block, pos, ctx, ctx_lens, M)
        try:
            return run_draft(m.draft, m.target, block, pos, ctx, self.cache, self.capture, first, self._kept)
        finally:
            self.cache.layer_masks = None

    def _visible(self, L: Tensor, mlen: Tensor, st: Tensor, col: Tensor, M: int) -> dict:
        """Per layer kind: bool [B, 1, block, W] of which keys each block query sees. L, mlen, st: [B, 1]
        cache rows, real context rows and block start per row; col [1, W]; M context slots per row."""
        Bk = self.models.block_size
        B = L.shape[0]
        in_block = (col >= L + M) & (col < L + M + Bk)
        valid = (col < L + mlen) | in_block  # [B, W]
        kpos = torch.where(in_block, st + col - L - M, col)[:, None, :]  # [B, 1, W]
        qpos = (st + torch.arange(Bk, device=col.device)[None])[:, :, None]  # [B, Bk, 1]
        out = {}
        for kind in set(self.kinds):
            causal, window = kind
            vis = valid[:, None, :].expand(B, Bk, valid.shape[1])
            if causal:
                vis = vis & (kpos <= qpos)
            if window is not None:
                vis = vis & (qpos - kpos < window)
                if not causal:
                    vis = vis & (kpos - qpos < window)
            out[kind] = vis[:, None]
        return out

    def _draft_static(self, roots: list[int], starts: list[int]) -> tuple[Tensor, ForwardRecord]:
        """The draft with static shapes: context longer than a block goes in block-sized chunks first
        (a context row's keys depend on its features and position only, so chunks give the same cache)."""
        Bk = self.models.block_size
        ctx = list(self.context)
        lengths = list(self.cache.lengths)
        while any(c.shape[1] > Bk for c in ctx):
            take = [Bk if c.shape[1] > Bk else 0 for c in ctx]
            chunk = [c[:, :t] for c, t in zip(ctx, take)]
            ends = [L + t for L, t in zip(lengths, take)]
            self._static_forward(roots, ends, chunk, lengths)  # the block's outputs unused
            lengths = ends
            self.cache.set_lengths(lengths)
            ctx = [c[:, t:] for c, t in zip(ctx, take)]
        return self._static_forward(roots, starts, ctx, lengths)

    def _static_forward(self, roots, starts, ctx, lengths) -> tuple[Tensor, ForwardRecord]:
        """One draft forward over the preallocated buffers: block [B, Bk], positions [B, C + Bk], context
        [B, C, F] (C = Bk slots, row b's first m_b real), masks [B, 1, Bk, capacity] per layer kind."""
        m, st = self.models, self.static
        dev, Bk, C = m.device, m.block_size, m.block_size
        B, F, W = len(roots), ctx[0].shape[-1], self.cache.capacity
        bufs = self._static_bufs
        if bufs.get("shape") != (B, W):
            bufs.clear()
            bufs["shape"] = (B, W)
            bufs["block"] = torch.full((B, Bk), m.mask_token_id, dtype=torch.long, device=dev)
            bufs["ctx"] = torch.zeros(B, C, F, dtype=ctx[0].dtype, device=dev)
            bufs["vec"] = torch.zeros(3, B, dtype=torch.long, device=dev)  # cache rows, context rows, start
            bufs["col"] = torch.arange(W, device=dev)[None]
            bufs["masks"] = {k: torch.zeros(B, 1, Bk, W, dtype=m.dtype, device=dev) for k in set(self.kinds)}
        _, pos, rows = st.inputs(B, C + Bk)
        vec = bufs["vec"]
        for b, (r, c, L, s) in enumerate(zip(roots, ctx, lengths, starts)):
            bufs["block"][b, 0].fill_(r)  # host values as kernel arguments: nothing waits
            bufs["ctx"][b, : c.shape[1]].copy_(c[0])  # stale padding rows are hidden by the mask
            vec[0, b].fill_(L)
            vec[1, b].fill_(c.shape[1])
            vec[2, b].fill_(s)
        L, mlen, s0 = vec[0][:, None], vec[1][:, None], vec[2][:, None]
        ar = torch.arange(C + Bk, device=dev)[None]
        # Context slot j at position L + j (real up to m_b, then hidden), block slot j at start + j.
        torch.where(ar < C, L + ar, s0 + ar - C, out=pos)
        st.write_rows(rows, vec[0])
        self.cache.write_rows = rows
        zero, hidden = torch.zeros((), dtype=m.dtype, device=dev), torch.full((), float("-inf"), dtype=m.dtype, device=dev)
        for kind, vis in self._visible(L, mlen, s0, bufs["col"], C).items():
            torch.where(vis, zero, hidden, out=bufs["masks"][kind])
        masks = bufs["masks"]
        if self._seen is not None:  # a chunk's block is overwritten by the next forward's: the last one stays
            self._note(bufs["block"], pos, bufs["ctx"], [c.shape[1] for c in ctx], C)
        if len(masks) > 1:
            self._install_hooks()
            self.cache.layer_masks = {i: masks[k] for i, k in enumerate(self.kinds)}
        def forward():  # the hidden states are outputs too: a replayed graph's are its own
            kept: dict = {}
            return (*run_draft(m.draft, m.target, bufs["block"], pos, bufs["ctx"], self.cache, self.capture,
                               masks[self.kinds[0]], kept), kept["hidden"])

        try:
            if self.graphs is not None:
                logits, rec, self._kept["hidden"] = self.graphs.run(
                    "draft", (bufs["block"], pos, bufs["ctx"], rows, self.cache.store, *masks.values()), forward)
            else:
                logits, rec, self._kept["hidden"] = forward()
            return logits, rec
        finally:
            self.cache.layer_masks = None

    def _install_hooks(self) -> None:
        if self._hooks is None:
            self._hooks = MASK_HOOKS.hold(self, self.models.draft)

    def release(self) -> None:
        """Let go of the hooks this state put on the drafter (also done when it is collected)."""
        if self._hooks is not None:
            self._hooks()
            self._hooks = None

    def select(self, rows: list[int]) -> None:
        self.cache.select(rows)
        self.context = [self.context[r] for r in rows]
        if self.static is not None:
            self.static.select(rows)

    @property
    def rows(self) -> int:
        return self.cache.rows

    def admit(self, other: "DraftKV") -> None:
        """Append ``other``'s rows (their K/V and pending context) after these."""
        self.cache.admit(other.cache)
        self.context = self.context + other.context

    def take(self, rows: list[int]) -> "DraftKV":
        """A new state holding copies of ``rows`` (pending context included)."""
        out = DraftKV(self.models, self.capture)
        out.cache = self.cache.take(rows)
        out.context = [self.context[r] for r in rows]
        return out

    def crop(self, lengths: list[int]) -> None:
        """Free for K/V; the pending context of the dropped positions is dropped with them."""
        self.cache.set_lengths([min(n, L) for n, L in zip(lengths, self.cache.lengths)])

    def view(self, row: int) -> list[tuple[Tensor, Tensor]]:
        return self.cache.kv(row)

    def nbytes(self) -> int:
        return self.cache.nbytes()

    def describe(self, batch: int | None = None, length: int | None = None, nodes: int = 0) -> list[StateSpec]:
        batch = self.cache.rows if batch is None else batch
        length = max(self.lengths, default=0) if length is None else length
        return kv_specs(self.models.draft.config, batch, length + nodes, self.models.dtype, prefix="draft ")
