"""Randomly initialised tiny hybrid targets (GatedDeltaNet linear attention + gated full attention): Qwen3-Next
(MoE MLP) and Qwen3.5-text. The writers are ``workbench.models.stand_ins``'s (notebook 08 uses them too); tests
import them by this module's bare name."""
from workbench.models.stand_ins import (  # noqa: F401
    DEFAULT_LAYERS, KINDS, hybrid_config, make_hybrid_pair, make_hybrid_target,
)
