"""Dense attention state: per-token keys/values in preallocated buffers, for the target and the drafter.

``KVBuffers`` is the one cache (a Hugging Face ``Cache``) for B >= 1 rows: every row keeps its own
left-aligned rows in shared ``[B, kv_heads, capacity, head_dim]`` buffers with its own length. A forward
of n tokens per row writes rows ``[lengths[b], lengths[b] + n)`` and attention sees ``max(lengths) + n``
columns; the state's mask hides each row's columns it does not own. When every row writes at the same
offset (always at B = 1) the write is a slice, otherwise one scatter. Hugging Face's ``DynamicLayer``
would instead concatenate onto the whole cache at every forward.

``PrefixMask`` builds the tree-verify mask (committed prefix + own ancestors) incrementally across cycles.
``DenseKV`` is the target's ``TargetState``; ``DraftKV`` the DFlash drafter's (full, causal or sliding
layers; pending target context per row).
"""
from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer

from ddtree_kernels import compact_kv_
from workbench.records.forward import ForwardMode, ForwardRecord
from workbench.models.run import run_draft, run_target
from workbench.models.layout import TreeLayout
from workbench.models.base import StepOut
from workbench.models.registry import KVLayout, StateSpec, attention_layers, kv_layout


def additive(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """bool -> additive (0 visible, -inf hidden), the form SDPA adds to the scores as it is."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


# -------------------------------------------------------------------------------------------- the cache
class KVLayer(DynamicLayer):
    """One layer's keys/values: views ``[B, kv_heads, capacity, head_dim]`` of its owner's one store.

    Zero-initialised (not ``new_empty``): a hidden column still enters SDPA's weighted sum as 0 * value,
    and garbage NaN there would poison the output.
    """

    MIN_CAPACITY = 256

    def __init__(self, owner: "KVBuffers"):
        super().__init__()
        self.owner = owner
        self._k: Tensor | None = None  # set by the owner (views of its store)
        self._v: Tensor | None = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.owner.attach(self, key_states, value_states)
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        offset, rows, width = self.owner.write_plan(n)
        if rows is None:  # every row writes at the same offset: a slice
            self._k[:, :, offset : offset + n].copy_(key_states)
            self._v[:, :, offset : offset + n].copy_(value_states)
        else:
            b = self.owner.row_index(rows.shape[0], rows.device)
            # Advanced indices around a slice put their dims first: the target is [B, n, heads, head_dim].
            self._k[b, :, rows] = key_states.transpose(1, 2)
            self._v[b, :, rows] = value_states.transpose(1, 2)
        if self.owner.static is not None:  # attention sees every column; the mask hides what is not in use
            return self._k, self._v
        return self._k[:, :, :width], self._v[:, :, :width]

    def get_seq_length(self) -> int:
        return self.owner.width()

    def rows_of(self, b: int) -> tuple[Tensor, Tensor]:
        n = self.owner.lengths[b]
        return self._k[b : b + 1, :, :n], self._v[b : b + 1, :, :n]


class KVBuffers(Cache):
    """Every row's keys/values, left-aligned in one store shared by all layers, ``lengths[b]`` rows in use
    for row b.

    The store is one tensor ``[layers, 2, B, kv_heads, capacity, head_dim]`` (each layer's keys and values
    are views of it), so growing, keeping a tree's accepted rows or dropping rows is one operation for the
    whole model instead of one per layer and buffer.

    After a forward the caller sets the new lengths (``set_lengths``), keeps the accepted rows of a
    verified tree (``keep_rows``) or drops rows (``select``).

    Static mode (``preallocate``): the store is allocated once at a fixed capacity, every forward writes
    its rows at ``write_rows`` (a device tensor [B, n] the state fills) and attention sees the whole
    capacity, so a forward's shapes and storage do not change from one cycle to the next.
    """

    def __init__(self, config, lengths: list[int], num_layers: int | None = None):
        """``num_layers``: how many attention layers (default: every layer of ``config``; a hybrid's
        composite cache holds only its attention layers here)."""
        n = config.get_text_config(decoder=True).num_hidden_layers if num_layers is None else num_layers  # (config unused then)
        super().__init__(layers=[KVLayer(self) for _ in range(n)])
        self.lengths = list(lengths)
        self._plan = None
        self._written: int | None = None
        self.layer_masks: dict | None = None  # layer index -> mask, for a forward whose layers differ
        self.store: Tensor | None = None  # [layers, 2, B, kv_heads, capacity, max(key dim, value dim)]
        self.dims: tuple[int, int] | None = None  # (key dim, value dim): MLA's differ (e.g. 192 and 128)
        self.static: int | None = None  # the fixed capacity in static mode
        self.write_rows: Tensor | None = None  # static mode: int64 [B, n] rows the next forward writes
        self._rows_idx: Tensor | None = None

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return 0 if self.store is None else self.store.shape[4]

    def attach(self, layer: KVLayer, key_states: Tensor, value_states: Tensor) -> None:
        """A layer's first write: the store is allocated for every layer at the first one. Keys and values
        share it at the wider of their widths; each layer's views take their own width."""
        B, H, _, Dk = key_states.shape
        dims = (Dk, value_states.shape[-1])
        if self.store is None:
            self.dims = dims
            self._point(key_states.new_zeros(len(self.layers), 2, B, H, 0, max(dims)))
        elif (self.store.shape[3], self.dims, self.store.dtype) != (H, dims, key_states.dtype):
            raise ValueError(f"layer {self.layers.index(layer)} has keys {tuple(key_states.shape)} "
                             f"({key_states.dtype}) but the others [B, {self.store.shape[3]}, n, "
                             f"{self.dims}] ({self.store.dtype}): one KVBuffers holds layers of one shape")

    def _point(self, store: Tensor) -> None:
        self.store = store
        dk, dv = self.dims or (store.shape[5], store.shape[5])
        for i, layer in enumerate(self.layers):
            layer._k, layer._v = store[i, 0, ..., :dk], store[i, 1, ..., :dv]

    def reserve(self, rows: int) -> None:
        """Capacity for ``rows`` rows per request (doubling keeps growth rare); the used rows move along."""
        cap = self.capacity
        if self.store is None or rows <= cap:
            return
        if self.static is not None:
            raise ValueError(f"a forward needs {rows} rows but this static cache holds {cap}; "
                             "preallocate a larger capacity")
        new = self.store.new_zeros(*self.store.shape[:4], max(KVLayer.MIN_CAPACITY, cap * 2, rows),
                                   self.store.shape[5])
        used = max(self.lengths, default=0)
        if used:
            new[:, :, :, :, :used].copy_(self.store[:, :, :, :, :used])
        self._point(new)

    def preallocate(self, rows: int, capacity: int, layout: KVLayout, dtype, device) -> None:
        """Static mode: one store of ``capacity`` rows per request, allocated now; it grows only by another
        ``preallocate`` (a new length bucket), which keeps the rows in use. ``layout``: what each layer caches
        per token (``registry.kv_layout``); keys and values take their own widths (MLA's latent: 2 of them)."""
        old = self.store
        self.dims = (layout.key_dim, layout.value_dim)
        self._point(torch.zeros(len(self.layers), 2, rows, layout.heads, capacity, max(self.dims), dtype=dtype,
                                device=device))
        used = min(max(self.lengths, default=0), capacity)
        if old is not None and used and old.shape[2] == rows:
            self.store[:, :, :, :, :used].copy_(old[:, :, :, :, :used])
        for layer in self.layers:
            layer.dtype, layer.device, layer.is_initialized = dtype, torch.device(device), True
        self.static = capacity
        self._rows_idx = None

    def row_index(self, rows: int, device) -> Tensor:
        """int64 [rows, 1]: the batch index a scatter pairs with its destination rows (kept, not rebuilt)."""
        if self._rows_idx is None or self._rows_idx.shape[0] != rows:
            self._rows_idx = torch.arange(rows, device=device)[:, None]
        return self._rows_idx

    def write_plan(self, n: int) -> tuple[int, Tensor | None, int]:
        """(offset, destination rows [B, n] or None when every row writes at ``offset``, visible width)."""
        if self.static is not None:
            if self.write_rows is None or self.write_rows.shape[1] != n:
                raise ValueError(f"static cache: a forward of {n} tokens per row needs write_rows [B, {n}] set first")
            return 0, self.write_rows, self.static
        key = (n, tuple(self.lengths))
        if self._plan is None or self._plan[0] != key:  # computed once per forward, shared by the layers
            first = self.lengths[0]
            rows = None
            if any(x != first for x in self.lengths):
                rows = torch.tensor(self.lengths)[:, None] + torch.arange(n)[None]
                rows = rows.to(self.store.device)
            self._plan = (key, (first, rows, max(self.lengths) + n))
            self.reserve(self._plan[1][2])
        self._written = self._plan[1][2]
        return self._plan[1]

    def width(self) -> int:
        """Columns attention sees: max(lengths), or the last forward's width until the lengths are set
        (static mode: the capacity)."""
        if self.static is not None:
            return self.static
        return self._written if self._written is not None else max(self.lengths, default=0)

    def uniform(self) -> bool:
        return all(x == self.lengths[0] for x in self.lengths)

    def set_lengths(self, lengths: list[int]) -> None:
        self.lengths, self._written = list(lengths), None

    def kv(self, b: int) -> list[tuple[Tensor, Tensor]]:
        """Row b as (keys, values) per layer, [1, kv_heads, lengths[b], head_dim] each (views)."""
        if not self.layers[0].is_initialized:
            return []
        return [layer.rows_of(b) for layer in self.layers]

    def keep_rows(self, starts: list[int], nodes: list[Tensor]) -> None:
        """Row b verified a tree at rows [starts[b], ...); keep its ``nodes[b]`` rows (root first), in order,
        at rows [starts[b], starts[b] + len(nodes[b])), for every layer at once. One row: ``compact_kv_``
        moves only what must move; more: one gather and one scatter for the whole batch."""
        store = self.store
        if store is not None and len(starts) == 1:
            compact_kv_(store.flatten(0, 2), starts[0], nodes[0])  # [layers * 2 * 1, heads, capacity, dim]
        elif store is not None:
            A = max(int(x.shape[0]) for x in nodes)
            dev = nodes[0].device
            j = torch.arange(A, device=dev)
            # Short rows repeat their last node: those copies land past the new length, where nothing reads.
            src = torch.stack([s + x[j.clamp(max=x.shape[0] - 1)] for s, x in zip(starts, nodes)])  # [B, A]
            dst = torch.tensor(starts, device=dev)[:, None] + j[None]  # [B, A]
            b_idx = self.row_index(len(starts), dev)
            store[:, :, b_idx, :, dst] = store[:, :, b_idx, :, src]  # the gather copies first: overlaps are safe
        self.set_lengths([s + int(x.shape[0]) for s, x in zip(starts, nodes)])

    def select(self, keep: list[int]) -> None:
        """Keep only the rows ``keep``, in order: retired requests leave the buffers."""
        if self.store is not None:
            idx = torch.tensor(keep, dtype=torch.long, device=self.store.device)
            self._point(self.store.index_select(2, idx))
            self._rows_idx = None
        self.set_lengths([self.lengths[b] for b in keep])

    def admit(self, other: "KVBuffers") -> None:
        """Append ``other``'s rows after these (requests joining running rows): one store of the wider
        capacity, each row's used columns where they were. Dynamic mode only (a static store's rows are fixed)."""
        if self.static is not None or other.static is not None:
            raise ValueError("admit: a static-shape cache holds a fixed number of rows; requests can join "
                             "running rows with dynamic shapes only (drop static_shapes)")
        if other.store is not None or self.store is not None:
            a, b = self.store, other.store
            ref = a if a is not None else b
            if a is not None and b is not None and (a.shape[3], a.shape[5], a.dtype, self.dims) != (
                    b.shape[3], b.shape[5], b.dtype, other.dims):
                raise ValueError(f"admit: rows of store {tuple(b.shape)} ({b.dtype}) cannot join a store "
                                 f"{tuple(a.shape)} ({a.dtype}): one cache holds one model's rows")
            cap = max(x.shape[4] for x in (a, b) if x is not None)

            def fit(x, rows):  # [layers, 2, rows, heads, cap, dim]: missing rows are zeros (nothing used)
                shape = (*ref.shape[:2], rows, ref.shape[3], cap, ref.shape[5])
                if x is None:
                    return ref.new_zeros(shape)
                if x.shape[4] == cap:
                    return x
                out = x.new_zeros(shape)
                out[:, :, :, :, : x.shape[4]].copy_(x)
                return out

            self.dims = self.dims or other.dims
            self._point(torch.cat([fit(a, self.rows), fit(b, other.rows)], dim=2))
            self._rows_idx = None
            if a is None:  # the layers learn dtype and device at their first write: these rows never wrote
                for mine, theirs in zip(self.layers, other.layers):
                    mine.dtype, mine.device, mine.is_initialized = theirs.dtype, theirs.device, theirs.is_initialized
        self.set_lengths(self.lengths + other.lengths)

    def take(self, rows: list[int]) -> "KVBuffers":
        """A new cache holding copies of ``rows`` (in that order); this one is unchanged."""
        out = KVBuffers(None, [self.lengths[b] for b in rows], num_layers=len(self.layers))
        if self.store is not None:
            out.dims = self.dims
            out._point(self.store.index_select(2, torch.tensor(rows, dtype=torch.long, device=self.store.device)))
            for mine, theirs in zip(out.layers, self.layers):
                mine.dtype, mine.device, mine.is_initialized = theirs.dtype, theirs.device, theirs.is_initialized
        return out

    def nbytes(self) -> int:
        """Bytes of the committed rows (all rows, all layers)."""
        total = 0
        for layer in self.layers:
            if layer.is_initialized:  # keys and values per token (MLA: two widths)
                per_row = (layer._k[0, :, :1].numel() + layer._v[0, :, :1].numel()) * layer._k.element_size()
                total += per_row * sum(self.lengths)
        return total


# -------------------------------------------------------------------------------------------- the mask
class PrefixMask:
    """The verify mask [B, 1, N, max(starts) + N], kept in one buffer across cycles: row b's nodes see its
    committed prefix (columns < starts[b]) and, in its tree block [starts[b], starts[b] + N), their own
    ancestors; nothing else (other rows' longer prefixes, stale rows).

    Every row's buffer is "prefix visible, the rest hidden" except its current tree block. From one cycle
    to the next the prefix grows into the old block and a new block is written, so a cycle writes
    O(N x (N + accepted)) entries per row instead of building [N, start + N] afresh.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self.buf = torch.zeros(0, 1, 0, 0, dtype=dtype, device=device)  # [rows, 1, queries, cols]
        self._written: list[tuple[int, int]] | None = None  # per row: (start, queries) of its tree block
        self.width: int | None = None  # static mode: the fixed column count (the cache's capacity)
        self._zero = self._hidden = None

    def _fresh(self, rows: int, queries: int, cols: int, starts: list[int]) -> None:
        col = torch.arange(cols, device=self.device)[None, None, None]
        st = torch.tensor(starts, device=self.device)[:, None, None, None]
        self.buf = additive((col < st).expand(rows, 1, queries, cols), self.dtype).contiguous()
        self._written = [(s, 0) for s in starts]

    def tree(self, visibility: Tensor, starts: list[int]) -> Tensor:
        """visibility bool [B, N, N] ancestor-or-self, rooted at ``starts`` -> additive [B, 1, N, max + N] (a view)."""
        B, N, _ = visibility.shape
        W = max(starts) + N
        rows, r, c = self.buf.shape[0], self.buf.shape[2], self.buf.shape[3]
        old = self._written
        if self.width is not None and W > self.width:
            raise ValueError(f"a tree of {N} nodes rooted at {max(starts)} needs {W} mask columns but this static "
                             f"mask has {self.width}; preallocate a larger capacity")
        if (old is None or rows != B or N > r or W > c or (self.width is not None and (N != r or c != self.width))
                or any(s < s0 for s, (s0, _) in zip(starts, old))):  # grown, reshaped or rolled back: rebuild
            if self.width is not None:
                self._fresh(B, N, self.width, starts)
            else:
                # Columns grow by doubling when a tree outgrows them, and never otherwise: a rebuild for new
                # rows (requests joining or sitting out) keeps the width it had.
                self._fresh(B, max(N, r if rows == B else 0), max(W if W <= c else max(W, 2 * c), c, 256), starts)
            old = self._written
        inf = float("-inf")
        zero, hidden = self._scalars()
        for b, (s, (s0, q0)) in enumerate(zip(starts, old)):
            row = self.buf[b]
            if s > s0:
                row[:, :, s0:s] = 0  # committed since: prefix now, for every query
            if s0 + q0 > s and (q0 > N or s0 + q0 > s + N):  # (else the new block below covers it all)
                row[:, :q0, s : s0 + q0] = inf  # what is left of the old block is hidden again
            torch.where(visibility[b, None], zero, hidden, out=row[:, :N, s : s + N])  # one write for the block
        self._written = [(s, N) for s in starts]
        if self.width is not None:  # static: every column, always the same view of the same buffer
            return self.buf[:, :, :N]
        return self.buf[:, :, :N, :W]

    def _scalars(self) -> tuple[Tensor, Tensor]:
        """0 and -inf as 0-d tensors of the mask's dtype, made once (``where`` then writes the block in place)."""
        if self._zero is None:
            self._zero = torch.zeros((), dtype=self.dtype, device=self.device)
            self._hidden = torch.full((), float("-inf"), dtype=self.dtype, device=self.device)
        return self._zero, self._hidden

    def mask(self, visibility: Tensor, start: int) -> Tensor:
        """One row: visibility [1, n, n] -> additive [1, 1, n, start + n]."""
        return self.tree(visibility, [start])

    def select(self, keep: list[int]) -> None:
        if self._written is not None and self.buf.shape[0] == len(self._written):
            self.buf = self.buf[keep]
            self._written = [self._written[b] for b in keep]

    def reset(self) -> None:
        self._written = None


# ------------------------------------------------------------------------------------- static shapes
class StaticInputs:
    """A static-shape state's forward inputs, one set of buffers per (rows, tokens per row), reused every
    cycle, and each row's committed length as a device tensor (``lengths``, int64 [B]).

    Lengths reach the device by one small fill per row: a host value passed as a kernel argument, never a
    copy that would wait (a host-to-device copy from pageable memory synchronises on CUDA).
    """

    def __init__(self, rows: int, device):
        self.device = device
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self._bufs: dict[tuple[int, int], tuple[Tensor, Tensor, Tensor, Tensor]] = {}

    def inputs(self, rows: int, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """(ids, positions, write rows), each int64 [rows, n]: the same tensors for every forward of n."""
        if (rows, n) not in self._bufs:
            z = lambda: torch.zeros(rows, n, dtype=torch.long, device=self.device)  # noqa: E731
            self._bufs[rows, n] = (z(), z(), z(), torch.arange(n, device=self.device))
        return self._bufs[rows, n][:3]

    def write_rows(self, rows: Tensor, offset: Tensor | None = None) -> Tensor:
        """rows[b, i] = (offset or lengths)[b] + i, in place."""
        ar = self._bufs[tuple(rows.shape)][3]
        return torch.add((self.lengths if offset is None else offset)[:, None], ar, out=rows)

    def set_lengths(self, lengths: list[int]) -> None:
        if self.lengths.shape[0] != len(lengths):
            self.lengths = torch.zeros(len(lengths), dtype=torch.long, device=self.device)
        for b, n in enumerate(lengths):
            self.lengths[b].fill_(n)

    def select(self, rows: list[int]) -> None:
        self.lengths = self.lengths[rows]
        self._bufs.clear()  # fewer rows: new shapes (a batch that retires a request is a new bucket)


# ------------------------------------------------------------------------------------------- the target
def kv_specs(config, batch: int, length: int, dtype, prefix: str = "") -> list[StateSpec]:
    """The K/V buffers of ``batch`` rows of ``length`` tokens in every attention layer of ``config``, as
    ``KVBuffers`` holds them (keys and values [batch, heads, length, width]; MLA: c_kv and k_pe)."""
    lay = kv_layout(config)
    layers = attention_layers(config)
    return [StateSpec(prefix + name, "per_token", layers, (batch, lay.heads, length, dim), dtype)
            for name, dim in zip(lay.names, (lay.key_dim, lay.value_dim))]


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

    def _forward(self, ids: Tensor, positions: Tensor, mode: ForwardMode, mask: Tensor | None) -> StepOut:
        if self._run is not None:
            return self._run(ids, positions, mode, mask)
        m = self.models
        out = run_target(m.target, ids, positions, self.cache, mode, m.target_layer_ids, mask, self.capture)
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
        out = self._forward(ids, pos, ForwardMode.EXTEND, mask)
        self.cache.set_lengths([len(x) for x in prompts])
        if B == 1:
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
        self.tap = None  # callable(state, roots, starts) before each draft: a cycle dump (workbench.conform)

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

    def draft(self, roots: list[int], starts: list[int]) -> tuple[Tensor, ForwardRecord]:
        """One block forward for every row: [root, MASK x (block - 1)] at positions [start, start + block).
        -> (logits [B, block - 1, V], record). Afterwards row b's cache holds exactly [0, starts[b])."""
        m = self.models
        dev, Bk = m.device, m.block_size
        B = len(roots)
        if self.tap is not None:  # a dump reads the pending context this forward takes in (None: costs one test)
            self.tap(self, roots, starts)
        if self.static is not None:
            logits, rec = self._draft_static(roots, starts)
        elif B == 1:
            block = torch.full((1, Bk), m.mask_token_id, dtype=torch.long, device=dev)
            block[0, 0] = roots[0]
            ctx = self.context[0]
            positions = torch.arange(starts[0] - ctx.shape[1], starts[0] + Bk, device=dev)[None]
            logits, rec = run_draft(m.draft, m.target, block, positions, ctx, self.cache, self.capture)
        else:
            logits, rec = self._draft_rows(roots, starts)
        # The block's own K/V must not stay: next cycle's block sits at other positions.
        self.cache.set_lengths(starts)
        self.context = [c[:, :0] for c in self.context]
        return logits, rec

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
        try:
            return run_draft(m.draft, m.target, block, pos, ctx, self.cache, self.capture, first)
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
        if len(masks) > 1:
            self._install_hooks()
            self.cache.layer_masks = {i: masks[k] for i, k in enumerate(self.kinds)}
        def forward():
            return run_draft(m.draft, m.target, bufs["block"], pos, bufs["ctx"], self.cache, self.capture,
                             masks[self.kinds[0]])

        try:
            if self.graphs is not None:
                return self.graphs.run("draft", (bufs["block"], pos, bufs["ctx"], rows, self.cache.store,
                                                 *masks.values()), forward)
            return forward()
        finally:
            self.cache.layer_masks = None

    def _install_hooks(self) -> None:
        for layer in self.models.draft.layers:
            attn = layer.self_attn
            if not getattr(attn, "_wb_layer_mask_hook", False):
                attn.register_forward_pre_hook(_swap_layer_mask, with_kwargs=True)
                attn._wb_layer_mask_hook = True

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
