"""Per-architecture model states behind one interface (``base.TargetState``): the cycle hands them a
``TreeLayout`` and the accepted nodes; how each lays out its state is its own business.

- ``dense``: attention K/V per token (``DenseKV`` for the target, ``DraftKV`` for DFlash drafters).
- ``hybrid``: GatedDeltaNet + attention targets (``HybridGDN``: dense K/V for the attention layers, a conv
  window and a recurrent state per request for the linear ones; registered for any target with
  linear-attention layers).
"""
from workbench.models.base import (StateSpec, StepOut, TargetState, new_draft_state, new_target_state,
                                   register_target_state)
from workbench.models.dense import DenseKV, DraftKV, KVBuffers, PrefixMask
from workbench.models.hybrid import HybridCache, HybridGDN, is_hybrid

__all__ = ["DenseKV", "DraftKV", "HybridCache", "HybridGDN", "KVBuffers", "PrefixMask", "StateSpec", "StepOut",
           "TargetState", "is_hybrid", "new_draft_state", "new_target_state", "register_target_state"]
