"""Per-architecture model states behind one interface (``base.TargetState``): the cycle hands them a
``TreeLayout`` and the accepted nodes; how each lays out its state is its own business.

- ``registry``: which state serves which config (by family), and the per-family facts read from a config
  (the K/V layout, the linear-attention state, ``StateSpec`` and its bytes) that loading and the shapes
  tools read too.
- ``kv_buffers`` (``KVBuffers``: attention K/V per token), ``masks`` (``PrefixMask``: the tree-verify mask),
  ``dense_target`` (``DenseKV``: the dense target's state), ``drafter`` (``DraftKV``: the DFlash drafter's).
- ``hybrid``: GatedDeltaNet + attention targets (``HybridGDN``: a ``DenseKV`` for the attention layers, a
  conv window and a recurrent state per request for the linear ones).
"""
from workbench.models.base import DraftState, StepOut, TargetState
from workbench.models.dense_target import DenseKV
from workbench.models.drafter import DraftKV
from workbench.models.kv_buffers import KVBuffers
from workbench.models.masks import PrefixMask
from workbench.models.hybrid import HybridCache, HybridGDN
from workbench.models.registry import (StateSpec, family_of, new_draft_state, new_target_state,
                                       register_target_state)

__all__ = ["DenseKV", "DraftKV", "DraftState", "HybridCache", "HybridGDN", "KVBuffers", "PrefixMask", "StateSpec", "StepOut",
           "TargetState", "family_of", "new_draft_state", "new_target_state", "register_target_state"]
