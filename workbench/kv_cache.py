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
