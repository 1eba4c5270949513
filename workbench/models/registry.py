"""Which state serves which config, and the per-family facts every tool reads from a config: one place.

    family_of(config)          # "dense" | "moe" | "mla" | "hybrid" (None: a model type no table here covers)
    refusal(config)            # why no state here verifies it losslessly (None: one does)
    state_class(config)        # the TargetState class that serves it (registered detectors first)
    kv_layout(config)          # what one attention layer caches per token (MLA: its latent)
    linear_attention(config)   # a GatedDeltaNet layer's per-request state (None without linear layers)
    StateSpec(...).bytes       # one buffer of a state and its bytes

Loading (``workbench.engine.loading``), the states (``workbench.models``), the shape plan and the cost
model (``workbench.shapes``) all read these. ``config`` is a transformers config (its text config is
used), a dict as config.json holds it (a nested ``text_config`` is unwrapped) or any object with the
fields as attributes. No torch and no weights: the state classes are imported when one is built. The
config fields themselves (families, layer kinds, drafter settings, dtypes) are read in ``config_facts``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from workbench.models.config_facts import (  # noqa: F401  (the config readers: one place, config_facts.py)
    DTYPE_BYTES, FAMILY_OF_MODEL_TYPE, TEXT_OF, attention_layers, dtype_bytes, has_linear_attention, layer_kinds,
    text_config, text_fields,
)

# The state class of each family ("module:Class"); a model type outside FAMILY_OF_MODEL_TYPE without linear-attention
# layers gets the dense one (any transformers causal LM whose cache is per-token K/V).
STATES = {"dense": "workbench.models.dense_target:DenseKV", "moe": "workbench.models.dense_target:DenseKV",
          "mla": "workbench.models.dense_target:DenseKV", "hybrid": "workbench.models.hybrid:HybridGDN"}
DRAFT_STATE = "workbench.models.drafter:DraftKV"  # DFlash drafters: dense attention (full, causal or sliding)


# --------------------------------------------------------------------------------------------- routing
def family_of(config) -> str | None:
    """The family of a config's text model: its model type's, "hybrid" for any model with linear-attention
    layers, "dense" for another transformers model type (None only where a dict names no model type)."""
    t = text_fields(config)
    mt = t.get("model_type")
    if mt in FAMILY_OF_MODEL_TYPE:
        return FAMILY_OF_MODEL_TYPE[mt].kind
    if has_linear_attention(t):
        return "hybrid"
    return "dense" if mt else None


def _hybrid_types() -> tuple:
    return tuple(mt for mt, row in FAMILY_OF_MODEL_TYPE.items() if row.kind == "hybrid")


def refusal(config) -> str | None:
    """Why no state here can verify a target with this config losslessly, or None."""
    t = text_fields(config)
    if (family_of(t) == "hybrid" or has_linear_attention(t)) and t.get("model_type") not in _hybrid_types():
        return (f"a hybrid target (linear-attention layers) of a family whose tree verify is not built "
                f"(supported: {', '.join(_hybrid_types())})")
    return None


def check_supported(config) -> None:
    """Raise a one-line ValueError for a hybrid config the hybrid state cannot run."""
    t = text_fields(config)
    if refusal(t):
        raise ValueError(f"target model_type {t.get('model_type')!r} has linear-attention layers, but hybrid tree "
                         f"verify supports only {', '.join(_hybrid_types())}")


def _load(ref: str):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


# (detect(config) -> bool, factory(models, capture)): states registered from outside, tried first.
_TARGET_STATES: list[tuple[Callable, Callable]] = []


def pair_mismatch(target: tuple[int, int, int], draft: tuple[int, int, tuple]) -> tuple[str, str] | None:
    """The one rule of which drafter fits which target, from (vocab, hidden, layers) of the target and
    (vocab, hidden, target_layer_ids) of the drafter: it embeds with the target's embedding, projects with
    its LM head, and reads its hidden states at ``target_layer_ids``. -> (what differs, in words; which
    side to name the models at: "both" or "draft"), or None when it fits."""
    (tv, th, n), (dv, dh, ids) = target, draft
    if tv != dv:
        return f"vocab size differs: target {tv} vs draft {dv}", "both"
    if th != dh:
        return f"hidden size differs: target {th} vs draft {dh}", "both"
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        return f"draft target_layer_ids {list(ids)} out of range for a target with {n} layers (bad: {bad})", "draft"
    return None


def register_target_state(detect: Callable, factory: Callable) -> None:
    """Route targets whose config ``detect`` accepts to ``factory(models, capture) -> TargetState``
    (the last registered is tried first; then the families above)."""
    _TARGET_STATES.insert(0, (detect, factory))


def state_class(config):
    """The TargetState class of the families above for this target config."""
    return _load(STATES[family_of(config) or "dense"])


def new_target_state(models, capture=None):
    """The state for ``models.target``: the first registered detector that accepts its config, else its
    family's class (dense attention K/V for any model without linear-attention layers)."""
    config = models.target.config
    for detect, factory in _TARGET_STATES:
        if detect(config):
            return factory(models, capture)
    return state_class(config)(models, capture)


def new_draft_state(models, capture=None):
    """The drafter's state: DFlash drafters are dense attention (full, causal or sliding per layer)."""
    return _load(DRAFT_STATE)(models, capture)


# --------------------------------------------------------------------------------------------- state facts
@dataclass(frozen=True)
class KVLayout:
    """What one attention layer caches per token, as transformers' forward hands it to the cache: keys
    [B, heads, n, key_dim] and values [B, heads, n, value_dim].

    MLA (DeepSeek-V3, Kimi-K2): transformers caches the latent before expanding it per head, the
    normalised ``c_kv`` [B, 1, n, kv_lora_rank] in the keys' place and the rotated ``k_pe``
    [B, 1, n, qk_rope_head_dim] in the values' (as SGLang's ``MLATokenToKVPool`` holds them, side by side).
    """

    heads: int
    key_dim: int
    value_dim: int
    names: tuple = ("keys", "values")

    @property
    def parts(self) -> tuple:
        """((name, elements per token), ...) for the two cached tensors."""
        return ((self.names[0], self.heads * self.key_dim), (self.names[1], self.heads * self.value_dim))

    @property
    def width(self) -> int:
        """Cached elements per token per layer."""
        return sum(w for _, w in self.parts)


def kv_layout(config) -> KVLayout:
    t = text_fields(config)
    if t.get("kv_lora_rank"):
        return KVLayout(1, int(t["kv_lora_rank"]), int(t["qk_rope_head_dim"]), ("c_kv", "k_pe"))
    heads = int(t.get("num_key_value_heads") or t["num_attention_heads"])
    dim = int(t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"])
    return KVLayout(heads, dim, dim)


@dataclass(frozen=True)
class LinearAttention:
    """A GatedDeltaNet layer's per-request state, as SGLang's ``Mamba2StateShape`` lays it out."""

    key_heads: int
    value_heads: int  # HV
    key_dim: int  # K per head
    value_dim: int  # V per head
    conv_kernel: int

    @property
    def conv_dim(self) -> int:  # conv over cat([q, k, v]): 2 x key heads x K + value heads x V
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    @property
    def conv_shape(self) -> tuple:  # [conv_dim, K - 1]: the last K - 1 inputs
        return (self.conv_dim, self.conv_kernel - 1)

    @property
    def state_shape(self) -> tuple:  # [HV, V, K]
        return (self.value_heads, self.value_dim, self.key_dim)


def linear_attention(config) -> LinearAttention | None:
    """The GatedDeltaNet state of a hybrid config's linear layers (None for a model without any)."""
    t = text_fields(config)
    if family_of(t) != "hybrid":
        return None
    return LinearAttention(int(t["linear_num_key_heads"]), int(t["linear_num_value_heads"]),
                           int(t["linear_key_head_dim"]), int(t["linear_value_head_dim"]),
                           int(t.get("linear_conv_kernel_dim") or 4))


@dataclass(frozen=True)
class StateSpec:
    """One buffer of a state: what it is per, its shape per layer, its dtype and its bytes. ``kind``:
    ``per_token`` (K/V or MLA latent, grows with the sequence), ``per_request`` (a conv window, a recurrent
    state) or ``scratch_per_node`` (a tree verify's per-node copies). ``dtype``: a torch dtype or its name."""

    name: str
    kind: str
    layers: int  # how many layers hold one such buffer
    shape: tuple  # per layer, e.g. (batch, kv_heads, tokens, head_dim)
    dtype: object
    sglang: str = ""  # the SGLang pool tensor that holds it (the shape plan's specs)

    @property
    def bytes(self) -> int:
        return nbytes(self.shape, self.dtype, self.layers)


def nbytes(shape, dtype, copies: int = 1) -> int:
    """Bytes of ``copies`` tensors of ``shape`` and ``dtype`` (a torch dtype, or a name ``dtype_bytes`` knows)."""
    n = copies
    for d in shape:
        n *= int(d)
    return n * dtype_bytes(dtype)
