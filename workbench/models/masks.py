"""Attention masks of the dense states: ``PrefixMask`` builds the tree-verify mask (committed prefix + own
ancestors) incrementally across cycles; ``additive`` turns a visibility matrix into SDPA's additive form."""
from __future__ import annotations

import torch
from torch import Tensor


def additive(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """bool -> additive (0 visible, -inf hidden), the form SDPA adds to the scores as it is."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


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
