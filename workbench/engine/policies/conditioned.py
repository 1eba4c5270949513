"""What the learned-head policies (``CondTree``, ``CondChain``) share: their head, bound to the pair before any
decode, and the scores they build from.

A policy's ``head`` field names the head: a shipped one ('dense', 'hybrid'), a file's path, or None for the one
shipped for the pair it runs on. ``for_pair`` (called as a request starts, and whenever its policy is set) loads
it, refuses a head trained on another pair in one line, and returns a copy bound to it; the copy is equal to the
original (binding changes no field, so labels, the wire and replays are unchanged). The spelling is the
calibrated policies' ('condtree:16', 'CondTree(16, head=hybrid)', a path keeping its case).
"""
from __future__ import annotations

import dataclasses

import numpy as np
from torch import Tensor

from workbench.engine.policies.calibrated import Calibrated
from workbench.engine.policies.cond_head import (MAKE, SHIPPED, CondHead, CondHeadError, conditioned_increments,
                                                 host_increments, load_head, shipped_for)


def check_head_field(who: str, value) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{who} head={value!r} must be a shipped head's name ({', '.join(SHIPPED)}), a file's "
                         "path, or None (the one shipped for the pair)")


class Conditioned(Calibrated):
    """The shared behaviour; subclasses are frozen dataclasses with a ``head`` field, registered."""

    head: str | None

    def for_pair(self, pair: dict) -> "Conditioned":
        if self.head is None:
            head = shipped_for(pair)
            if head is None:
                raise CondHeadError(f"{self.short}: no shipped conditioned head was trained on this pair (vocabulary "
                                    f"{pair.get('vocab')}, block size {pair.get('block_size')}); train one with "
                                    f"{MAKE} and pass head=FILE")
        else:
            head = load_head(self.head)
            head.check_pair(pair)
        return self.bound_to(head)

    def bound_to(self, head: CondHead) -> "Conditioned":
        """A copy that scores with ``head`` (checked by the caller); equal to this one."""
        bound = dataclasses.replace(self)
        object.__setattr__(bound, "_bound", head)  # not a field: equality, labels and the wire stay the same
        return bound

    def head_data(self) -> CondHead:
        """The bound head, or the named one when the policy is used outside a session."""
        head = self.__dict__.get("_bound")
        if head is not None:
            return head
        if self.head is None:
            raise CondHeadError(f"{self.short} is not bound to a pair: start it through a session "
                                "(engine.session / batch_session), or name a head (head='dense')")
        return load_head(self.head)

    def head_reading(self, drafted) -> CondHead:
        """The head, once the draft is known to carry the hidden states it reads (CondHeadError otherwise)."""
        head = self.head_data()
        if drafted.hidden is None:
            raise CondHeadError(f"{self.short} reads the drafter's hidden states, and this drafter keeps none")
        return head

    def increments(self, drafted, roots: Tensor, k: int, sync_free: bool) -> tuple[Tensor, Tensor]:
        """(log q [bs, D, k, k] of each slot's first ``k`` candidates under each parent candidate, their ids
        [bs, D, k]) from the drafter's hidden states and top-K (the head's K)."""
        from ddtree_kernels.tree_build import sorted_slots

        head = self.head_reading(drafted)
        lp = drafted.logprobs  # [bs, D, V]
        K = min(head.K, lp.shape[-1])
        topv, topi = sorted_slots(lp, K) if sync_free else drafted.top(K)  # [bs, D, K]
        k = min(k, K)
        return conditioned_increments(head, drafted.hidden, topv, topi, roots, k), topi[..., :k]

    def host_increments(self, drafted, roots: Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``increments`` scored on the host in NumPy (a CPU draft), for the host tree build."""
        head = self.head_reading(drafted)
        topv, topi = drafted.top(min(head.K, drafted.logprobs.shape[-1]))  # [bs, D, K]
        k = min(k, topi.shape[-1])
        ids = topi.numpy()
        hidden = drafted.hidden.float().numpy()  # [bs, D, H]: a bfloat16 drafter's too (NumPy has no bfloat16)
        return host_increments(head, hidden, topv.numpy(), ids, roots.numpy(), k), ids[..., :k]
