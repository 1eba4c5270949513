"""``DenseKV``: the ``TargetState`` of a dense-attention target (Qwen3, Llama, DeepSeek-V3's MLA latent, ...):
K/V per token in ``KVBuffers`` (kv_buffers.py), the tree-verify mask in ``PrefixMask`` (masks.py)."""
from __future__ import annotations

import torch
from torch import Tensor

from workbench.models.base import StepOut
from workbench.models.kv_buffers import KVBuffers, StaticInputs, kv_specs
from workbench.models.layout import TreeLayout
from workbench.models.masks import PrefixMask, additive
from workbench.models.registry import StateSpec, kv_layout
from workbench.models.run import run_target
from workbench.records.forward import ForwardMode


# ------------------------------------------------------------------------------------------- the target
class DenseKV:
    """``TargetState`` of a dense-attention target (Qwen3, Llama, DeepSeek-V3's MLA latent, ...): K/V per
    token in ``KVBuffers``, the tree-verify mask in ``PrefixMask``.

    Also the attention part of a composite state (``hybrid.HybridGDN``): ``cache`` is then the composite's
    attention buffers and ``run(ids, positions, mode, mask) -> StepOut`` its forward over every layer.
    """

    supports_static_shapes = True  # preallocate(): fixed shapes and storage, no host reads (graphs)

    def __init__(self, models, capture=None, rows: int = 0, cache: KVBuffers | None = None, run=None):
        self.models, self.capture = models, capture
        self.cache = KVBuffers(models.target.config, [0] * rows) if cache is None else cache
        self.masks = PrefixMask(models.dtype, models.device)
        self.static: StaticInputs | None = None  # set by preallocate: fixed shapes and storage
        self.graphs = None  # a workbench.engine.graphs.Graphs: the static verify captured and replayed
        self.kernel_backend = "torch"  # set by the cycle before each verify; dense attention runs no kernel of its own
        self.state_from: Tensor | None = None  # no recurrent state: nothing continues a node's state
        # None, or a callable given what each verify forward is handed (ids, positions [B, N], the additive mask
        # [B, 1, N, W] or None): a cycle dump reads the inputs where they are consumed (workbench.conform.engine_dump)
        self.observe_verify = None
        self._run = run

    def preallocate(self, rows: int, capacity: int) -> None:
        """Static shapes from now on: K/V and mask buffers of ``capacity`` columns per row allocated once,
        every verify's inputs copied into buffers kept per node count, attention over every column (the
        mask hides the unused), committed lengths also on the device (``static.lengths``)."""
        m = self.models
        self.cache.preallocate(rows, capacity, kv_layout(m.target.config), m.dtype, m.device)
        self.masks.width = capacity
        self.masks.reset()
        self.static = StaticInputs(rows, m.device)
        if len(self.cache.lengths) == rows:
            self.static.set_lengths(self.cache.lengths)

    @property
    def lengths(self) -> list[int]:
        return self.cache.lengths

    @property
    def rows(self) -> int:
        return self.cache.rows

    def _forward(self, ids: Tensor, positions: Tensor, mode: ForwardMode, mask: Tensor | None,
                 logits_to_keep: int = 0) -> StepOut:
        if self._run is not None:
            return self._run(ids, positions, mode, mask)
        m = self.models
        out = run_target(m.target, ids, positions, self.cache, mode, m.target_layer_ids, mask, self.capture,
                         logits_to_keep)
        return StepOut(out.logits, out.features, out.record)

    def prefill(self, prompts: list[list[int]]) -> StepOut:
        m = self.models
        dev = m.device
        B, P = len(prompts), max(len(p) for p in prompts)
        self.cache.set_lengths([0] * B)
        self.masks.reset()
        if self.static is not None:
            return self._prefill_static(prompts)
        mask = None  # one prompt (or equal lengths): the model's own causal mask
        if B == 1:
            ids = torch.tensor(prompts, device=dev)
        else:
            ids = torch.zeros(B, P, dtype=torch.long, device=dev)
            for b, x in enumerate(prompts):
                ids[b, : len(x)] = torch.tensor(x, device=dev)
            if any(len(x) != P for x in prompts):
                lens = torch.tensor([len(x) for x in prompts], device=dev)
                col = torch.arange(P, device=dev)
                # Causal within each prompt; padding queries see their prompt (never an empty row: NaN).
                visible = (col[None, None] <= col[None, :, None]) & (col[None, None] < lens[:, None, None])
                mask = additive(visible[:, None], m.dtype)  # [B, 1, P, P]
        pos = torch.arange(P, device=dev).expand(B, P)
        # Prompts of one length need logits at their last position only (SGLang's EXTEND keeps the same rows).
        out = self._forward(ids, pos, ForwardMode.EXTEND, mask, 1 if mask is None else 0)
        self.cache.set_lengths([len(x) for x in prompts])
        if mask is None:  # every prompt ends at the last column
            last = out.logits[:, -1:]
        else:
            last = out.logits[torch.arange(B, device=dev), torch.tensor([len(x) - 1 for x in prompts], device=dev)]
            last = last[:, None]
        return StepOut(last, out.features, out.record)

    def _prefill_static(self, prompts: list[list[int]]) -> StepOut:
        """The prompts into the preallocated buffers (the prefill's own shapes: it runs once)."""
        m, st = self.models, self.static
        dev = m.device
        B, P = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros(B, P, dtype=torch.long, device=dev)
        for b, x in enumerate(prompts):
            ids[b, : len(x)] = torch.tensor(x, device=dev)
        lens = torch.tensor([len(x) for x in prompts], device=dev)
        col, q = torch.arange(self.cache.capacity, device=dev), torch.arange(P, device=dev)
        # Causal within each prompt, nothing past it; padding queries see their prompt (never an empty row).
        visible = (col[None, None] <= q[None, :, None]) & (col[None, None] < lens[:, None, None])
        self.cache.write_rows = q.expand(B, P)
        out = self._forward(ids, q.expand(B, P), ForwardMode.EXTEND, additive(visible[:, None], m.dtype))
        self.cache.set_lengths([len(x) for x in prompts])
        st.set_lengths(self.cache.lengths)
        last = out.logits[torch.arange(B, device=dev), lens - 1][:, None]
        return StepOut(last, out.features, out.record)

    def _verify_static(self, layout: TreeLayout, mode: ForwardMode) -> StepOut:
        """Every verify of N nodes per row reads the same buffers: ids, positions, the rows it writes."""
        ids, pos, rows = self.static.inputs(layout.B, layout.N)
        ids.copy_(layout.tokens)
        pos.copy_(layout.positions)
        self.static.write_rows(rows)  # committed length + node index, on the device
        self.cache.write_rows = rows
        mask = self.masks.tree(layout.visibility, layout.starts)  # [B, 1, N, capacity]: one buffer
        if self.observe_verify is not None:
            self.observe_verify(ids, pos, mask)
        if self.graphs is not None:
            return self.graphs.run(f"target {mode}", (ids, pos, mask, rows, self.cache.store),
                                   lambda: self._forward(ids, pos, mode, mask))
        return self._forward(ids, pos, mode, mask)

    def _check(self, layout: TreeLayout) -> None:
        if layout.starts != self.cache.lengths:
            raise ValueError(f"layout roots at {layout.starts} but the rows hold {self.cache.lengths} tokens")

    def verify(self, layout: TreeLayout, mode: ForwardMode = ForwardMode.TARGET_VERIFY) -> StepOut:
        self._check(layout)
        if self.static is not None:
            return self._verify_static(layout, mode)
        mask = None  # one query per row over equal prefixes sees every column: no mask needed
        if layout.N > 1 or not self.cache.uniform():
            mask = self.masks.tree(layout.visibility, layout.starts)
        if self.observe_verify is not None:
            self.observe_verify(layout.tokens, layout.positions, mask)
        return self._forward(layout.tokens, layout.positions, mode, mask)

    def decode(self, layout: TreeLayout) -> StepOut:
        if layout.N != 1:
            raise ValueError(f"decode takes one token per row, got a layout of {layout.N} nodes; use verify")
        return self.verify(layout, ForwardMode.DECODE)

    def commit(self, layout: TreeLayout, nodes: list[Tensor]) -> None:
        self.cache.keep_rows(layout.starts, nodes)
        if self.static is not None:
            self.static.set_lengths(self.cache.lengths)

    def can_crop(self, lengths: list[int]) -> bool:
        return len(lengths) == self.rows and all(0 <= n <= L for n, L in zip(lengths, self.lengths))

    def crop(self, lengths: list[int]) -> None:
        if not self.can_crop(lengths):
            raise ValueError(f"crop({lengths}): give one length per row, each at most its {self.lengths}")
        self.cache.set_lengths(lengths)
        self.masks.reset()
        if self.static is not None:
            self.static.set_lengths(lengths)

    def select(self, rows: list[int]) -> None:
        self.cache.select(rows)
        self.masks.select(rows)
        if self.static is not None:
            self.static.select(rows)

    def admit(self, other: "DenseKV") -> None:
        """Append ``other``'s rows (requests prefilled apart) after these."""
        self.cache.admit(other.cache)
        self.masks.reset()

    def take(self, rows: list[int]) -> "DenseKV":
        """A new state holding copies of ``rows`` (this one is unchanged)."""
        return DenseKV(self.models, self.capture, cache=self.cache.take(rows))

    def view(self, row: int) -> list[tuple[Tensor, Tensor]]:
        return self.cache.kv(row)

    def nbytes(self) -> int:
        return self.cache.nbytes()

    def describe(self, batch: int | None = None, length: int | None = None, nodes: int = 0) -> list[StateSpec]:
        batch = self.rows if batch is None else batch
        length = max(self.lengths, default=0) if length is None else length
        return kv_specs(self.models.target.config, batch, length + nodes, self.models.dtype)
