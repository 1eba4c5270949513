"""A key/value cache that writes into preallocated buffers instead of concatenating.

Hugging Face's ``DynamicLayer`` concatenates the new rows onto the whole cache at every
forward, copying all of it; a speculative session also crops and compacts it every
cycle. ``BufferedLayer`` keeps keys and values in a buffer with spare rows (grown by
doubling), writes new rows in place, and hands attention a view of the filled rows.
Cropping is a length change; compaction after accept moves only the accepted rows.
"""
from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer

from ddtree_kernels import compact_kv_


class BufferedLayer(DynamicLayer):
    """One layer's keys/values: [bs, kv_heads, capacity, head_dim] buffers, the first ``length`` rows in use."""

    MIN_CAPACITY = 256

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.length = 0
        self._k = key_states.new_empty(0)
        self._v = value_states.new_empty(0)
        self.is_initialized = True

    def _reserve(self, rows: int, like_k: Tensor, like_v: Tensor) -> None:
        cap = self._k.shape[2] if self._k.dim() == 4 else 0
        if rows <= cap:
            return
        new_cap = max(self.MIN_CAPACITY, cap * 2, rows)
        k = like_k.new_empty(like_k.shape[0], like_k.shape[1], new_cap, like_k.shape[3])
        v = like_v.new_empty(like_v.shape[0], like_v.shape[1], new_cap, like_v.shape[3])
        if self.length:
            k[:, :, : self.length].copy_(self._k[:, :, : self.length])
            v[:, :, : self.length].copy_(self._v[:, :, : self.length])
        self._k, self._v = k, v

    def _publish(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self._reserve(self.length + n, key_states, value_states)
        self._k[:, :, self.length : self.length + n].copy_(key_states)
        self._v[:, :, self.length : self.length + n].copy_(value_states)
        self.length += n
        self._publish()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` rows (a negative count, as Hugging Face's crop takes)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative number of rows to remove")
        if self.is_initialized and tokens_to_remove:
            self.length = max(0, self.length + tokens_to_remove)
            self._publish()

    def keep_rows(self, start: int, nodes: Tensor) -> None:
        """Rows [start, start + n) hold a verified tree: keep the ``nodes`` rows there, in order, drop the rest."""
        if not self.is_initialized:
            return
        compact_kv_(self._k, start, nodes)
        compact_kv_(self._v, start, nodes)
        self.length = start + nodes.shape[0]
        self._publish()


class BufferedCache(Cache):
    """A cache of ``BufferedLayer``s, one per decoder layer of ``config``."""

    def __init__(self, config):
        n = config.get_text_config(decoder=True).num_hidden_layers
        super().__init__(layers=[BufferedLayer() for _ in range(n)])

    def keep_rows(self, start: int, nodes: Tensor) -> None:
        for layer in self.layers:
            layer.keep_rows(start, nodes)

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` rows (or drop ``-max_length`` rows when negative)."""
        for layer in self.layers:
            drop = max_length if max_length < 0 else max_length - layer.get_seq_length()
            layer.crop(min(0, drop))


class RaggedLayer(DynamicLayer):
    """One layer's keys/values for a batch: [bs, kv_heads, capacity, head_dim] zero-initialised buffers.

    Request b uses rows [0, lengths[b]) (left-aligned); a forward writes its n new rows at each request's
    own offset and attention sees rows [0, max(lengths) + n): the caller's mask hides each request's unused
    columns. Zeros (not ``new_empty``) because a hidden column still enters SDPA's weighted sum as 0 * value,
    and garbage NaN there would poison the output.
    """

    def __init__(self, owner: "RaggedCache"):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k = key_states.new_zeros(key_states.shape[0], key_states.shape[1], 0, key_states.shape[3])
        self._v = value_states.new_zeros(value_states.shape[0], value_states.shape[1], 0, value_states.shape[3])
        self.is_initialized = True

    def _reserve(self, rows: int) -> None:
        cap = self._k.shape[2]
        if rows <= cap:
            return
        new_cap = max(BufferedLayer.MIN_CAPACITY, cap * 2, rows)
        grow = new_cap - cap
        self._k = torch.cat([self._k, self._k.new_zeros(*self._k.shape[:2], grow, self._k.shape[3])], dim=2)
        self._v = torch.cat([self._v, self._v.new_zeros(*self._v.shape[:2], grow, self._v.shape[3])], dim=2)

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        rows, width = self.owner.write_plan(n)  # rows [bs, n] or None when every offset is 0
        self._reserve(width)
        if rows is None:
            self._k[:, :, :n].copy_(key_states)
            self._v[:, :, :n].copy_(value_states)
        else:
            b = torch.arange(rows.shape[0], device=rows.device)[:, None]
            # Advanced indices around a slice put their dims first: the target is [bs, n, heads, head_dim].
            self._k[b, :, rows] = key_states.transpose(1, 2)
            self._v[b, :, rows] = value_states.transpose(1, 2)
        return self._k[:, :, :width], self._v[:, :, :width]

    def get_seq_length(self) -> int:
        return self.owner.width()

    def rows_of(self, b: int) -> tuple[Tensor, Tensor]:
        n = self.owner.lengths[b]
        return self._k[b : b + 1, :, :n], self._v[b : b + 1, :, :n]

    def move_rows(self, b_idx: Tensor, src: Tensor, dst: Tensor) -> None:
        if not self.is_initialized:
            return
        for buf in (self._k, self._v):
            buf[b_idx, :, dst] = buf[b_idx, :, src]  # the gather copies first: overlapping rows are safe

    def select(self, keep: Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k.index_select(0, keep), self._v.index_select(0, keep)


class RaggedCache(Cache):
    """A batch of caches, one per request, each left-aligned in shared buffers with its own length.

    ``lengths[b]`` rows are in use for request b. A forward of n tokens per request writes rows
    [lengths[b], lengths[b] + n); the caller then sets the new lengths (``set_lengths``), keeps the
    accepted rows of a verified tree (``keep_rows``) or drops retired requests (``select``).
    """

    def __init__(self, config, lengths: list[int]):
        n = config.get_text_config(decoder=True).num_hidden_layers
        super().__init__(layers=[RaggedLayer(self) for _ in range(n)])
        self.lengths = list(lengths)
        self._plan = None
        self._written: int | None = None

    def write_plan(self, n: int) -> tuple[Tensor | None, int]:
        """(destination rows [bs, n] or None when all requests start at row 0, visible width)."""
        key = (n, tuple(self.lengths))
        if self._plan is None or self._plan[0] != key:  # computed once per forward, shared by the layers
            rows = None
            if any(self.lengths):
                rows = torch.tensor(self.lengths)[:, None] + torch.arange(n)[None]
                rows = rows.to(self.layers[0]._k.device)
            self._plan = (key, (rows, max(self.lengths) + n))
        self._written = self._plan[1][1]
        return self._plan[1]

    def width(self) -> int:
        """Rows attention sees: max(lengths), or the last forward's width until the lengths are set."""
        return self._written if self._written is not None else max(self.lengths, default=0)

    def set_lengths(self, lengths: list[int]) -> None:
        self.lengths, self._written = list(lengths), None

    def kv(self, b: int) -> list[tuple[Tensor, Tensor]]:
        """Request b's cache as (keys, values) per layer, [1, kv_heads, lengths[b], head_dim] each."""
        return [layer.rows_of(b) for layer in self.layers]

    def keep_rows(self, starts: list[int], nodes: list[Tensor]) -> None:
        """Batched compaction: request b verified a tree at rows [starts[b], ...); keep its ``nodes[b]``
        rows (root first), in order, at rows [starts[b], starts[b] + len(nodes[b])). One gather and one
        scatter per buffer for the whole batch."""
        A = max(int(x.shape[0]) for x in nodes)
        dev = nodes[0].device
        j = torch.arange(A, device=dev)
        # Short rows repeat their last node: those copies land past the new length, where nothing reads.
        src = torch.stack([s + x[j.clamp(max=x.shape[0] - 1)] for s, x in zip(starts, nodes)])  # [bs, A]
        dst = torch.tensor(starts, device=dev)[:, None] + j[None]  # [bs, A]
        b_idx = torch.arange(len(starts), device=dev)[:, None]
        for layer in self.layers:
            layer.move_rows(b_idx, src, dst)
        self.lengths, self._written = [s + int(x.shape[0]) for s, x in zip(starts, nodes)], None

    def select(self, keep: list[int]) -> None:
        """Keep only the requests ``keep`` (batch rows, in order): retired requests leave the buffers."""
        for layer in self.layers:
            if layer.is_initialized:
                layer.select(torch.tensor(keep, dtype=torch.long, device=layer._k.device))
        self.lengths, self._written = [self.lengths[b] for b in keep], None
