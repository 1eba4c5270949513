"""Per-token keys/values in preallocated buffers, for the target and the drafter (``KVBuffers``), and the
fixed-storage inputs of a static-shape state (``StaticInputs``).

``KVBuffers`` is the one cache (a Hugging Face ``Cache``) for B >= 1 rows: every row keeps its own
left-aligned rows in shared ``[B, kv_heads, capacity, head_dim]`` buffers with its own length. A forward
of n tokens per row writes rows ``[lengths[b], lengths[b] + n)`` and attention sees ``max(lengths) + n``
columns; the state's mask hides each row's columns it does not own. When every row writes at the same
offset (always at B = 1) the write is a slice, otherwise one scatter. Hugging Face's ``DynamicLayer``
would instead concatenate onto the whole cache at every forward.
"""
from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer

from ddtree_kernels import compact_kv_
from workbench.models.registry import KVLayout, StateSpec, attention_layers, kv_layout


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


# ------------------------------------------------------------------------------------------- described
def kv_specs(config, batch: int, length: int, dtype, prefix: str = "") -> list[StateSpec]:
    """The K/V buffers of ``batch`` rows of ``length`` tokens in every attention layer of ``config``, as
    ``KVBuffers`` holds them (keys and values [batch, heads, length, width]; MLA: c_kv and k_pe)."""
    lay = kv_layout(config)
    layers = attention_layers(config)
    return [StateSpec(prefix + name, "per_token", layers, (batch, lay.heads, length, dim), dtype)
            for name, dim in zip(lay.names, (lay.key_dim, lay.value_dim))]
