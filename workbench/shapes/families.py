"""Per-family facts computed from a config dict alone: no torch, no weights.

    f = facts(json.load(open("workbench/configs/deepseek-v3.json")))
    f.params["total"], f.active_params                  # parameters; active per token (MoE: k of E experts)
    kv_bytes_per_token(f, "bfloat16")                   # MLA: (kv_lora_rank + qk_rope_head_dim) x layers x 2 B
    linear_state_bytes_per_request(f)                   # hybrids: conv window + recurrent state, linear layers
    per_node_state_bytes(f)                             # hybrids: SGLang's SpeculativeState per verified node
    state_specs(f, batch=8, kv_len=577, nodes=65)       # [StateSpec]: what a verify holds, per kind

One module for the shape plan (``wb.shapes.plan``) and for cost models built on it. Layer counts,
widths and state shapes follow transformers 5.15's modeling code (the parameter formulas are checked
against its meta-device models in tests/test_plan_families.py) and SGLang 0.5.23's memory pools
(``MHATokenToKVPool``, ``MLATokenToKVPool``, ``MambaPool`` and its ``SpeculativeState``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# model_type (the text model's, after unwrapping text_config) -> (family, transformers config, causal LM)
FAMILIES = {
    "qwen3": ("dense", "Qwen3Config", "Qwen3ForCausalLM"),
    "llama": ("dense", "LlamaConfig", "LlamaForCausalLM"),
    "qwen3_moe": ("moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "deepseek_v3": ("mla", "DeepseekV3Config", "DeepseekV3ForCausalLM"),
    # Kimi-K2 ships remote code for the DeepSeek-V3 architecture (its config names DeepseekV3ForCausalLM).
    "kimi_k2": ("mla", "DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "qwen3_next": ("hybrid", "Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "qwen3_5_text": ("hybrid", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe_text": ("hybrid", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
}
# A nested checkpoint's outer model_type -> its text model's (when text_config omits model_type).
_TEXT_OF = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text", "kimi_k25": "deepseek_v3"}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "int8": 1}
# SGLang's MambaPool dtypes (configs/mamba_utils.py::mamba2_state_dtype): conv windows in bfloat16
# (SGLANG_MAMBA_CONV_DTYPE), recurrent states in float32 unless the config's mamba_ssm_dtype says otherwise.
SGLANG_CONV_DTYPE = "bfloat16"
SGLANG_SSM_DTYPE = "float32"


def dtype_bytes(dtype: str) -> int:
    d = str(dtype).replace("torch.", "")
    if d not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[d]


def text_config(cfg: dict) -> dict:
    """The text model's config: ``text_config`` of a nested checkpoint (Qwen3.5/3.6, Kimi-K2.5), else ``cfg``."""
    inner = cfg.get("text_config")
    if not isinstance(inner, dict):
        return dict(cfg)
    out = dict(inner)
    outer = cfg.get("model_type")
    out.setdefault("model_type", _TEXT_OF.get(outer, outer))
    for k in ("tie_word_embeddings", "architectures"):  # shipped at the top level of nested checkpoints
        if k in cfg and k not in out:
            out[k] = cfg[k]
    return out


def model_type(cfg: dict) -> str:
    """The text model's model_type; a ValueError naming it when no family here covers it."""
    t = text_config(cfg)
    mt = t.get("model_type")
    if mt not in FAMILIES:
        known = ", ".join(sorted({*FAMILIES, *_TEXT_OF}))  # nested checkpoints by their outer model_type too
        raise ValueError(f"target config model_type={mt!r} has no shape plan; known: {known}")
    return mt


# Fields each family needs to compute shapes (checked before anything is built).
_COMMON = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings")
REQUIRED = {
    "dense": _COMMON + ("intermediate_size", "num_key_value_heads", "head_dim"),
    "moe": _COMMON + ("num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
                      "moe_intermediate_size"),
    "mla": _COMMON + ("intermediate_size", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                      "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "hybrid": _COMMON + ("num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                         "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"),
}


def require(cfg: dict, what: str = "target") -> None:
    t = text_config(cfg)
    fam = FAMILIES[model_type(cfg)][0]
    for f in REQUIRED[fam]:
        if t.get(f) is None:
            raise ValueError(f"{what} config lacks the field {f!r}, needed to compute shapes "
                             f"(model_type {t['model_type']!r})")


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


@dataclass(frozen=True)
class ModelFacts:
    """What one target config implies: layers by kind, widths, experts, parameters."""

    model_type: str
    family: str  # dense | moe | mla | hybrid
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


def _layer_kinds(t: dict, fam: str) -> tuple:
    n = t["num_hidden_layers"]
    if fam != "hybrid":
        return ("full_attention",) * n
    kinds = t.get("layer_types")
    if kinds is None:  # as transformers builds it from full_attention_interval
        every = int(t.get("full_attention_interval", 4))
        kinds = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if len(kinds) != n or set(kinds) - {"full_attention", "linear_attention"}:
        raise ValueError(f"target config layer_types {kinds!r} must name full_attention / linear_attention "
                         f"for each of the {n} layers")
    return tuple(kinds)


def _moe_layers(t: dict, mt: str, fam: str) -> tuple:
    n = t["num_hidden_layers"]
    if fam == "mla":
        return tuple(range(int(t.get("first_k_dense_replace", 0)), n))
    experts = int(t.get("num_experts") or 0)
    if fam == "dense" or experts == 0:
        return ()
    if mt == "qwen3_5_moe_text":
        return tuple(range(n))
    step, only = int(t.get("decoder_sparse_step", 1)), set(t.get("mlp_only_layers") or ())
    return tuple(i for i in range(n) if i not in only and (i + 1) % step == 0)


def _params(t: dict, mt: str, fam: str, kinds: tuple, moe: tuple, lin: LinearAttention | None) -> dict:
    """Parameter counts by part, as transformers 5.15 builds the model (MTP heads are not built, not counted)."""
    H, V, n = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"]
    nh = t["num_attention_heads"]
    bias = bool(t.get("attention_bias", False))
    p = {"embed": V * H, "lm_head": 0 if t.get("tie_word_embeddings", False) else V * H, "norms": H,
         "attention": 0, "linear_attention": 0, "mlp": 0, "router": 0, "experts": 0, "shared_experts": 0}
    full = kinds.count("full_attention")
    if fam == "mla":
        ql, kvl = t.get("q_lora_rank"), t["kv_lora_rank"]
        rope, nope, vd = t["qk_rope_head_dim"], t["qk_nope_head_dim"], t["v_head_dim"]
        q = (H * ql + ql + ql * nh * (nope + rope)) if ql else H * nh * (nope + rope)
        if bias and ql:
            q += ql
        per = q + H * (kvl + rope) + (kvl + rope if bias else 0) + kvl + kvl * nh * (nope + vd) + nh * vd * H
        p["attention"] = full * per
    else:
        hd, kv = t["head_dim"], t["num_key_value_heads"]
        qw = nh * hd * (2 if fam == "hybrid" else 1)  # Qwen3-Next / 3.5 gate their attention output from q_proj
        per = H * qw + 2 * H * kv * hd + nh * hd * H
        if bias:
            per += qw + 2 * kv * hd + (H if mt == "llama" else 0)
        if mt != "llama":
            per += 2 * hd  # q_norm, k_norm
        p["attention"] = full * per
    if lin is not None:
        kd, vd = lin.key_heads * lin.key_dim, lin.value_heads * lin.value_dim
        per = (H * (2 * kd + 2 * vd) + H * 2 * lin.value_heads  # qkvz and ba (3.5: qkv, z, b, a) projections
               + lin.conv_dim * lin.conv_kernel + 2 * lin.value_heads + lin.value_dim + vd * H)
        p["linear_attention"] = kinds.count("linear_attention") * per
    dense_layers = n - len(moe)
    if dense_layers:
        p["mlp"] = dense_layers * 3 * H * t["intermediate_size"]
    if moe:
        E, Im = int(t.get("num_experts") or t.get("n_routed_experts")), t["moe_intermediate_size"]
        p["router"] = len(moe) * E * H  # (DeepSeek's e_score_correction_bias is a buffer, not counted)
        p["experts"] = len(moe) * E * 3 * H * Im
        if fam == "mla":
            p["shared_experts"] = len(moe) * 3 * H * Im * int(t.get("n_shared_experts") or 0)
        elif t.get("shared_expert_intermediate_size"):
            p["shared_experts"] = len(moe) * (3 * H * t["shared_expert_intermediate_size"] + H)  # + its gate
    p["norms"] += 2 * H * n
    p["total"] = sum(p.values())
    return p


def facts(cfg: dict) -> ModelFacts:
    """ModelFacts of a target config (a dict as config.json holds it; nested text_config is unwrapped)."""
    mt = model_type(cfg)
    require(cfg)
    t = text_config(cfg)
    fam = FAMILIES[mt][0]
    kinds = _layer_kinds(t, fam)
    moe = _moe_layers(t, mt, fam)
    lin = None
    if fam == "hybrid":
        lin = LinearAttention(t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
                              t["linear_value_head_dim"], t["linear_conv_kernel_dim"])
    if fam == "mla":
        parts = (("c_kv", t["kv_lora_rank"]), ("k_pe", t["qk_rope_head_dim"]))
        experts, shared = int(t["n_routed_experts"]), int(t.get("n_shared_experts") or 0)
    else:
        kvw = t["num_key_value_heads"] * t["head_dim"]
        parts = (("keys", kvw), ("values", kvw))
        experts = int(t.get("num_experts") or 0) if moe else 0
        shared = 1 if moe and t.get("shared_expert_intermediate_size") else 0
    return ModelFacts(
        model_type=mt, family=fam, hidden_size=t["hidden_size"], vocab_size=t["vocab_size"], layer_kinds=kinds,
        moe_layers=moe, experts=experts, experts_per_token=int(t.get("num_experts_per_tok") or 0) if moe else 0,
        shared_experts=shared, kv_width=sum(w for _, w in parts), kv_parts=parts, linear=lin,
        ssm_dtype=t.get("mamba_ssm_dtype") or SGLANG_SSM_DTYPE, params=_params(t, mt, fam, kinds, moe, lin))


# --------------------------------------------------------------------------------------------- state sizes
def kv_bytes_per_token(f: ModelFacts, dtype: str = "bfloat16") -> int:
    """Cached bytes per token over all attention layers (dense: keys + values; MLA: the latent)."""
    return f.attention_layers * f.kv_width * dtype_bytes(dtype)


def linear_state_bytes_per_request(f: ModelFacts, conv_dtype: str = SGLANG_CONV_DTYPE,
                                   ssm_dtype: str | None = None) -> int:
    """A request's committed linear-attention state over all linear layers: conv window + recurrent state."""
    if f.linear is None:
        return 0
    conv = f.linear.conv_shape[0] * f.linear.conv_shape[1] * dtype_bytes(conv_dtype)
    hv, v, k = f.linear.state_shape
    return f.linear_layers * (conv + hv * v * k * dtype_bytes(ssm_dtype or f.ssm_dtype))


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


def experts_touched(f: ModelFacts, tokens: int) -> dict:
    """Routed experts one MoE layer runs for ``tokens`` tokens: per token, at most (min(E, tokens x k)) and the
    expectation if each token picked k distinct experts uniformly at random (E x (1 - (1 - k/E)^tokens))."""
    E, k = f.experts, f.experts_per_token
    if not E:
        return {"per_token": 0, "max": 0, "uniform": 0.0, "shared": 0}
    return {"per_token": k, "max": min(E, tokens * k), "uniform": E * (1 - (1 - k / E) ** tokens),
            "shared": f.shared_experts}


@dataclass(frozen=True)
class StateSpec:
    """One kind of state a forward holds: ``per_token`` (KV / latent), ``per_request`` (conv window and
    recurrent state) or ``scratch_per_node`` (SGLang's per-node verify copies). Shape is per layer."""

    name: str
    kind: str
    layers: int
    shape: tuple
    dtype: str
    sglang: str = ""  # the SGLang pool tensor that holds it

    @property
    def bytes(self) -> int:
        n = self.layers
        for d in self.shape:
            n *= int(d)
        return n * dtype_bytes(self.dtype)


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
