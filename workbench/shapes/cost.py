"""What a forward costs on a GPU, from configs alone: FLOPs, bytes moved, arithmetic intensity, roofline time.

    c = wb.shapes.cost("qwen3-8b", gpu="H200", batch=1, prompt_len=512, budgets=[16, 64, 256],
                       draft_config="qwen3-8b-dflash-b16")
    c.rows            # EXTEND, DECODE, TARGET_VERIFY per budget, the drafter's block: flops, bytes, seconds, bound
    c.free_budget     # largest budget whose verify costs at most 1.1x the DECODE forward
    c.speedup({16: 4.1, 64: 4.9})   # tau per budget (or wb.analysis.budget_needed(trace)) -> predicted speedup

FLOPs are counted the way ``torch.utils.flop_counter.FlopCounterMode`` counts a Hugging Face forward:
2 per multiply-add of every matmul (weights, LM head on the kept rows, the rotary embedding's
``inv_freq @ positions``) and 4 x heads x head_dim per (query, key) pair of attention, the mask not
subtracted (a tree's masked-out pairs are still computed by a dense-mask kernel). Bytes: weights read
once per forward (for MoE only the experts the batch's tokens touch), the KV cache read and the new
tokens' KV written, recurrent state read and written (hybrids), embedding rows gathered and logits
written; activations are left out (they stay on chip at these token counts). Roofline time =
max(FLOPs / peak FLOP/s, bytes / bandwidth).

Structure (layers, widths, experts, parameters, state bytes) comes from ``workbench.shapes.families``, the
one home the shape plan shares; this module adds only what a forward costs. Per family: dense Qwen3 /
Llama; Qwen3-MoE; DeepSeek-V3 / Kimi-K2 MLA (absorbed form in DECODE and TARGET_VERIFY, as SGLang runs
them; KV = the 576-wide latent); Qwen3-Next / Qwen3.5 hybrids (GatedDeltaNet layers carry a recurrent
state; a tree verify writes one intermediate state per node, as SGLang's tree kernels do).
"""
from __future__ import annotations

import html
import json
import math
import operator
from collections.abc import Mapping, Sequence
from numbers import Real
from dataclasses import dataclass, field
from pathlib import Path

from workbench.shapes import families, machinery, parallel

GPUS_FILE = Path(__file__).resolve().parent / "gpus.json"
FREE_FACTOR = 1.1  # a verify is "free" while its roofline time stays within 10% of one DECODE forward


# --------------------------------------------------------------------------------------------------------- GPUs
@dataclass(frozen=True)
class Gpu:
    """A roofline: peak dense bf16 tensor FLOP/s and memory bandwidth in bytes/s."""

    name: str
    flops: float
    bandwidth: float
    source: str = ""

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a forward is compute-bound."""
        return self.flops / self.bandwidth


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def gpus() -> dict[str, Gpu]:
    """The GPUs shipped as data (workbench/shapes/gpus.json), by name."""
    data = json.loads(GPUS_FILE.read_text())
    return {k: Gpu(k, float(v["flops"]), float(v["bandwidth"]), v.get("source", ""))
            for k, v in data.items() if not k.startswith("_")}


def resolve_gpu(gpu) -> Gpu:
    """A Gpu from a shipped name (case, spaces and dashes ignored), a Gpu, or a (flops, bandwidth) pair."""
    if isinstance(gpu, Gpu):
        return gpu
    if isinstance(gpu, (tuple, list)):
        if len(gpu) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in gpu):
            raise ValueError(f"gpu={gpu!r}: a custom GPU is (peak FLOP/s, bandwidth in bytes/s), two positive numbers")
        return Gpu(f"custom ({gpu[0]:.3g} FLOP/s, {gpu[1]:.3g} B/s)", float(gpu[0]), float(gpu[1]))
    if not isinstance(gpu, str):
        raise ValueError(f"gpu={gpu!r} must be a GPU name or (flops, bandwidth)")
    data = json.loads(GPUS_FILE.read_text())
    known = {k: v for k, v in data.items() if not k.startswith("_")}
    for k, v in known.items():
        if _norm(gpu) in {_norm(k), *(_norm(a) for a in v.get("aliases", ()))}:
            return gpus()[k]
    raise ValueError(f"unknown gpu={gpu!r}; known: {', '.join(known)}; or pass gpu=(flops, bandwidth)")


# ------------------------------------------------------------------------------------------------ model facts
@dataclass(frozen=True)
class Layer:
    """One decoder layer's cost: its weights (from ``families.LayerParams``) and what a forward does with
    them beyond weight matmuls. Counts are elements, except ``state_bytes``."""

    kind: str  # "attention", "mla" or "linear" (GatedDeltaNet)
    matmul_params: int  # weights used as matmul operands by every token (2 FLOPs each per token)
    other_params: int = 0  # norms, biases, per-head scalars: read, no matmul FLOPs
    experts: int = 0  # routed experts (0: dense MLP, counted in matmul_params)
    topk: int = 0  # experts per token
    expert_params: int = 0  # one routed expert's weights
    kv_per_token: int = 0  # cached elements per token (K and V, or MLA's latent + rope key)
    pair_flops: int = 0  # FLOPs per (query, key) pair per request in DECODE / TARGET_VERIFY
    pair_flops_extend: int = 0  # in EXTEND (MLA prefills in the decompressed, multi-head form)
    token_flops: int = 0  # per-token FLOPs outside weight matmuls (the delta rule's state products)
    state_bytes: int = 0  # committed linear-attention state per request (SGLang's MambaPool dtypes)


@dataclass(frozen=True)
class Arch:
    """A model reduced to what its cost needs; its structure is ``facts`` (workbench.shapes.families)."""

    name: str
    family: str  # facts.family, or "dflash" for a drafter
    facts: families.ModelFacts
    layers: tuple

    hidden = property(lambda self: self.facts.hidden_size)
    vocab = property(lambda self: self.facts.vocab_size)
    tied = property(lambda self: self.facts.tied)
    max_positions = property(lambda self: self.facts.max_positions)
    # HF's rotary embedding costs rope_dim FLOPs per position (inv_freq @ positions)
    rope_dim = property(lambda self: self.facts.rope_dim)

    @property
    def draft(self) -> dict | None:
        """A DFlash drafter's {"context_features": target layers x H, "block_size": B}; None for a target."""
        d = self.facts.draft
        return {"context_features": len(d.target_layer_ids) * self.hidden, "block_size": d.block_size} if d else None

    @property
    def params(self) -> int:
        """Every weight: embedding, layers (all experts), final norm, LM head (a drafter: fc, no table)."""
        return self.facts.params["total"]

    @property
    def active_params(self) -> int:
        """Weights one token uses, the embedding table included (as model cards count them): routed experts
        counted topk times. ``facts.active_params`` leaves the table out (a lookup is not a matmul)."""
        return self.facts.active_params + self.facts.params["embed"]

    @property
    def _fc(self) -> int:
        return self.facts.params.get("fc", 0)

    @property
    def head_params(self) -> int:
        """Weights outside the layers besides the embedding and fc: final norm(s) and the LM head unless tied."""
        p = self.facts.params
        return p["total"] - p["embed"] - self._fc - sum(L.total for L in self.facts.layer_params)

    @property
    def kv_per_token(self) -> int:
        return sum(L.kv_per_token for L in self.layers)


load_config = families.load_config  # one reader for plan() and cost(): a dict, a path or a shipped name


def _layer(f: families.ModelFacts, L: families.LayerParams) -> Layer:
    """A layer's cost from its weights and widths: FlopCounterMode's attention formula per (query, key) pair
    and the delta rule's per-token state products."""
    kw = dict(matmul_params=L.matmul, other_params=L.other, experts=L.experts, topk=L.topk, expert_params=L.expert)
    if L.kind == "linear_attention":
        lin = f.linear
        return Layer("linear", **kw,
                     token_flops=6 * lin.value_heads * lin.key_dim * lin.value_dim,  # S^T k, rank-1 update, S^T q
                     state_bytes=families.linear_state_bytes_per_layer(f))
    a = f.attention
    if a.mla:
        hq, r, rope = a.heads, a.kv_lora_rank, a.rope_dim
        # kv_b_proj is absorbed into q and o per token in decode/verify and applied to the new tokens in
        # extend: either way 2 FLOPs per weight per token (it is in matmul_params).
        return Layer("mla", **kw, kv_per_token=f.kv_width,
                     pair_flops=2 * hq * (r + rope) + 2 * hq * r,  # scores over the latent + rope key; values = latent
                     pair_flops_extend=2 * hq * (a.nope_dim + rope) + 2 * hq * a.v_head_dim)  # decompressed heads
    pair = 4 * a.heads * a.head_dim  # QK^T and PV, 2 FLOPs per multiply-add each
    return Layer("attention", **kw, kv_per_token=f.kv_width, pair_flops=pair, pair_flops_extend=pair)


def arch(config, what: str = "target") -> Arch:
    """A config (dict, path or shipped name) reduced to its cost facts; a nested ``text_config`` is unwrapped."""
    cfg = load_config(config, what)
    f = families.facts(cfg, what, purpose="cost model")
    return Arch(families.config_name(config, cfg), "dflash" if f.draft else f.family, f,
                tuple(_layer(f, L) for L in f.layer_params))


# ------------------------------------------------------------------------------------------------ forward cost
experts_touched = families.uniform_experts  # distinct experts a batch's tokens touch (balanced routing)


def forward_cost(a: Arch, mode: str, batch: int, tokens: int, past: int, logits_rows: int, dtype_bytes: int = 2,
                 context: int = 0, tree_states: bool = False, weight_bytes: float | None = None) -> dict:
    """FLOPs and bytes of one forward of ``batch`` requests x ``tokens`` new tokens after ``past`` cached ones.

    ``context``: a DFlash drafter's new target-feature rows (projected by fc, written to its KV).
    ``tree_states``: hybrid verify writes one recurrent state per node (SGLang's tree kernels).
    ``weight_bytes``: bytes per weight of the layers' matmuls (experts included) for a quantized model (4-bit
    with its scales: about 0.56); the K/V cache, activations, embedding and LM head stay at ``dtype_bytes``.
    """
    b, n, e = batch, tokens, dtype_bytes
    wq = e if weight_bytes is None else weight_bytes
    V, H = a.vocab, a.hidden
    kv_new = n + context  # positions whose K/V this forward writes
    keys = past + context + n  # keys each query sees (no mask subtracted)
    extend = mode == "EXTEND"
    flops = 2 * b * a._fc * context + b * a.rope_dim * (context + n if a.draft else n)
    w_bytes = (a._fc + a.head_params) * e
    kv_bytes = state_bytes = 0.0
    attn_flops = 0
    for L in a.layers:
        # K/V projections of a drafter also run over the context rows
        ctx_mm = context * (L.kv_per_token * H) if a.draft else 0
        flops += 2 * b * (n * (L.matmul_params + L.topk * L.expert_params) + ctx_mm)
        pf = L.pair_flops_extend if extend else L.pair_flops
        attn_flops += b * pf * n * keys if L.kv_per_token else 0
        flops += b * L.token_flops * n
        touched = experts_touched(L.experts, L.topk, b * n)
        w_bytes += (L.matmul_params + touched * L.expert_params) * wq + L.other_params * e
        kv_bytes += b * L.kv_per_token * (past + kv_new) * e  # read the cache, write the new tokens
        if L.state_bytes:
            writes = n if tree_states else 1  # a tree verify keeps every node's state to pick the accepted one
            state_bytes += b * (1 + writes) * L.state_bytes
    flops += attn_flops
    rows = b * logits_rows
    flops += 2 * rows * H * V
    emb_bytes = b * n * H * e  # gathered embedding rows (the drafter's noise block reads the target's)
    lm_bytes = V * H * e if (a.tied or a.draft) else 0  # tied: the embedding table is read whole as the LM head
    logit_bytes = rows * V * e
    total = w_bytes + lm_bytes + kv_bytes + state_bytes + emb_bytes + logit_bytes
    return {"flops": int(flops), "attention_flops": int(attn_flops), "bytes": int(total),
            "weight_bytes": int(w_bytes + lm_bytes), "kv_bytes": int(kv_bytes), "state_bytes": int(state_bytes),
            "logits_bytes": int(logit_bytes)}


def _roofline(c: dict, g: Gpu) -> dict:
    tc, tm = c["flops"] / g.flops, c["bytes"] / g.bandwidth
    return {**c, "intensity": c["flops"] / c["bytes"] if c["bytes"] else math.inf, "seconds": max(tc, tm),
            "compute_s": tc, "memory_s": tm, "bound": "compute" if tc > tm else "memory"}


@dataclass
class CostTable:
    """Roofline cost of every forward a DDTree decode runs (see ``cost``)."""

    target: Arch
    gpu: Gpu
    settings: dict
    rows: list = field(default_factory=list)
    draft: Arch | None = None
    notes: list = field(default_factory=list)

    def forward(self, mode: str, budget: int | None = None) -> dict:
        """One row, computed on demand: mode EXTEND, DECODE, TARGET_VERIFY (with ``budget``) or DRAFT."""
        s, a = self.settings, self.target
        b, P, e = s["batch"], s["prompt_len"], s["dtype_bytes"]
        wb = None if s.get("weight_bits") is None else s["weight_bits"] / 8  # the target's quantized weights
        if mode == "EXTEND":
            c = forward_cost(a, mode, b, P, 0, 1, e, weight_bytes=wb)
            n = P
        elif mode == "DECODE":
            c, n = forward_cost(a, mode, b, 1, P, 1, e, weight_bytes=wb), 1
        elif mode == "TARGET_VERIFY":
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
                raise ValueError(f"budget={budget!r} must be a non-negative integer (tree nodes besides the root)")
            n = 1 + budget  # the root (last committed token) + the tree's nodes, every row's logits kept
            c = forward_cost(a, mode, b, n, P, n, e, tree_states=True, weight_bytes=wb)
        elif mode == "DRAFT":
            if self.draft is None:
                raise ValueError("no draft_config was given, so there is no drafter forward to cost")
            B = self.draft.draft["block_size"]
            n = B
            c = forward_cost(self.draft, mode, b, B, P, B - 1, e, context=s["draft_context"])
        else:
            raise ValueError(f"mode={mode!r}: expected EXTEND, DECODE, TARGET_VERIFY or DRAFT")
        kept = n if mode == "TARGET_VERIFY" else (self.draft.draft["block_size"] - 1 if mode == "DRAFT" else 1)
        arch_ = self.draft if mode == "DRAFT" else a
        timed = parallel.tp_time(arch_, c, b * n, b * kept, s["tp"], s["interconnect"], self.gpu, e)
        return {"mode": mode, "budget": budget if mode == "TARGET_VERIFY" else None, "tokens": b * n, **timed}

    def verify_seconds(self, budget: int) -> float:
        return self.forward("TARGET_VERIFY", budget)["seconds"]

    @property
    def chain_budget(self) -> int:
        """Linear DFlash's verify: the root + the drafter's block_size - 1 drafted tokens (budget block - 1)."""
        if self.draft is None:
            raise ValueError("no draft_config was given, so there is no DFlash chain to cost")
        return self.draft.draft["block_size"] - 1

    def cycle_seconds(self, budget: int, overhead_s: float | None = None, tree: bool = True) -> dict:
        """One speculative cycle at ``budget`` tree nodes: the drafter's block forward + TARGET_VERIFY(budget)
        + the per-step overhead (seconds per cycle outside the forwards; default the table's) + the tree
        machinery (``machinery_s``: the fitted share of that step for the table's engine and graph mode; 0 for
        a chain, ``tree=False``, or a table built without ``engine`` and ``graph``)."""
        over = self.settings["overhead_s"] if overhead_s is None else _seconds(overhead_s, "overhead_s")
        draft = self.forward("DRAFT")["seconds"] if self.draft is not None else 0.0
        ver = self.verify_seconds(budget)
        mach = self.machinery_seconds(draft + ver + over) if tree else 0.0
        return {"budget": budget, "draft_s": draft, "verify_s": ver, "overhead_s": over, "machinery_s": mach,
                "cycle_s": draft + ver + over + mach}

    def machinery_seconds(self, step_s: float) -> float:
        """Tree machinery per step on a tree step of ``step_s`` seconds (forwards + overhead), for the table's
        engine kind and graph mode (``workbench.shapes.machinery``); 0 when the table names neither."""
        s = self.settings
        if s.get("engine") is None:
            return 0.0
        return s["machinery"].seconds(step_s, s["engine"], s["graph"])

    @property
    def decode(self) -> dict:
        return self.forward("DECODE")

    @property
    def free_budget(self) -> int:
        """Largest budget B whose TARGET_VERIFY (1 + B tokens per request) costs at most 1.1x the DECODE
        forward on this roofline, at the same batch and prompt length; solved over the integers."""
        limit = FREE_FACTOR * self.decode["seconds"]
        hi = 1
        cap = (self.target.max_positions or 1 << 20) - self.settings["prompt_len"] - 1
        while hi < cap and self.verify_seconds(hi) <= limit:
            hi = min(2 * hi, cap)
        lo = 0  # verify(0) is DECODE's shape: always free
        if self.verify_seconds(hi) <= limit:
            return hi
        while hi - lo > 1:  # invariant: verify(lo) <= limit < verify(hi); the cost only grows with B
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.verify_seconds(mid) <= limit else (lo, mid)
        return lo

    def curve(self, budgets: Sequence[int] | None = None) -> dict:
        """Verify roofline time (and its compute and memory parts) against budget, for figures."""
        budgets = list(budgets) if budgets is not None else _log_budgets(max(512, 2 * self.free_budget))
        rows = [self.forward("TARGET_VERIFY", int(B)) for B in budgets]
        return {"budget": budgets, "seconds": [r["seconds"] for r in rows], "compute_s": [r["compute_s"] for r in rows],
                "memory_s": [r["memory_s"] for r in rows], "decode_s": self.decode["seconds"],
                "free_budget": self.free_budget, "free_factor": FREE_FACTOR, "gpu": self.gpu.name,
                "model": self.target.name, "batch": self.settings["batch"], "prompt_len": self.settings["prompt_len"]}

    def speedup(self, acceptance, budgets: Sequence[int] | None = None, overhead_s: float | None = None,
                dflash_tau: float | None = None) -> "Speedup":
        """Predicted DDTree speedup over AR per budget: tau(B) x DECODE / (drafter + verify(B) + overhead
        + the tree machinery, when the table names an engine and graph mode)."""
        return speedup(self, acceptance, budgets, overhead_s, dflash_tau)

    def __repr__(self) -> str:
        s = self.settings
        head = (f"cost({self.target.name}, gpu={self.gpu.name}, batch={s['batch']}, prompt_len={s['prompt_len']}, "
                f"{s['dtype']}): ridge {self.gpu.ridge:.0f} FLOP/B, free budget {self.free_budget}")
        lines = [head, f"  {'forward':<22} {'tokens':>7} {'GFLOP':>10} {'MB':>10} {'FLOP/B':>8} {'us':>9}  bound"]
        for r in self.rows:
            lbl = r["mode"] + (f"({r['budget']})" if r["budget"] is not None else "")
            lines.append(f"  {lbl:<22} {r['tokens']:>7} {r['flops'] / 1e9:>10.1f} {r['bytes'] / 1e6:>10.1f} "
                         f"{r['intensity']:>8.1f} {r['seconds'] * 1e6:>9.1f}  {r['bound']}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(repr(self))}</pre>"


def _log_budgets(top: int) -> list[int]:
    out, b = [0], 1
    while b <= top:
        out.append(b)
        b *= 2
    return out


def _seconds(v, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, Real) or not 0 <= v < math.inf:
        raise ValueError(f"{name}={v!r} must be a finite number of seconds >= 0")
    return float(v)


def _tree_machinery(engine, graph, given):
    """The shares a tree's machinery is priced with (``given`` or the fitted ones), once ``engine`` and ``graph``
    are both named or both left out."""
    if (engine is None) != (graph is None):
        raise ValueError(f"engine={engine!r}, graph={graph!r}: the tree machinery term needs both or neither")
    if graph is not None and graph not in machinery.GRAPH_MODES:
        raise ValueError(f"graph={graph!r} is not one of {', '.join(machinery.GRAPH_MODES)}")
    return machinery.FITTED if given is None else given


FAMILY_NOTES = {
    "mla": "MLA: DECODE/TARGET_VERIFY in the absorbed form over the cached latent (kv_lora_rank + qk_rope_head_dim "
           "per token per layer), EXTEND decompressed",
    "hybrid": "hybrid: GatedDeltaNet state in float32 read once and written once per forward; a tree verify writes "
              "one intermediate state (and conv window) per node",
}


def checked_inputs(budgets, weight_bits) -> list:
    """``cost``'s budgets as a list, each a non-negative int, and ``weight_bits`` None or 1 to 32 (ValueError)."""
    budgets = list(budgets)
    bad = [B for B in budgets if isinstance(B, bool) or not isinstance(B, int) or B < 0]
    if bad:
        raise ValueError(f"budgets {bad} must be non-negative integers")
    if weight_bits is not None and (isinstance(weight_bits, bool) or not isinstance(weight_bits, Real)
                                    or not 1 <= weight_bits <= 32):
        raise ValueError(f"weight_bits={weight_bits!r} must be a number of bits per weight from 1 to 32")
    return budgets


def cost(target_config, gpu="H200", batch: int = 1, prompt_len: int = 512,
         budgets: Sequence[int] = (4, 16, 64, 256), draft_config=None, dtype: str = "bfloat16",
         draft_context: int | None = None, tp: int = 1, interconnect="nvlink", overhead_s: float = 0.0,
         engine: str | None = None, graph: str | None = None, tree_machinery=None,
         weight_bits: float | None = None) -> CostTable:
    """Roofline cost of EXTEND (``prompt_len`` tokens), DECODE, TARGET_VERIFY at each budget (1 + B tokens) and,
    with ``draft_config``, the DFlash drafter's block forward, at ``batch`` requests with ``prompt_len`` cached.

    ``target_config`` / ``draft_config``: a dict, a config path, or a shipped config's name ("qwen3-8b").
    ``gpu``: a name (``wb.shapes.cost_gpus()``) or (peak FLOP/s, bytes/s). ``draft_context``: target-feature
    rows the drafter takes in per cycle (default its block size: a cycle that accepted everything).
    ``tp``: tensor-parallel degree over ``interconnect`` ("nvlink", "pcie5" or (bytes/s, s per ring step)):
    weights and K/V heads split, two all-reduces per layer (``workbench.shapes.parallel``); times are per GPU.
    A degree no engine can shard (attention heads not split evenly, K/V heads neither split nor replicated
    evenly) and an unknown interconnect are refused at any ``tp`` (``parallel.TensorParallelError``).
    ``overhead_s``: measured seconds per cycle outside the forwards (``cycle_seconds``, ``speedup``).
    ``engine`` and ``graph`` (both or neither): the engine kind ("vllm", "transformers", "ggml", ...) and graph
    mode ("graphs", "eager", "compiled") a tree runs under; a tree's cycle then adds the tree machinery, that
    pair's share of its step (``tree_machinery``, default ``machinery.FITTED``, fitted on the public figures).
    ``weight_bits``: bits per weight of a quantized target's layers, scales included (AWQ INT4 4.25, NVFP4 4.5,
    Q4_K_M 4.85, Q5_K 5.5); ``dtype`` then sets the K/V cache, activations, embedding and LM head. None: ``dtype``.
    Rows: dicts with mode, budget, tokens, flops, bytes, intensity, seconds, bound (and the parts; comm_s).
    """
    for name, v in (("batch", batch), ("prompt_len", prompt_len)):
        families.integer(v, name)
    e = families.dtype_bytes(dtype)
    budgets = checked_inputs(budgets, weight_bits)
    g = resolve_gpu(gpu)
    parallel.check_tp(tp)
    # resolved at any TP: a misspelt link at tp=1 would otherwise pass, then fail once tp changes
    link = parallel.resolve_interconnect(interconnect)
    link = link if tp > 1 else None  # TP1 has no collectives: its rows name no link
    overhead_s = _seconds(overhead_s, "overhead_s")
    tree_machinery = _tree_machinery(engine, graph, tree_machinery)
    t = arch(target_config, "target")
    d = arch(draft_config, "draft") if draft_config is not None else None
    families.check_pair(t.facts, d.facts if d else None)
    for a in (t, d) if d else (t,):  # the drafter runs at the same TP as its target
        parallel.check_split(a, tp)
    top = prompt_len + 1 + max(budgets, default=0)
    if t.max_positions and top > t.max_positions:
        raise ValueError(f"prompt_len + 1 + max budget = {top} exceeds max_position_embeddings {t.max_positions}")
    if draft_context is None:
        draft_context = d.draft["block_size"] if d else 0
    families.integer(draft_context, "draft_context", least=0)
    settings = {"batch": batch, "prompt_len": prompt_len, "dtype": dtype, "dtype_bytes": e,
                "budgets": budgets, "draft_context": int(draft_context), "tp": tp, "interconnect": link,
                "overhead_s": overhead_s, "engine": engine, "graph": graph, "machinery": tree_machinery,
                "weight_bits": weight_bits}
    table = CostTable(t, g, settings, draft=d)
    table.rows = ([table.forward("EXTEND"), table.forward("DECODE")]
                  + [table.forward("TARGET_VERIFY", B) for B in budgets]
                  + ([table.forward("DRAFT")] if d else []))
    table.notes = [
        "FLOPs as FlopCounterMode counts them: matmuls (2 per multiply-add) and attention over every key, mask "
        "not subtracted; bytes: weights once per forward (MoE: experts the batch touches, balanced routing), "
        "KV read + written, recurrent state, embedding rows, logits; activations left out",
        f"roofline on {g.name}: {g.flops / 1e12:.0f} TFLOP/s, {g.bandwidth / 1e12:.2f} TB/s; seconds = max(compute, "
        "memory); a real kernel reaches a fraction of either peak, and launch overhead is not modelled",
        f"TARGET_VERIFY(B): 1 + B tokens per request, logits on every row; free budget: verify <= "
        f"{FREE_FACTOR}x DECODE",
    ]
    if tp > 1:
        table.notes.append(f"TP{tp} over {link.name} ({link.bandwidth / 1e9:.0f} GB/s bus, {link.latency * 1e6:.1f} us per "
                           "ring step): per-GPU time = roofline of 1/TP of FLOPs and weights (K/V by heads) + two "
                           "ring all-reduces of the hidden states per layer + the logits' all-gather")
    if t.family in FAMILY_NOTES:
        table.notes.append(FAMILY_NOTES[t.family])
    if engine is not None:
        share, level = tree_machinery.share(engine, graph)
        table.notes.append(f"tree machinery ({engine}, {graph}): {share:.3f} of a tree cycle's step, from the {level} "
                           "fit on the public figures (workbench.shapes.machinery); a chain pays none")
    if d is not None:
        table.notes.append(f"DRAFT: the DFlash block ({d.draft['block_size']} tokens) after {draft_context} new "
                           f"context rows; it reads the target's LM head for {d.draft['block_size'] - 1} rows")
    return table


# ------------------------------------------------------------------------------------------- predicted speedup
@dataclass
class Speedup:
    """Predicted DDTree speedup over AR per budget on one roofline."""

    rows: list  # {budget, tau, verify_s, draft_s, machinery_s, cycle_s, tokens_per_s, speedup}
    decode_s: float
    settings: dict
    notes: list = field(default_factory=list)

    @property
    def best(self) -> dict:
        """The DDTree row with the highest predicted speedup (the smaller budget on a tie)."""
        return max((r for r in self.rows if r.get("policy", "DDTree") == "DDTree"),
                   key=lambda r: (r["speedup"], -r["budget"]))

    def __repr__(self) -> str:
        s = self.settings
        lines = [f"predicted speedup ({s['model']} on {s['gpu']}, batch {s['batch']}, prompt {s['prompt_len']}): "
                 f"best DDTree({self.best['budget']}) at {self.best['speedup']:.2f}x AR",
                 f"  {'policy':<7}{'budget':>6} {'tau':>6} {'verify us':>10} {'draft us':>9} {'tok/s':>10} {'speedup':>8}"]
        for r in self.rows:
            lines.append(f"  {r.get('policy', 'DDTree'):<7}{r['budget']:>6} {r['tau']:>6.2f} {r['verify_s'] * 1e6:>10.1f} {r['draft_s'] * 1e6:>9.1f} "
                         f"{r['tokens_per_s']:>10.0f} {r['speedup']:>7.2f}x")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(repr(self))}</pre>"


def _taus(acceptance, budgets) -> dict[int, float]:
    if hasattr(acceptance, "tau_at") and hasattr(acceptance, "max_budget"):  # wb.analysis.BudgetNeeded
        if budgets is None:
            from workbench.analysis.budget import default_budgets

            budgets = default_budgets(acceptance.max_budget)
        return {int(B): float(acceptance.tau_at(int(B))) for B in budgets}
    if isinstance(acceptance, Mapping):
        taus = {}
        for B, t in acceptance.items():
            try:
                B = operator.index(B)  # ints (numpy's too); not 16.5, "16" or True
                if isinstance(B, bool) or B < 0:
                    raise TypeError
            except TypeError:
                raise ValueError(f"acceptance budget {B!r} must be a non-negative integer") from None
            if isinstance(t, bool) or not isinstance(t, Real) or not math.isfinite(t):
                raise ValueError(f"acceptance tau {t!r} at budget {B} must be a finite number")
            if t > B + 1:
                raise ValueError(f"acceptance tau {t} at budget {B} is above {B + 1}: a cycle commits at most "
                                 "its tree's nodes plus the bonus token")
            taus[B] = float(t)
        if budgets is not None:
            missing = [B for B in budgets if B not in taus]
            if missing:
                raise ValueError(f"no tau for budgets {missing}; acceptance has {sorted(taus)}")
            taus = {B: taus[B] for B in budgets}
        bad = {B: t for B, t in taus.items() if not t >= 1.0}
        if bad:
            raise ValueError(f"tau {bad} below 1: tau counts the bonus token, so every cycle commits at least 1")
        return taus
    raise TypeError(f"acceptance must be {{budget: tau}} or wb.analysis.budget_needed(trace), "
                    f"got {type(acceptance).__name__}")


def speedup(table: CostTable, acceptance, budgets: Sequence[int] | None = None, overhead_s: float | None = None,
            dflash_tau: float | None = None) -> Speedup:
    """DDTree's predicted speedup over AR at each budget: a cycle commits tau(B) tokens per request for one
    drafter forward and one TARGET_VERIFY(B); AR commits 1 per DECODE forward. ``acceptance``: {budget: tau}
    (from a sweep) or ``wb.analysis.budget_needed(trace)``; ``overhead_s``: per-cycle time outside the forwards
    (default: the table's). ``dflash_tau``: linear DFlash's tau (same drafter, the chain of block_size - 1
    drafted tokens): adds its row (policy "DFlash") and each DDTree row's ``vs_dflash``."""
    taus = _taus(acceptance, budgets)
    if not taus:
        raise ValueError("acceptance holds no budgets")
    overhead_s = table.settings.get("overhead_s", 0.0) if overhead_s is None else _seconds(overhead_s, "overhead_s")
    dec = table.decode["seconds"]
    b = table.settings["batch"]

    def row(policy, B, tau):
        c = table.cycle_seconds(B, overhead_s, tree=policy != "DFlash")
        return {"policy": policy, "budget": B, "tau": tau, "verify_s": c["verify_s"], "draft_s": c["draft_s"],
                "overhead_s": overhead_s, "machinery_s": c["machinery_s"], "cycle_s": c["cycle_s"],
                "tokens_per_s": b * tau / c["cycle_s"], "speedup": tau * dec / c["cycle_s"]}

    rows = [row("DDTree", B, tau) for B, tau in sorted(taus.items())]
    if dflash_tau is not None:
        chain = table.chain_budget
        (tau,) = _taus({chain: dflash_tau}, None).values()
        ref = row("DFlash", chain, tau)
        for r in rows:
            r["vs_dflash"] = r["speedup"] / ref["speedup"]
        rows.append(ref)
    notes = [f"AR: {b / dec:.0f} tok/s ({dec * 1e6:.1f} us per DECODE forward); roofline times, no launch overhead"]
    if table.draft is None:
        notes.append("no draft_config: the drafter's forward is costed as 0 s (an upper bound)")
    settings = {"model": table.target.name, "gpu": table.gpu.name, "batch": b,
                "prompt_len": table.settings["prompt_len"], "overhead_s": overhead_s}
    return Speedup(rows, dec, settings, notes)
