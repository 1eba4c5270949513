"""Per-architecture model states behind one interface (``base.TargetState``): the cycle hands them a
``TreeLayout`` and the accepted nodes; how each lays out its state is its own business.

- ``dense``: attention K/V per token (``DenseKV`` for the target, ``DraftKV`` for DFlash drafters).
"""
from workbench.models.base import (StateSpec, StepOut, TargetState, new_draft_state, new_target_state,
                                   register_target_state)
from workbench.models.dense import DenseKV, DraftKV, KVBuffers, PrefixMask

__all__ = ["DenseKV", "DraftKV", "KVBuffers", "PrefixMask", "StateSpec", "StepOut", "TargetState",
           "new_draft_state", "new_target_state", "register_target_state"]
