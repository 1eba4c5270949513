"""Per-family facts computed from a config dict alone: no torch, no weights.

    f = facts(load_config("deepseek-v3"))               # a shipped name, a path or a dict
    f.params["total"], f.active_params                  # parameters; active per token (MoE: k of E experts)
    f.layer_params[3].experts, f.attention.heads        # per-layer weights by role; attention widths
    kv_bytes_per_token(f, "bfloat16")                   # MLA: (kv_lora_rank + qk_rope_head_dim) x layers x 2 B
    linear_state_bytes_per_request(f)                   # hybrids: conv window + recurrent state, linear layers
    per_node_state_bytes(f)                             # hybrids: SGLang's SpeculativeState per verified node
    state_specs(f, batch=8, kv_len=577, nodes=65)       # [StateSpec]: what a verify holds, per kind

The one home of per-family structure, for the shape plan (``wb.shapes.plan``) and the roofline cost
(``wb.shapes.cost``, which adds only FLOPs and bytes per forward). Layer counts, widths and state
shapes follow transformers 5.15's modeling code (the parameter formulas are checked against its
meta-device models in tests/shapes/test_plan_families.py and tests/shapes/test_cost.py) and SGLang 0.5.23's memory
pools (``MHATokenToKVPool``, ``MLATokenToKVPool``, ``MambaPool`` and its ``SpeculativeState``).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from workbench.models.config_facts import (  # noqa: F401
    DTYPE_BYTES, FAMILY_OF_MODEL_TYPE, TEXT_OF, draft_value, dtype_bytes, is_drafter, layer_kinds, text_config,
)
from workbench.models.registry import LinearAttention, StateSpec, kv_layout, linear_attention, pair_mismatch

CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # shipped config.json files, by model name

# The family table, the config readers and StateSpec are the registry's (workbench.models.registry), which
# routes a config to its state class too: one place for loading, the shape plan and the cost model.
# SGLang's MambaPool dtypes (configs/mamba_utils.py::mamba2_state_dtype): conv windows in bfloat16
# (SGLANG_MAMBA_CONV_DTYPE, whatever the model dtype), recurrent states in float32 unless the config's
# mamba_ssm_dtype says otherwise.
SGLANG_CONV_DTYPE = "bfloat16"
SGLANG_SSM_DTYPE = "float32"


# --------------------------------------------------------------------------------------------- config input
def load_config(config, what: str = "target") -> dict:
    """A config dict from a dict, a path (a file, or a directory with config.json) or a shipped config's
    name ("qwen3-8b", one of workbench/configs/*.json). An existing path wins over a shipped name."""
    if isinstance(config, Mapping):
        return dict(config)
    if not isinstance(config, (str, Path)):
        raise ValueError(f"{what} config {config!r} must be a dict, a path or a shipped config name")
    p = Path(config)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        shipped = CONFIGS / f"{str(config).removesuffix('.json')}.json"
        if "/" in str(config) or not shipped.is_file():  # a path that is not there is not a name either
            names = ", ".join(sorted(q.stem for q in CONFIGS.glob("*.json")))
            raise ValueError(f"{what} config {config!s} is not a file, a directory with config.json, or a shipped "
                             f"config ({names})")
        p = shipped
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} config {p} is not valid JSON ({e})") from None


def config_name(config, cfg: dict) -> str:
    """A display name: ``_name`` if set, a shipped name or file stem, a directory's name, else the config's
    architecture (or model_type)."""
    if cfg.get("_name"):
        return str(cfg["_name"])
    if isinstance(config, Mapping):
        return (cfg.get("architectures") or [text_config(cfg).get("model_type", "model")])[0]
    p = Path(config)
    if p.is_dir() or p.name == "config.json":
        return (p if p.is_dir() else p.parent).resolve().name
    return p.name.removesuffix(".json")  # not .stem: "llama-3.1-8b-instruct" has no suffix to drop


def model_type(cfg: dict, what: str = "target", purpose: str = "shape plan") -> str:
    """The text model's model_type; a ValueError naming it when no family here covers it."""
    t = text_config(cfg)
    mt = t.get("model_type")
    if mt not in FAMILY_OF_MODEL_TYPE or not FAMILY_OF_MODEL_TYPE[mt].shapes:
        # nested checkpoints by their outer model_type too
        known = ", ".join(sorted({*(m for m, row in FAMILY_OF_MODEL_TYPE.items() if row.shapes), *TEXT_OF}))
        raise ValueError(f"{what} config model_type={mt!r} has no {purpose}; known: {known}")
    return mt


# Fields each family needs (checked before anything is built). Others default as transformers' config
# classes default them (full_attention_interval 4, linear_conv_kernel_dim 4, first_k_dense_replace 3).
_COMMON = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings")
REQUIRED = {
    "dense": _COMMON + ("intermediate_size", "num_key_value_heads", "head_dim"),
    "moe": _COMMON + ("num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
                      "moe_intermediate_size"),
    "mla": _COMMON + ("intermediate_size", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                      "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "hybrid": _COMMON + ("num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                         "linear_key_head_dim", "linear_value_head_dim"),
}


def _field(t: dict, name: str, what: str = "target"):
    if t.get(name) is None:
        raise ValueError(f"{what} config lacks the field {name!r}, needed to compute shapes "
                         f"(model_type {t.get('model_type')!r})")
    return t[name]


# Optional integer fields, read when present: at least 1 (a divisor, a stride, a kernel width) or at least 0.
OPTIONAL_POSITIVE = ("full_attention_interval", "linear_conv_kernel_dim", "decoder_sparse_step", "moe_layer_freq")
OPTIONAL_COUNTS = ("first_k_dense_replace", "q_lora_rank", "num_experts", "n_shared_experts", "n_routed_experts",
                   "shared_expert_intermediate_size", "num_experts_per_tok", "intermediate_size",
                   "moe_intermediate_size")


def integer(value, name: str, least: int = 1):
    """``value`` if it is an int (not a bool) of at least ``least``, else a one-line ValueError naming
    ``name`` (e.g. "target config field hidden_size", "block_size")."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ValueError(f"{name}={value!r} must be {kind}")
    return value


def require(cfg: dict, what: str = "target") -> None:
    """Every field the family needs is there and a positive integer; optional integer fields that are set
    are integers too (a string, a zero head count, a zero stride: one line naming the field)."""
    t = text_config(cfg)
    for f in REQUIRED[FAMILY_OF_MODEL_TYPE[model_type(cfg, what)].kind]:
        integer(_field(t, f, what), f"{what} config field {f}")
    for names, least in ((OPTIONAL_POSITIVE, 1), (OPTIONAL_COUNTS, 0)):
        for f in names:
            if t.get(f) is not None:
                integer(t[f], f"{what} config field {f}", least)


@dataclass(frozen=True)
class DFlash:
    """A DFlash drafter: it owns no embedding and no LM head (the target's), and projects the target's
    hidden states at ``target_layer_ids`` (concatenated) to its width with ``fc``."""

    target_layer_ids: tuple
    block_size: int


def dflash(cfg: dict, what: str = "draft") -> DFlash | None:
    """The DFlash settings of a drafter config (``dflash_config`` or top level), None for any other model."""
    if not is_drafter(cfg):
        return None
    got = {k: draft_value(cfg, k) for k in ("block_size", "target_layer_ids")}
    for k, v in got.items():
        if v is None:
            raise ValueError(f"{what} config lacks the field {k!r} (top level or in dflash_config)")
    ids = got["target_layer_ids"]
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"{what} config field target_layer_ids={ids!r} must be a list of layer indices")
    for i in ids:
        integer(i, f"{what} config target_layer_ids entry", least=0)
    return DFlash(tuple(ids), integer(got["block_size"], f"{what} config field block_size", least=2))


# --------------------------------------------------------------------------------------------- structure
@dataclass(frozen=True)
class Attention:
    """A full-attention layer's widths: grouped K/V heads, or MLA's latent (``kv_lora_rank`` > 0)."""

    heads: int
    kv_heads: int = 0  # GQA
    head_dim: int = 0  # GQA
    gated: bool = False  # Qwen3-Next / 3.5: q_proj also emits the output gate (2 x heads x head_dim)
    qk_norm: bool = True  # per-head q_norm / k_norm (Qwen); Llama has none
    bias: bool = False  # attention_bias
    q_lora_rank: int = 0  # MLA (0: a plain q_proj)
    kv_lora_rank: int = 0
    rope_dim: int = 0  # MLA's qk_rope_head_dim
    nope_dim: int = 0
    v_head_dim: int = 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0


@dataclass(frozen=True)
class LayerParams:
    """One decoder layer's parameters by role, as transformers builds it. ``*_other``: biases, norms and
    per-head scalars (read, never a matmul operand)."""

    kind: str  # "full_attention" | "linear_attention"
    mixer: int  # attention / GatedDeltaNet matmul weights (the depthwise conv included)
    mixer_other: int = 0
    mlp: int = 0  # dense MLP (0 in an MoE layer)
    mlp_other: int = 0  # Llama's mlp_bias
    router: int = 0  # [E, H] (DeepSeek's e_score_correction_bias is a buffer, not counted)
    shared: int = 0  # always-on experts (+ Qwen's shared-expert gate [1, H])
    experts: int = 0  # routed experts in this layer
    topk: int = 0  # routed experts per token
    expert: int = 0  # one routed expert's weights
    norms: int = 0  # input and post-attention norms

    @property
    def matmul(self) -> int:
        """Weights every token multiplies by (routed experts aside)."""
        return self.mixer + self.mlp + self.router + self.shared

    @property
    def other(self) -> int:
        return self.mixer_other + self.mlp_other + self.norms

    @property
    def total(self) -> int:
        return self.matmul + self.other + self.experts * self.expert


@dataclass(frozen=True)
class ModelFacts:
    """What one config implies: layers by kind, widths, experts, parameters (by part and per layer)."""

    model_type: str
    family: str  # dense | moe | mla | hybrid (a DFlash drafter: its layers' family, ``draft`` set)
    hidden_size: int
    vocab_size: int
    layer_kinds: tuple  # "full_attention" / "linear_attention" per layer
    moe_layers: tuple  # indices of layers with routed experts
    experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0  # always-on experts per MoE layer (DeepSeek's n_shared_experts, Qwen's shared expert)
    kv_width: int = 0  # cached elements per token per attention layer (K and V, or MLA's latent)
    kv_parts: tuple = ()  # ((name, width), ...): how kv_width splits (keys/values or c_kv/k_pe)
    linear: LinearAttention | None = None
    ssm_dtype: str = SGLANG_SSM_DTYPE
    params: dict = field(default_factory=dict)
    attention: Attention | None = None
    layer_params: tuple = ()  # [LayerParams] per layer
    rope_dim: int = 0  # rotary dims per head (head_dim x partial_rotary_factor; MLA: qk_rope_head_dim)
    max_positions: int = 0
    tied: bool = False  # the LM head is the embedding table
    draft: DFlash | None = None

    @property
    def layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def attention_layers(self) -> int:
        return sum(k == "full_attention" for k in self.layer_kinds)

    @property
    def linear_layers(self) -> int:
        return sum(k == "linear_attention" for k in self.layer_kinds)

    @property
    def active_params(self) -> int:
        """Parameters one token's forward multiplies by: all but the embedding table (a row lookup) and the
        routed experts it is not sent to (experts_per_token of experts in each MoE layer)."""
        p = self.params
        routed = p.get("experts", 0)
        active_routed = routed * self.experts_per_token // self.experts if self.experts else 0
        return p["total"] - p["embed"] - routed + active_routed


def _moe_layers(t: dict, mt: str, fam: str) -> tuple:
    n = t["num_hidden_layers"]
    if fam == "mla":
        # transformers builds an MoE block in every layer from first_k_dense_replace on; SGLang also honours
        # moe_layer_freq, which transformers ignores: refuse rather than model a different network.
        if int(t.get("moe_layer_freq") or 1) != 1:
            raise ValueError(f"target config moe_layer_freq={t['moe_layer_freq']!r}: only 1 is modelled "
                             "(transformers 5.15 ignores it)")
        return tuple(range(int(t.get("first_k_dense_replace", 3)), n))
    experts = int(t.get("num_experts") or 0)
    if fam == "dense" or experts == 0:
        return ()
    if mt == "qwen3_5_moe_text":
        return tuple(range(n))
    step, only = int(t.get("decoder_sparse_step") or 1), set(t.get("mlp_only_layers") or ())
    return tuple(i for i in range(n) if i not in only and (i + 1) % step == 0)


def _attention(t: dict, mt: str, fam: str) -> Attention:
    bias = bool(t.get("attention_bias", False))
    if fam == "mla":
        return Attention(t["num_attention_heads"], bias=bias, q_lora_rank=int(t.get("q_lora_rank") or 0),
                         kv_lora_rank=t["kv_lora_rank"], rope_dim=t["qk_rope_head_dim"],
                         nope_dim=t["qk_nope_head_dim"], v_head_dim=t["v_head_dim"])
    kv = kv_layout(t)  # the cached heads and width are the projections' (one description, the registry's)
    return Attention(t["num_attention_heads"], kv.heads, kv.key_dim, gated=fam == "hybrid",
                     qk_norm=mt != "llama", bias=bias)


def _attention_params(a: Attention, H: int) -> tuple[int, int]:
    """(matmul weights, other) of one full-attention layer."""
    nh = a.heads
    if a.mla:
        ql, r, rope, qk = a.q_lora_rank, a.kv_lora_rank, a.rope_dim, a.nope_dim + a.rope_dim
        # q (through the q_lora bottleneck or plain), kv_a [H -> r + rope], kv_b [r -> heads x (nope + v)], o
        mm = (H * ql + ql * nh * qk if ql else H * nh * qk) + H * (r + rope) + r * nh * (a.nope_dim + a.v_head_dim)
        mm += nh * a.v_head_dim * H
        other = ql + r  # q_a_layernorm, kv_a_layernorm
        if a.bias:  # q_a_proj, kv_a_proj_with_mqa and o_proj (q_proj, q_b_proj, kv_b_proj have none)
            other += ql + r + rope + H
        return mm, other
    hd, kv = a.head_dim, a.kv_heads
    qw = nh * hd * (2 if a.gated else 1)
    mm = H * qw + 2 * H * kv * hd + nh * hd * H
    other = (2 * hd if a.qk_norm else 0) + (qw + 2 * kv * hd + H if a.bias else 0)  # q/k norms; q, k, v, o biases
    return mm, other


def _linear_params(lin: LinearAttention, H: int) -> tuple[int, int]:
    """(matmul weights, other) of one GatedDeltaNet layer."""
    kd, vd = lin.key_heads * lin.key_dim, lin.value_heads * lin.value_dim
    # qkvz and ba (3.5: qkv, z, b, a) projections, out_proj and the depthwise conv (a matmul per token too)
    mm = H * (2 * kd + 2 * vd) + H * 2 * lin.value_heads + vd * H + lin.conv_dim * lin.conv_kernel
    return mm, 2 * lin.value_heads + lin.value_dim  # dt_bias, A_log, the gated output norm


def _layer_params(t: dict, mt: str, fam: str, kinds: tuple, moe: tuple, att: Attention,
                  lin: LinearAttention | None) -> tuple:
    H = t["hidden_size"]
    full, linear = _attention_params(att, H), (_linear_params(lin, H) if lin else None)
    out = []
    for i, kind in enumerate(kinds):
        mm, other = full if kind == "full_attention" else linear
        mlp = {}
        if i in moe:
            E = int(t.get("n_routed_experts") if fam == "mla" else t["num_experts"])
            Im = _field(t, "moe_intermediate_size")
            mlp = dict(router=E * H, experts=E, topk=int(_field(t, "num_experts_per_tok")), expert=3 * H * Im)
            if fam == "mla":
                mlp["shared"] = 3 * H * Im * int(t.get("n_shared_experts") or 0)
            elif t.get("shared_expert_intermediate_size"):
                mlp["shared"] = 3 * H * t["shared_expert_intermediate_size"] + H  # + its sigmoid gate [1, H]
        else:
            inter = _field(t, "intermediate_size")
            mlp = dict(mlp=3 * H * inter, mlp_other=2 * inter + H if mt == "llama" and t.get("mlp_bias") else 0)
        out.append(LayerParams(kind, mm, other, norms=2 * H, **mlp))
    return tuple(out)


def _params(t: dict, layers: tuple, draft: DFlash | None) -> dict:
    """Parameter counts by part, as transformers 5.15 builds the model (MTP heads are not built, not counted).
    A DFlash drafter has no embedding and no LM head (the target's) but ``fc`` and its norm."""
    H, V = t["hidden_size"], t["vocab_size"]
    full = [L for L in layers if L.kind == "full_attention"]
    p = {"embed": 0 if draft else V * H,
         "lm_head": 0 if draft or t.get("tie_word_embeddings", False) else V * H,
         "norms": H + (H if draft else 0) + sum(L.norms for L in layers),  # final norm (+ the drafter's hidden_norm)
         "attention": sum(L.mixer + L.mixer_other for L in full),
         "linear_attention": sum(L.mixer + L.mixer_other for L in layers if L.kind == "linear_attention"),
         "mlp": sum(L.mlp + L.mlp_other for L in layers), "router": sum(L.router for L in layers),
         "experts": sum(L.experts * L.expert for L in layers), "shared_experts": sum(L.shared for L in layers)}
    if draft:
        p["fc"] = len(draft.target_layer_ids) * H * H  # [layers x H -> H], no bias
    p["total"] = sum(p.values())
    return p


def _rope_dim(t: dict, fam: str) -> int:
    if fam == "mla":
        return t["qk_rope_head_dim"]
    rp = t.get("rope_parameters") or t.get("rope_scaling") or {}
    return int(t["head_dim"] * float(t.get("partial_rotary_factor", rp.get("partial_rotary_factor", 1.0)) or 1.0))


def facts(cfg: dict, what: str = "target", purpose: str = "shape plan") -> ModelFacts:
    """ModelFacts of a config (a dict as config.json holds it; nested text_config is unwrapped; a DFlash
    drafter's layers are its model_type's, with ``draft`` set). ``what`` / ``purpose`` name it in errors."""
    mt = model_type(cfg, what, purpose)
    require(cfg, what)
    t = text_config(cfg)
    fam = FAMILY_OF_MODEL_TYPE[mt].kind
    # The shape formulas model every attention layer as full (a sliding window caches K/V per token too).
    kinds = tuple(k if k == "linear_attention" else "full_attention" for k in layer_kinds(t))
    moe = _moe_layers(t, mt, fam)
    draft = dflash(t, what)
    lin = linear_attention(t)
    parts = kv_layout(t).parts  # what one attention layer caches per token, as the states hold it
    if fam == "mla":
        experts, shared = int(t["n_routed_experts"]), int(t.get("n_shared_experts") or 0)
    else:
        experts = int(t.get("num_experts") or 0) if moe else 0
        shared = 1 if moe and t.get("shared_expert_intermediate_size") else 0
    att = _attention(t, mt, fam)
    layers = _layer_params(t, mt, fam, kinds, moe, att, lin)
    return ModelFacts(
        model_type=mt, family=fam, hidden_size=t["hidden_size"], vocab_size=t["vocab_size"], layer_kinds=kinds,
        moe_layers=moe, experts=experts, experts_per_token=int(t.get("num_experts_per_tok") or 0) if moe else 0,
        shared_experts=shared, kv_width=sum(w for _, w in parts), kv_parts=parts, linear=lin,
        ssm_dtype=t.get("mamba_ssm_dtype") or SGLANG_SSM_DTYPE, params=_params(t, layers, draft), attention=att,
        layer_params=layers, rope_dim=_rope_dim(t, fam), max_positions=int(t["max_position_embeddings"]),
        tied=bool(t.get("tie_word_embeddings", False)) and draft is None, draft=draft)


def check_pair(target: ModelFacts, draft: ModelFacts | None) -> None:
    """A target that is not a drafter and, if given, a DFlash drafter that fits it (same width and
    vocabulary: it uses the target's embedding and LM head; its target_layer_ids within the target)."""
    if target.draft is not None:
        raise ValueError("target_config is a DFlash drafter; pass it as draft_config=")
    if draft is None:
        return
    if draft.draft is None:
        raise ValueError("draft_config is not a DFlash drafter (no dflash_config / target_layer_ids)")
    wrong = pair_mismatch((target.vocab_size, target.hidden_size, target.layers),
                          (draft.vocab_size, draft.hidden_size, tuple(draft.draft.target_layer_ids)))
    if wrong is not None:
        raise ValueError(f"{wrong[0]}: the drafter embeds with the target's embedding, projects with its LM head "
                         "and reads its layers (draft_config does not fit target_config)")


# --------------------------------------------------------------------------------------------- state sizes
def kv_bytes_per_token(f: ModelFacts, dtype: str = "bfloat16") -> int:
    """Cached bytes per token over all attention layers (dense: keys + values; MLA: the latent)."""
    return StateSpec("kv", "per_token", f.attention_layers, (f.kv_width,), dtype).bytes


def linear_state_bytes_per_layer(f: ModelFacts, conv_dtype: str = SGLANG_CONV_DTYPE,
                                 ssm_dtype: str | None = None) -> int:
    """One linear layer's committed state per request: conv window + recurrent state (0 without any)."""
    if f.linear is None:
        return 0
    return (StateSpec("conv", "per_request", 1, f.linear.conv_shape, conv_dtype).bytes
            + StateSpec("ssm", "per_request", 1, f.linear.state_shape, ssm_dtype or f.ssm_dtype).bytes)


def linear_state_bytes_per_request(f: ModelFacts, conv_dtype: str = SGLANG_CONV_DTYPE,
                                   ssm_dtype: str | None = None) -> int:
    """A request's committed linear-attention state over all linear layers: conv window + recurrent state."""
    return f.linear_layers * linear_state_bytes_per_layer(f, conv_dtype, ssm_dtype)


def per_node_state_bytes(f: ModelFacts, conv_dtype: str = SGLANG_CONV_DTYPE, ssm_dtype: str | None = None) -> int:
    """Scratch per verified node in SGLang's ``MambaPool.SpeculativeState``: an intermediate recurrent state and
    conv window per node per linear layer (dense layout, as tree verify uses), so each node can become the
    committed state. Zero for models without linear attention."""
    return linear_state_bytes_per_request(f, conv_dtype, ssm_dtype)  # one state-sized copy per node


def crossover_budget(f: ModelFacts, prompt_len: int, dtype: str = "bfloat16") -> int | None:
    """The smallest tree budget whose per-node states (1 + budget nodes) outweigh the prompt's whole KV cache;
    None without linear attention."""
    node = per_node_state_bytes(f)
    if not node:
        return None
    kv = prompt_len * kv_bytes_per_token(f, dtype)
    return kv // node  # (1 + budget) x node > kv  <=>  budget >= floor(kv / node)


def uniform_experts(experts: int, topk: int, tokens: int) -> float:
    """Expected distinct experts ``tokens`` tokens route to when each picks ``topk`` of ``experts`` uniformly
    and independently (a balanced router): an expert is missed by one token with probability 1 - k/E, so
    E (1 - (1 - k/E)^tokens). Exactly k for one token."""
    if not experts:
        return 0.0
    return experts * (1.0 - (1.0 - topk / experts) ** tokens)


def experts_touched(f: ModelFacts, tokens: int) -> dict:
    """Routed experts one MoE layer runs for ``tokens`` tokens: per token, at most (min(E, tokens x k)) and the
    expectation under uniform routing (``uniform_experts``)."""
    E, k = f.experts, f.experts_per_token
    if not E:
        return {"per_token": 0, "max": 0, "uniform": 0.0, "shared": 0}
    return {"per_token": k, "max": min(E, tokens * k), "uniform": uniform_experts(E, k, tokens),
            "shared": f.shared_experts}


def state_specs(f: ModelFacts, batch: int, kv_len: int, nodes: int = 0, dtype: str = "bfloat16") -> list:
    """States of a batch after a forward: the KV (or MLA latent) of ``kv_len`` tokens per request in the
    attention layers; for hybrids also the linear layers' conv window and recurrent state per request and,
    for a verify over ``nodes`` nodes, SGLang's per-node intermediate copies."""
    out = []
    if f.family == "mla":
        out.append(StateSpec("MLA latent (c_kv + k_pe)", "per_token", f.attention_layers, (batch, kv_len, f.kv_width),
                             dtype, "MLATokenToKVPool.kv_buffer[layer] [tokens, 1, kv_lora_rank + qk_rope_head_dim]"))
    else:
        out.append(StateSpec("keys + values", "per_token", f.attention_layers, (2, batch, kv_len, f.kv_width // 2),
                             dtype, "MHATokenToKVPool.{k,v}_buffer[layer] [tokens, kv_heads, head_dim]"))
    if f.linear is not None:
        conv, st = f.linear.conv_shape, f.linear.state_shape
        out.append(StateSpec("conv window", "per_request", f.linear_layers, (batch, *conv), SGLANG_CONV_DTYPE,
                             "MambaPool conv [linear layers, requests, conv_dim, K - 1]"))
        out.append(StateSpec("recurrent state", "per_request", f.linear_layers, (batch, *st), f.ssm_dtype,
                             "MambaPool temporal [linear layers, requests, HV, V, K]"))
        if nodes:
            out.append(StateSpec("per-node conv window", "scratch_per_node", f.linear_layers, (batch, nodes, *conv),
                                 SGLANG_CONV_DTYPE, "SpeculativeState.intermediate_conv_window "
                                 "[linear layers, requests, draft tokens, conv_dim, K - 1]"))
            out.append(StateSpec("per-node recurrent state", "scratch_per_node", f.linear_layers, (batch, nodes, *st),
                                 f.ssm_dtype, "SpeculativeState.intermediate_ssm "
                                 "[linear layers, requests, draft tokens, HV, V, K]"))
    return out
