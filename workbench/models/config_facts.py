"""The one reader of facts a config states: the model families, layer kinds, drafter settings and dtypes.

    family_table(config)          # its FAMILY_OF_MODEL_TYPE row (None: a model type no row covers)
    layer_kinds(config)           # ("full_attention" | "linear_attention" | ..., one per layer)
    attention_layers(config)      # how many layers cache K/V per token (all but the linear-attention ones)
    draft_value(config, name)     # a DFlash drafter setting, dflash_config first, top level second
    is_drafter(config)            # a DFlash drafter's config
    run_dtype(value)              # "float32" | "bfloat16" | "float16" from a name, an alias or a torch dtype
    dtype_bytes(dtype)            # bytes per element

Loading and validation (``workbench.engine``), the states and forwards (``workbench.models``) and the shape
plan and cost model (``workbench.shapes``) ask these; none of them reads these fields itself
(tests/models/test_config_facts.py runs every shipped config through every consumer). ``config`` is a
transformers config (its text config is used), a dict as config.json holds it (a nested ``text_config``
is unwrapped) or any object with the fields as attributes. No torch at import and no weights.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class Family(NamedTuple):
    """One model type's row: its kind, transformers classes, and which of the workbench's paths cover it."""

    kind: str  # "dense" | "moe" | "mla" | "hybrid": which state class and which shape formulas
    config_class: str  # transformers' config class
    model_class: str  # transformers' causal LM class
    own_forward: bool = False  # the engine's own dense forward (models/dense_forward.py) runs it
    shapes: bool = True  # the shape plan and cost model (workbench.shapes) have its formulas


# model_type (the text model's, after unwrapping text_config) -> its row. A model type not listed runs on the
# dense state with transformers' own forward (any causal LM whose cache is per-token K/V).
FAMILY_OF_MODEL_TYPE = {
    "qwen3": Family("dense", "Qwen3Config", "Qwen3ForCausalLM", own_forward=True),
    "llama": Family("dense", "LlamaConfig", "LlamaForCausalLM", own_forward=True),
    # Same layer layout, no shape formulas here (Qwen2 has attention biases and no q/k norms).
    "qwen2": Family("dense", "Qwen2Config", "Qwen2ForCausalLM", own_forward=True, shapes=False),
    "mistral": Family("dense", "MistralConfig", "MistralForCausalLM", own_forward=True, shapes=False),
    "qwen3_moe": Family("moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", own_forward=True),
    "deepseek_v3": Family("mla", "DeepseekV3Config", "DeepseekV3ForCausalLM"),
    # Kimi-K2 ships remote code for the DeepSeek-V3 architecture (its config names DeepseekV3ForCausalLM).
    "kimi_k2": Family("mla", "DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "qwen3_next": Family("hybrid", "Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "qwen3_5_text": Family("hybrid", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe_text": Family("hybrid", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
}
# A nested checkpoint's outer model_type -> its text model's (when text_config omits model_type).
TEXT_OF = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text", "kimi_k25": "deepseek_v3"}


# --------------------------------------------------------------------------------------------- config fields
def text_config(cfg: Mapping) -> dict:
    """The text model's config dict: ``text_config`` of a nested checkpoint (Qwen3.5/3.6, Kimi-K2.5), else ``cfg``."""
    inner = cfg.get("text_config")
    if not isinstance(inner, Mapping):
        return dict(cfg)
    out = dict(inner)
    outer = cfg.get("model_type")
    out.setdefault("model_type", TEXT_OF.get(outer, outer))
    for k in ("tie_word_embeddings", "architectures"):  # shipped at the top level of nested checkpoints
        if k in cfg and k not in out:
            out[k] = cfg[k]
    return out


def text_fields(config) -> dict:
    """The text model's fields as a dict, from a config dict, a transformers config or any object."""
    if isinstance(config, Mapping):
        return text_config(config)
    get = getattr(config, "get_text_config", None)
    c = get(decoder=True) if callable(get) else config
    out = c.to_dict() if callable(getattr(c, "to_dict", None)) else dict(vars(c))
    out["model_type"] = getattr(c, "model_type", out.get("model_type"))  # to_dict writes the class's
    return out


def family_table(config) -> Family | None:
    """The FAMILY_OF_MODEL_TYPE row of a config's text model (None for a model type no row covers)."""
    return FAMILY_OF_MODEL_TYPE.get(text_fields(config).get("model_type"))


# --------------------------------------------------------------------------------------------- layer kinds
# Names older checkpoints use, as transformers' ``remap_legacy_layer_types`` renames them.
LEGACY_LAYER_TYPES = {"conv": "linear_attention", "mamba": "linear_attention", "attention": "full_attention"}
HYBRID_KINDS = ("full_attention", "linear_attention")
DEFAULT_FULL_ATTENTION_INTERVAL = 4  # transformers' default in the Qwen3-Next / Qwen3.5 config classes


def layer_kinds(config) -> tuple:
    """Each layer's kind, as transformers' config classes build ``layer_types``:

    - ``layer_types`` when the config has it (legacy names renamed: mamba/conv -> linear_attention,
      attention -> full_attention);
    - else, for a hybrid family (Qwen3-Next, Qwen3.5, Qwen3.5-MoE: ``__post_init__`` of their config classes
      in transformers 5.17), layer i is "full_attention" when ``(i + 1) % full_attention_interval == 0``
      (default 4), else "linear_attention": every interval-th layer, counting from 1, is full;
    - else every layer "full_attention" (a sliding window, where transformers marks one, still caches K/V
      per token; this reader does not derive which layers slide).

    A hybrid's kinds must be full_attention / linear_attention, one per layer (a one-line ValueError)."""
    t = text_fields(config)
    n = int(t["num_hidden_layers"])
    row = FAMILY_OF_MODEL_TYPE.get(t.get("model_type"))
    hybrid = row is not None and row.kind == "hybrid"
    given = t.get("layer_types")
    if given is not None:
        kinds = tuple(LEGACY_LAYER_TYPES.get(k, k) for k in given)
    elif hybrid:
        every = int(t.get("full_attention_interval") or DEFAULT_FULL_ATTENTION_INTERVAL)
        kinds = tuple("linear_attention" if (i + 1) % every else "full_attention" for i in range(n))
    else:
        kinds = ("full_attention",) * n
    if hybrid and (len(kinds) != n or set(kinds) - set(HYBRID_KINDS)):
        raise ValueError(f"target config layer_types {list(given or kinds)!r} must name full_attention / "
                         f"linear_attention for each of the {n} layers")
    return kinds


def has_linear_attention(config) -> bool:
    """Any linear-attention layer named in ``layer_types`` (a dense state would verify such a target wrongly).
    Reads no layer count: it routes configs of model types no FAMILY_OF_MODEL_TYPE row covers."""
    given = text_fields(config).get("layer_types") or ()
    return any(LEGACY_LAYER_TYPES.get(k, k) == "linear_attention" for k in given)


def is_hybrid(config) -> bool:
    """A target with linear-attention layers (a recurrent state per request): a config dict or object. The
    layer kinds where the config gives a layer count; else only what ``layer_types`` names."""
    try:
        return "linear_attention" in layer_kinds(config)
    except (KeyError, TypeError, ValueError):
        return has_linear_attention(config)


def attention_layers(config) -> int:
    """How many layers hold per-token K/V: every layer but the linear-attention ones."""
    return sum(k != "linear_attention" for k in layer_kinds(config))


def linear_layers(config) -> int:
    """How many layers are linear attention (GatedDeltaNet): each holds a per-request state."""
    return sum(k == "linear_attention" for k in layer_kinds(config))


# --------------------------------------------------------------------------------------------- the drafter
DRAFT_CLASSES = ("DFlashDraftModel", "DFlash2DraftModel")  # dflash's own names, as ``architectures`` gives them
DEFAULT_BLOCK_SIZE = 16  # dflash's default when a drafter config names none


def draft_value(config, name: str, default=None):
    """A DFlash drafter setting as dflash reads it (``dflash.model._draft_value``): ``dflash_config`` first,
    then the top level, then ``default``. ``config``: a dict as config.json holds it, or a config object."""
    if isinstance(config, Mapping):
        inner, top = config.get("dflash_config"), config.get(name, default)
    else:
        inner, top = getattr(config, "dflash_config", None), getattr(config, name, default)
    return (inner or {}).get(name, top)


def is_drafter(config) -> bool:
    """A DFlash drafter's config: a ``dflash_config``, ``target_layer_ids`` or a DFlash architecture."""
    cfg = config if isinstance(config, Mapping) else text_fields(config)
    return bool(cfg.get("dflash_config") or cfg.get("target_layer_ids") is not None
                or "DFlash" in " ".join(cfg.get("architectures") or []))


# --------------------------------------------------------------------------------------------- dtypes
RUN_DTYPES = ("float32", "bfloat16", "float16")  # what the models run in
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
# float8 / fp8: the roofline's shorthand for a one-byte weight format.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8": 1, "fp8": 1, "int8": 1}


def run_dtype(value) -> str | None:
    """The name in RUN_DTYPES of ``value`` (such a name in any case, an alias above, or the torch dtype),
    None for anything else."""
    name = str(value).replace("torch.", "")
    name = DTYPE_ALIASES.get(name.lower(), name.lower())
    return name if name in RUN_DTYPES else None


def torch_dtype(value):
    """The torch dtype a run dtype names (``run_dtype``'s rule); a one-line ValueError for anything else."""
    import torch

    name = run_dtype(value)
    if name is None:
        raise ValueError(f"dtype={value!r} is not one the models run in: use {', '.join(RUN_DTYPES)} "
                         f"(aliases {', '.join(DTYPE_ALIASES)})")
    return getattr(torch, name)


def dtype_bytes(dtype) -> int:
    """Bytes per element of a dtype: a name above, or a torch dtype (any, by its ``itemsize``)."""
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int) and not isinstance(dtype, str):
        return size
    d = str(dtype).replace("torch.", "")
    if d not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[d]
