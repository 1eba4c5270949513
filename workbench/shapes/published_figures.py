"""Every public tree-vs-chain figure, as data: what each source published (model, hardware, batch, CUDA graphs or
eager, the acceptance tau of the tree and of the arm it was compared with, the speedup), which inputs it lacks
and what is assumed in their place, and the configs of models the workbench does not ship that they need.
``workbench.shapes.published`` prices each with the cost model; docs/published-figures.md cites each source.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench.shapes import families, machinery


# ------------------------------------------------------------------------------------ configs not shipped
# Published config.json values (text model only); the cost model reads nothing else. Shipped configs
# (workbench/configs) are named by string below.


def _qwen3(hidden, intermediate, layers, heads, kv_heads, tied, name) -> dict:
    return {"_name": name, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
            "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": 128,
            "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": tied, "hidden_act": "silu", "attention_bias": False}


def _qwen35(hidden, intermediate, layers, heads, value_heads, tied, name) -> dict:
    """A Qwen3.5/3.6 dense hybrid: three GatedDeltaNet layers then one gated full-attention layer, repeated."""
    text = {"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": hidden,
            "intermediate_size": intermediate, "num_hidden_layers": layers,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
            "full_attention_interval": 4, "num_attention_heads": heads, "num_key_value_heads": 4, "head_dim": 256,
            "attn_output_gate": True, "linear_num_key_heads": 16, "linear_num_value_heads": value_heads,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
            "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
            "tie_word_embeddings": tied, "hidden_act": "silu"}
    return {"_name": name, "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": tied, "text_config": text}


# Qwen/Qwen3-0.6B, Qwen3-4B, Qwen3-32B config.json (hidden, intermediate, layers, heads, K/V heads; head_dim
# 128, vocabulary 151936); the 0.6B and 4B tie their embeddings.
QWEN3_0_6B = _qwen3(1024, 3072, 28, 16, 8, True, "Qwen3-0.6B")
QWEN3_4B = _qwen3(2560, 9728, 36, 32, 8, True, "Qwen3-4B")
QWEN3_32B = _qwen3(5120, 25600, 64, 64, 8, False, "Qwen3-32B")
# Qwen/Qwen3.5-4B text_config: hidden 2560, 32 layers, intermediate 9216, 16 heads / 4 K/V heads of 256,
# linear attention 16 key / 32 value heads of 128, tied embeddings, vocabulary 248320.
QWEN35_4B = _qwen35(2560, 9216, 32, 16, 32, True, "Qwen3.5-4B")
# Qwen/Qwen3.5-27B text_config (Qwen3.6-27B and Qwen3.8-27B ship the same text layout): hidden 5120, 64 layers,
# intermediate 17408, 24 heads / 4 K/V heads of 256, linear attention 16 key / 48 value heads of 128.
QWEN35_27B = _qwen35(5120, 17408, 64, 24, 48, False, "Qwen3.5/3.6/3.8-27B")


def evenly_spaced_layers(target_layers: int, count: int) -> list[int]:
    """Target layers a DFlash drafter reads: ``count`` ids evenly spaced from 1 to L - 3 (L // 2 for one), the
    rule z-lab's drafters follow (qwen3-8b-dflash-b16.json lists [1, 9, 17, 25, 33] for 36 layers)."""
    if count == 1:
        return [target_layers // 2]
    return [round(1 + i * (target_layers - 4) / (count - 1)) for i in range(count)]


def dflash_drafter(target, layers: int, block_size: int, name: str) -> dict:
    """A DFlash drafter for ``target`` in the z-lab layout (a Qwen3 config sharing the target's width and
    vocabulary). Only ``layers`` and ``block_size`` come from the sources; the attention and MLP widths are
    assumed (heads = hidden / 128, 8 K/V heads, intermediate 3 x hidden): no drafter below publishes its own.
    In a tree-vs-chain pair both arms run the same drafter forward, so this only dilutes the verify."""
    cfg = families.load_config(target)
    text = cfg.get("text_config", cfg)
    hidden, n_target = text["hidden_size"], text["num_hidden_layers"]
    ids = evenly_spaced_layers(n_target, layers)
    return {"_name": name, "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "vocab_size": text["vocab_size"], "hidden_size": hidden, "intermediate_size": 3 * hidden,
            "num_hidden_layers": layers, "num_attention_heads": hidden // 128, "num_key_value_heads": 8,
            "head_dim": 128, "max_position_embeddings": text.get("max_position_embeddings", 40960),
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
            "attention_bias": False, "num_target_layers": n_target, "block_size": block_size,
            "dflash_config": {"block_size": block_size, "target_layer_ids": ids}}


# Bits per weight of each quantized format, scales included, for the target's layer matmuls (experts too); the
# K/V cache, activations, embedding and LM head stay bf16 (AWQ, NVFP4 and the GGUF K-quant mixes keep the head wide).
AWQ_INT4 = (4.25, "INT4 (AWQ) layer weights costed at 4.25 bits (4 + group-128 scales and zeros), head and K/V bf16")
NVFP4 = (4.5, "NVFP4 layer weights costed at 4.5 bits (4 + an fp8 scale per 16), head and K/V bf16")
MQ4 = (4.5, "MQ4 layer weights costed at 4.5 bits (4 + a 16-bit scale per 32 assumed), head and K/V bf16")
Q4_K_M = (4.85, "Q4_K_M layer weights costed at 4.85 bits (llama.cpp's average for the mix), head and K/V bf16")
Q5_K = (5.5, "Q5_K_XL layer weights costed at 5.5 bits (Q5_K), head and K/V bf16")
MLX_4BIT = (4.5, "MLX 4-bit layer weights costed at 4.5 bits (group 64, bf16 scale and bias), head and K/V bf16")


DRAFTER_WIDTHS = "drafter widths assumed (Qwen3 layout: heads = hidden/128, 8 K/V heads, intermediate 3 x hidden)"


# ------------------------------------------------------------------------------------------------- figures
@dataclass(frozen=True)
class Arm:
    """One side of a published comparison. ``budget``: tree nodes besides the root verified per step (a chain
    of k drafted tokens has budget k); None for plain autoregressive decoding. ``tau``: tokens committed per
    step and request, bonus included (AR: 1); None when the source does not publish it."""

    label: str
    budget: int | None
    tau: float | None
    tree: bool = False  # a reference arm that is itself a tree pays the tree machinery too


@dataclass(frozen=True)
class Figure:
    """One public figure: a tree arm against a reference arm (a chain, AR, or another tree) and the speedup
    the source published for it (the tree's tokens/s over the reference's)."""

    key: str
    source: str  # who published it and where (repository, file or thread, section)
    url: str | None  # its public address; None only for a report that is not public (the source says so)
    model: str
    hardware: str
    batch: int
    mode: str  # CUDA graphs, eager, or what the engine is when neither applies
    tree: Arm
    ref: Arm
    published: float
    published_as: str  # the figure as the source states it
    target: object  # config dict or shipped config name
    gpu: str  # a name in workbench/shapes/gpus.json
    prompt_len: int  # context tokens at verify
    draft: object = None  # DFlash drafter config, or None when the drafter is not costed
    dtype: str = "bfloat16"
    weight_bits: float | None = None  # bits per weight of a quantized target's layers, scales included
    tp: int = 1
    interconnect: str = "nvlink"
    ref_step_s: float | None = None  # the reference arm's published seconds per step (calibrates overhead)
    ref_speedup_vs_ar: float | None = None  # or: its published speedup over AR (with ref.tau)
    calibration: str = ""  # where the reference arm's time comes from
    tree_machinery: str = ""  # tree-only per-step time the source itemizes, as it states it
    assumed: tuple = ()  # each input the source lacks and what stands in for it
    alt_budgets: tuple = ()  # other tree budgets to predict at, where the budget itself is assumed
    sweep: tuple = ()  # the budgets swept, where the source publishes only the best one's figure (the tree's
    # budget is then chosen by workbench.shapes.published.best_of_sweep, and tree.budget is a placeholder)
    engine: str = ""  # the engine kind: vllm, transformers, ggml, hipfire, mlx (what the machinery term keys on)
    graph: str = ""  # graphs (CUDA graphs), eager (Python dispatch per op) or compiled (a compiled host loop)
    tree_steps: float = 1.0  # share of steps that build and verify a tree, where the source says fewer do
    origin: str = ""  # who measured it, when the address alone does not say (one paper, two addresses)

    def __post_init__(self):
        if self.graph not in (*machinery.GRAPH_MODES, machinery.NOT_PUBLISHED):
            raise ValueError(f"{self.key}: graph {self.graph!r} is not one of {', '.join(machinery.GRAPH_MODES)}")
        if not self.engine.strip():
            raise ValueError(f"{self.key}: every figure names its engine kind")
        if not 0 < self.tree_steps <= 1:
            raise ValueError(f"{self.key}: tree_steps {self.tree_steps} is a share of steps in (0, 1]")
        for arm in (self.tree, self.ref):
            if arm.tau is not None and arm.budget is not None and not 1 <= arm.tau <= arm.budget + 1:
                raise ValueError(f"{self.key}: {arm.label} tau {arm.tau} outside [1, budget + 1 = {arm.budget + 1}]")
            if arm.budget is None and arm.tau not in (None, 1, 1.0):
                raise ValueError(f"{self.key}: {arm.label} is AR (no budget), so its tau is 1, not {arm.tau}")
        if not self.source.strip():
            raise ValueError(f"{self.key}: every figure names its source")
        if self.url is None and "not public" not in self.source:
            raise ValueError(f"{self.key}: a figure without an address says its source is not public")
        if self.url is not None and not self.url.startswith("https://"):
            raise ValueError(f"{self.key}: a source's address is https://..., not {self.url!r}")
        if self.ref_step_s is not None and self.ref_speedup_vs_ar is not None:
            raise ValueError(f"{self.key}: calibrate on the reference arm's step time or its speedup, not both")


def origin_of(fig: Figure) -> str:
    """Who measured ``fig``: its ``origin``, else the GitHub repository its address names, else its address or
    source. Leave-one-source-out holds out every figure of one origin at once."""
    if fig.origin:
        return fig.origin
    if fig.url and fig.url.startswith("https://github.com/"):
        return "/".join(fig.url.split("/")[3:5])
    return fig.url or fig.source


RMAGUR = "https://github.com/rmagur1203/vllm-ddtree/blob/ddtree-multireq/docs/DDTREE-FINDINGS-EN.md"
RMAGUR_LOG = "https://github.com/rmagur1203/vllm-ddtree/blob/ddtree-multireq/docs/DDTREE-SCOPING.md"
PATRICK = "https://github.com/patrickbdevaney/dflash-caddtree-integrations/blob/main/docs/DDTREE.md"
PATRICK_SWEEP = ("https://github.com/patrickbdevaney/dflash-caddtree-integrations/blob/main/"
                 "benchmark_results/b-sweep-crossover.md")
HIPFIRE = "https://github.com/warpfront/hipfire/pull/149"
UNSLOTH = "https://github.com/unslothai/llama.cpp/pull/224"
MLX = "https://github.com/humanrouter/ddtree-mlx"
LUCEBOX = "https://github.com/Luce-Org/lucebox/pull/86"
HXRI = "https://github.com/hxri/ddtreeplus/blob/main/BLOG_dynamic_tree_negative_result.md"
PATRICK_STAGED = ("https://github.com/patrickbdevaney/dflash-caddtree-integrations/blob/"
                  "bf6a120001a2977b5519f325ca9d0892b0f1203a/benchmark_results/staged-optimization-final.md")
HIPFIRE_QWEN36 = ("https://github.com/warpfront/hipfire/blob/889a2d9a6b51041592145c7ef34bd55dc306c0f3/"
                  "findings/path-c-qwen36.md")
PAPER_TABLE = ("https://github.com/liranringel/ddtree/blob/0037aec6de4d4d7f68828a5073c1ab300913792c/"
               "src/data/results.tex")
PAPER = "https://arxiv.org/abs/2604.12989"
AUTOBENCH = "https://github.com/gauravmm/autobench/blob/bcdbc7e1040a34db36435edddad2e20af7441709/_configs/"
PAPER_ORIGIN = "DDTree paper (arXiv 2604.12989)"
PAPER_SWEEP = (16, 32, 64, 128, 256, 512, 1024)  # the paper's budgets; each cell reports the fastest
BEST_OF_SWEEP = ("the best budget per cell is not published: the largest of 16-1024 whose verify the roofline "
                 "prices free (<= 1.1x DECODE), else 16 (tau grows slowly with the budget, a verify past that "
                 "knee linearly)")

_QWEN35_4B_DRAFT = dflash_drafter(QWEN35_4B, 6, 16, "Qwen3.5-4B DFlash (6 layers, block 16)")
_QWEN38_27B_DFLASH2 = dflash_drafter(QWEN35_27B, 5, 8, "Qwen3.8-27B DFlash2 (5 layers, block 8)")
_QWEN35_27B_DRAFT = dflash_drafter(QWEN35_27B, 5, 16, "Qwen3.5/3.6-27B DFlash (5 layers, block 16)")
_QWEN36_A3B_DRAFT = dflash_drafter("qwen3.6-35b-a3b", 5, 16, "Qwen3.6-35B-A3B DFlash (5 layers, block 16)")
_QWEN3_4B_DRAFT = dflash_drafter(QWEN3_4B, 5, 16, "Qwen3-4B-DFlash-b16 (5 layers, block 16)")

_EAGLE3 = ("EAGLE3 drafter not costed (no DFlash layout): its 3 forwards per step, the same in both arms, sit "
           "in the overhead set from the chain's step time")
_RMAGUR_8B_PROMPT = "context not published: 200 tokens assumed (6 open-ended prompts, 192 generated)"
# Batch-16 chain step 34.17 ms and batch-1 30.00 ms (§41); batches 2 and 4 interpolated linearly between them.
_RMAGUR_8B_STEP = {1: 30.08e-3, 2: 30.00e-3 + (34.17e-3 - 30.00e-3) * 1 / 15,
                   4: 30.00e-3 + (34.17e-3 - 30.00e-3) * 3 / 15, 16: 34.17e-3}


def _rmagur_8b_batch(batch: int, tree_budget: int, accept_ratio: float, chain_s: float, tree_s: float,
                     machinery: str) -> Figure:
    """rmagur1203's Qwen3-8B + EAGLE3 batch rows (§41): the source publishes the acceptance ratio tree/chain,
    the chain's tau only at batch 1 (1.498), and both arms' seconds for the same output."""
    chain_tau = 1.498
    step_note = ("chain step published (34.17 ms, §41-3)" if batch == 16 else
                 "chain step at this batch not published: interpolated between batch 1 (30.00 ms) and 16 (34.17 ms)")
    return Figure(
        key=f"rmagur-8b-eagle3-b{batch}", engine="vllm", graph="graphs",
        source="rmagur1203/vllm-ddtree, DDTREE-SCOPING.md §41 (findings §1)",
        url=RMAGUR_LOG, model="Qwen3-8B + EAGLE3 (3 draft steps)", hardware="1 of 2x RTX A6000", batch=batch,
        mode="CUDA graphs (vLLM V2)", tree=Arm(f"DDTree depth 3, budget {tree_budget}", tree_budget,
                                              round(chain_tau * accept_ratio, 3)),
        ref=Arm("EAGLE3 chain (3)", 3, chain_tau), published=chain_s / tree_s,
        published_as=f"{chain_s:.2f} s vs {tree_s:.2f} s for the same 192 tokens x {batch}; acceptance x{accept_ratio}",
        target="qwen3-8b", gpu="RTX A6000", prompt_len=200, ref_step_s=_RMAGUR_8B_STEP[batch],
        calibration=step_note, tree_machinery=machinery,
        assumed=(_RMAGUR_8B_PROMPT, _EAGLE3, f"chain tau at batch {batch} not published: batch 1's 1.498 assumed "
                 f"(only the ratio {accept_ratio} enters the prediction)"))


def _rmagur_27b_superset(siblings: int, budget: int, tau: float, tree_ms: float) -> Figure:
    """rmagur1203's superset trees on the 27B hybrid (findings §8): the DFlash2 chain of 7 (3.200 tokens and
    43.35 ms per step) against its spine plus siblings, each arm's tokens and milliseconds per step published."""
    return Figure(
        key=f"rmagur-27b-superset-b{budget}", engine="vllm", graph="graphs",
        source="rmagur1203/vllm-ddtree, DDTREE-FINDINGS-EN.md §8 (superset trees)", url=RMAGUR,
        model="Qwen3.8-27B-AWQ-INT4 hybrid + DFlash2", hardware="1 of 2x RTX A6000", batch=1,
        mode="CUDA graphs (vLLM V2)",
        tree=Arm(f"spine 7 + {siblings} sibling{'s' if siblings > 1 else ''}", budget, tau),
        ref=Arm("DFlash2 chain (7)", 7, 3.200), published=(tau / tree_ms) / (3.200 / 43.35),
        published_as=f"{tau} vs 3.200 tokens/step at {tree_ms} vs 43.35 ms/step (6 prompts x 192 tokens)",
        target=QWEN35_27B, draft=_QWEN38_27B_DFLASH2, gpu="RTX A6000", prompt_len=200, weight_bits=AWQ_INT4[0],
        ref_step_s=43.35e-3, calibration="chain 43.35 ms/step (published)",
        tree_machinery="above 8 query tokens the fused GDN kernel falls back to a Triton path: +7 ms (§10)"
        if budget > 7 else "",
        assumed=(AWQ_INT4[1],
                 "Qwen3.8-27B costed with the Qwen3.5-27B text layout (the same published widths)",
                 "context not published: 200 tokens assumed (6 prompts, 192 generated)", DRAFTER_WIDTHS))


def _paper_humaneval(model: str, target, draft, dflash: tuple, ddtree: tuple) -> Figure:
    """The DDTree paper's Table 1, HumanEval at T=0, for one target: (speedup over AR, tau) of each arm."""
    return Figure(
        key=f"ddtree-paper-{model.lower()}", engine="transformers", graph="eager", origin=PAPER_ORIGIN,
        source="DDTree paper (Ringel & Romano), Table 1, HumanEval T=0 (the project site's results.tex)",
        url=PAPER_TABLE, model=f"{model} + DFlash-b16", hardware="1 of 8x H200 (data parallel)", batch=1,
        mode="eager (HF transformers, SDPA target)", tree=Arm("DDTree (best of 16-1024)", 1024, ddtree[1]),
        ref=Arm("DFlash chain (15)", 15, dflash[1]), published=ddtree[0] / dflash[0],
        published_as=f"{ddtree[0]}x vs {dflash[0]}x AR, tau {ddtree[1]} vs {dflash[1]}",
        target=target, draft=draft, gpu="H200", prompt_len=512, ref_speedup_vs_ar=dflash[0],
        calibration=f"DFlash {dflash[0]}x AR with tau {dflash[1]} (published)",
        sweep=PAPER_SWEEP, assumed=(BEST_OF_SWEEP, "context not published: 512 tokens assumed (HumanEval, up "
                                    "to 2048 generated)", *((DRAFTER_WIDTHS,) if isinstance(draft, dict) else ())))


def _autobench(workload: str, page: str, budget: int, chain: tuple, tree: tuple, prompt_len: int) -> Figure:
    """gauravmm/autobench's runs of the DDTree paper's own harness on a DGX Spark: Qwen3-Coder-30B-A3B bf16 at
    batch 1, the DFlash chain and DDTree at budgets 64 and 256 on the same prompts: (decode tok/s, accept-len)."""
    return Figure(
        key=f"autobench-{workload.lower()}-b{budget}", engine="transformers", graph="eager",
        source=f"gauravmm/autobench, _configs/{page}.md ({workload})", url=f"{AUTOBENCH}{page}.md",
        model="Qwen3-Coder-30B-A3B (MoE) + DFlash", hardware="DGX Spark (GB10)", batch=1,
        mode="eager (the DDTree paper's harness, SDPA target)", tree=Arm(f"DDTree({budget})", budget, tree[1]),
        ref=Arm("DFlash chain (15)", 15, chain[1]), published=tree[0] / chain[0],
        published_as=f"{tree[0]} vs {chain[0]} tok/s, accept-len {tree[1]} vs {chain[1]} ({workload}, 12 prompts)",
        target="qwen3-coder-30b-a3b", draft="qwen3-coder-30b-a3b-dflash", gpu="DGX Spark (GB10)",
        prompt_len=prompt_len, ref_step_s=chain[1] / chain[0],
        calibration=f"chain {chain[1]} / {chain[0]} tok/s = {chain[1] / chain[0] * 1e3:.0f} ms/step (published)",
        assumed=(f"context not published: {prompt_len} tokens assumed ({workload} prompts, up to 256 generated)",))


FIGURES: tuple = (
    Figure(
        key="rmagur-4b-graphs", engine="vllm", graph="graphs",
        source="rmagur1203/vllm-ddtree, DDTREE-FINDINGS-EN.md §2 (DDTREE-SCOPING.md §23)",
        url=RMAGUR, model="Qwen3.5-4B hybrid + DFlash", hardware="1 of 2x RTX A6000", batch=1,
        mode="CUDA graphs (vLLM V1)", tree=Arm("DDTree(16)", 16, round(128 / 34, 3)),
        ref=Arm("DFlash chain (15)", 15, round(128 / 34, 3)), published=99.1 / 144.9,
        published_as="99.1 vs 144.9 tok/s, 34 steps each for 128 tokens (0.68x)",
        target=QWEN35_4B, draft=_QWEN35_4B_DRAFT, gpu="RTX A6000", prompt_len=96, ref_step_s=26.28e-3,
        calibration="chain 26.28 ms/step (published)",
        tree_machinery="+11.63 ms: 2.6 ms host + ~9 ms GPU (compaction, tree GDN, mask) (§23-3)",
        assumed=("tau = 128 tokens / 34 steps in both arms (the source counts steps)",
                 "context not published: 96 tokens assumed (short factual prompts, 128 generated)",
                 "weights bf16 assumed", DRAFTER_WIDTHS)),
    Figure(
        key="rmagur-4b-eager", engine="vllm", graph="eager",
        source="rmagur1203/vllm-ddtree, DDTREE-FINDINGS-EN.md §2 (DDTREE-SCOPING.md §23)",
        url=RMAGUR, model="Qwen3.5-4B hybrid + DFlash", hardware="1 of 2x RTX A6000", batch=1,
        mode="eager (vLLM V1)", tree=Arm("DDTree(16)", 16, round(128 / 33, 3)),
        ref=Arm("DFlash chain (15)", 15, round(128 / 34, 3)), published=70.7 / 70.9,
        published_as="70.7 vs 70.9 tok/s, 33 vs 34 steps for 128 tokens",
        target=QWEN35_4B, draft=_QWEN35_4B_DRAFT, gpu="RTX A6000", prompt_len=96, ref_step_s=53.21e-3,
        calibration="chain 53.21 ms/step (published)",
        tree_machinery="+0.76 ms: the same 2.65 ms of host work, mostly hidden in launch gaps (§23-3)",
        assumed=("tau = 128 tokens / steps (33 tree, 34 chain)",
                 "context not published: 96 tokens assumed (short factual prompts, 128 generated)",
                 "weights bf16 assumed", DRAFTER_WIDTHS)),
    Figure(
        key="rmagur-8b-eagle3-b1", engine="vllm", graph="graphs",
        source="rmagur1203/vllm-ddtree, DDTREE-SCOPING.md §35-§44 (findings §1)",
        url=RMAGUR_LOG, model="Qwen3-8B + EAGLE3 (3 draft steps)", hardware="1 of 2x RTX A6000", batch=1,
        mode="CUDA graphs (vLLM V2)", tree=Arm("DDTree depth 3, budget 16", 16, 1.761),
        ref=Arm("EAGLE3 chain (3)", 3, 1.498), published=23.29 / 23.28,
        published_as="median 23.28 s vs 23.29 s, n = 10 (a tie, p = 0.34)",
        target="qwen3-8b", gpu="RTX A6000", prompt_len=200, ref_step_s=30.08e-3,
        calibration="chain 30.08 ms/step (published, §35-6)",
        tree_machinery="3.00 ms: topk 0.66, mask kernel 0.70, compaction 0.27, accept 0.22, rest 1.09 (§38-4)",
        assumed=(_RMAGUR_8B_PROMPT, _EAGLE3)),
    _rmagur_8b_batch(2, 8, 1.114, 4.15, 4.25, ""),
    _rmagur_8b_batch(4, 8, 1.154, 4.39, 4.52, ""),
    _rmagur_8b_batch(16, 4, 1.160, 5.19, 5.43, "3.97 ms per step at batch 16 (per-request host work, §41-3)"),
    Figure(
        key="rmagur-27b-dflash2", engine="vllm", graph="graphs",
        source="rmagur1203/vllm-ddtree, DDTREE-FINDINGS-EN.md §1, §4-§5 (SCOPING §42)",
        url=RMAGUR, model="Qwen3.8-27B-AWQ-INT4 hybrid + DFlash2", hardware="1 of 2x RTX A6000", batch=1,
        mode="CUDA graphs (vLLM V2)", tree=Arm("DDTree(7)", 7, 3.097), ref=Arm("DFlash2 chain (7)", 7, 3.200),
        published=0.78, published_as="0.78x (63.55 ms/step less the 9.77 ms fixed, vs 43.34; tau 3.097 vs 3.200)",
        target=QWEN35_27B, draft=_QWEN38_27B_DFLASH2, gpu="RTX A6000", prompt_len=200, weight_bits=AWQ_INT4[0],
        ref_step_s=43.34e-3, calibration="chain 43.34 ms/step (published)",
        tree_machinery="9.93 ms: 17.99 integration - 9.77 fixed + 1.71 mask (§4); the tree shape itself 0.51",
        assumed=(AWQ_INT4[1],
                 "Qwen3.8-27B costed with the Qwen3.5-27B text layout (the same published widths)",
                 "context not published: 200 tokens assumed (6 prompts, 192 generated)", DRAFTER_WIDTHS)),
    Figure(
        key="rmagur-0.6b-ngram", engine="vllm", graph="graphs",
        source="rmagur1203/vllm-ddtree, DDTREE-SCOPING.md §24-§26 (findings §1)",
        url=RMAGUR_LOG, model="Qwen3-0.6B + n-gram", hardware="1 of 2x RTX A6000", batch=1,
        mode="CUDA graphs (vLLM V1)", tree=Arm("DDTree depth 16, budget 16", 16, round(384 / 184, 3)),
        ref=Arm("n-gram chain (15)", 15, round(384 / 193, 3)), published=1.217 / 1.282,
        published_as="1.282 s vs 1.217 s for 4 prompts; 184 vs 193 steps (0.95x)",
        target=QWEN3_0_6B, gpu="RTX A6000", prompt_len=128, ref_step_s=1.217 / 193, tree_steps=0.28,
        calibration="chain 1.217 s / 193 steps = 6.31 ms/step (published)",
        assumed=("tau from the step counts 184 and 193 for one output: 384 tokens (4 x 96) assumed; only the "
                 "ratio enters", "the n-gram drafter has no forward: none is costed",
                 "context not published: 128 tokens assumed", "72% of steps draft nothing (the source): both "
                 "arms are costed as if every step verified its full width")),
    Figure(
        key="patrick-thor", engine="vllm", graph="graphs",
        source="patrickbdevaney/dflash-caddtree-integrations, docs/DDTREE.md §7", url=PATRICK,
        model="Qwen3.6-35B-A3B-NVFP4 (MoE hybrid) + DFlash", hardware="Jetson AGX Thor", batch=1,
        mode="CUDA graphs (vLLM fork)", tree=Arm("DDTree W=2, 13 nodes with the root", 12, 5.70), ref=Arm("DFlash chain (12)", 12, 5.75),
        published=56.23 / 78.0, published_as="56.23 vs 78.0 tok/s, tau 5.70 vs 5.75 (0.72x)",
        target="qwen3.6-35b-a3b", draft=_QWEN36_A3B_DRAFT, gpu="Jetson AGX Thor", prompt_len=128, weight_bits=NVFP4[0],
        ref_step_s=5.75 / 78.0, calibration="chain 5.75 / 78.0 tok/s = 73.7 ms/step (published)",
        tree_machinery="~20% per step: per-branch GDN, eager attention, host tree ops (staged-optimization-final.md)",
        assumed=(NVFP4[1],
                 "context not published: 128 tokens assumed (5 coding prompts, 128 generated)",
                 "drafter: 5 layers and block 16 assumed (num_speculative_tokens=12 verified)", DRAFTER_WIDTHS)),
    Figure(
        key="patrick-depth-breadth", engine="vllm", graph="eager",
        source="patrickbdevaney/dflash-caddtree-integrations, b-sweep-crossover.md",
        url=PATRICK_SWEEP, model="Qwen3.6-35B-A3B-NVFP4 (MoE hybrid) + DFlash", hardware="Jetson AGX Thor",
        batch=1, mode="eager (vLLM fork)", tree=Arm("spine 12 + ~4 branches, 17 nodes", 16, 4.26),
        ref=Arm("chain, spine 16", 16, 5.82), published=17.45 / 40.42,
        published_as="17.45 vs 40.42 tok/s, tau 4.26 vs 5.82 at the same budget",
        target="qwen3.6-35b-a3b", draft=_QWEN36_A3B_DRAFT, gpu="Jetson AGX Thor", prompt_len=128, weight_bits=NVFP4[0],
        ref_step_s=5.82 / 40.42, calibration="chain 5.82 / 40.42 tok/s = 144 ms/step (published)",
        assumed=(NVFP4[1],
                 "context not published: 128 tokens assumed (5 prompts x 128 tokens)", DRAFTER_WIDTHS)),
    Figure(
        key="hipfire-code", engine="hipfire", graph="compiled",
        source="warpfront/hipfire #149, findings/path-d-vs-path-c.md", url=HIPFIRE,
        model="Qwen3.5-27B MQ4 hybrid + DFlash MQ4", hardware="Radeon RX 7900 XT", batch=1,
        mode="HIP, own engine (graph capture not stated)", tree=Arm("Path C, budget 12, top-2", 12, 8.69),
        ref=Arm("DFlash chain (15)", 15, 8.85), published=138.64 / 153.75,
        published_as="138.64 vs 153.75 tok/s, tau 8.69 vs 8.85 (-10%, code)",
        target=QWEN35_27B, draft=_QWEN35_27B_DRAFT, gpu="Radeon RX 7900 XT", prompt_len=384, weight_bits=MQ4[0],
        ref_step_s=8.85 / 153.75, calibration="chain 8.85 / 153.75 tok/s = 57.6 ms/step (published)",
        assumed=(MQ4[1],
                 "context not published: 384 tokens assumed (an LRU-cache prompt, 120 generated)",
                 "Path C phase 1 verifies the main path first (the source): costed as one verify of 1 + 12",
                 DRAFTER_WIDTHS)),
    Figure(
        key="hipfire-prose", engine="hipfire", graph="compiled",
        source="warpfront/hipfire #149, findings/path-d-vs-path-c.md", url=HIPFIRE,
        model="Qwen3.5-27B MQ4 hybrid + DFlash MQ4", hardware="Radeon RX 7900 XT", batch=1,
        mode="HIP, own engine (graph capture not stated)", tree=Arm("Path C, budget 12, top-2", 12, 11.08),
        ref=Arm("DFlash chain (15)", 15, 13.27), published=177.55 / 228.99,
        published_as="177.55 vs 228.99 tok/s, tau 11.08 vs 13.27 (-22%, prose)",
        target=QWEN35_27B, draft=_QWEN35_27B_DRAFT, gpu="Radeon RX 7900 XT", prompt_len=384, weight_bits=MQ4[0],
        ref_step_s=13.27 / 228.99, calibration="chain 13.27 / 228.99 tok/s = 58.0 ms/step (published)",
        assumed=(MQ4[1],
                 "context not published: 384 tokens assumed (a merge-sort prompt, 256 generated)",
                 "Path C phase 1 verifies the main path first (the source): costed as one verify of 1 + 12",
                 DRAFTER_WIDTHS)),
    Figure(
        key="unsloth-llamacpp", engine="ggml", graph="compiled",
        source="unslothai/llama.cpp #224, examples/speculative-tree/README.md", url=UNSLOTH,
        model="Qwen3-32B Q4_K_M + Qwen3-0.6B draft model", hardware="B200", batch=1,
        mode="llama.cpp CUDA (graph capture not stated)", tree=Arm("top-4, depth 2, 12 nodes", 11, 2.72),
        ref=Arm("linear, depth 2", 2, 2.46), published=74.22 / 91.64,
        published_as="74.22 vs 91.64 tok/s, accepted/step 2.72 vs 2.46 (best tree of 10 shapes)",
        target=QWEN3_32B, gpu="B200", prompt_len=96, weight_bits=Q4_K_M[0], ref_step_s=2.46 * 10.93e-3,
        calibration="chain 10.93 ms/token x 2.46 tokens/step = 26.9 ms/step (published)",
        tree_machinery="verify of 12 nodes 22.4 ms vs 13.1 ms for one token; wider draft batches (README)",
        assumed=(Q4_K_M[1],
                 "the separate Qwen3-0.6B draft model is not costed: its 2 forwards per step sit in the overhead "
                 "set from the chain (the tree's are wider)",
                 "nodes counted with the root (3 nodes = depth 2 linear): tree budget 11",
                 "context not published: 96 tokens assumed (short prompts, 128 generated)")),
    Figure(
        key="ddtree-mlx", engine="mlx", graph="compiled",
        source="humanrouter/ddtree-mlx, README (Performance)", url=MLX,
        model="Qwen3.5-27B 4-bit hybrid + DFlash", hardware="Apple M3 Ultra", batch=1,
        mode="MLX (no graph capture)", tree=Arm("DDTree (budget not published)", 16, 4.2), ref=Arm("AR", None, 1.0),
        published=42.3 / 27.9, published_as="42.3 vs 27.9 tok/s (1.52x AR); DFlash 38.6 tok/s, so 1.10x DFlash",
        target=QWEN35_27B, draft=_QWEN35_27B_DRAFT, gpu="Apple M3 Ultra", prompt_len=4096, weight_bits=MLX_4BIT[0],
        ref_step_s=1 / 27.9, calibration="AR 1 / 27.9 tok/s = 35.8 ms/step (published)",
        assumed=("compared with AR: the DFlash arm's tau is not published ('85%' is an acceptance rate), so the "
                 "headline 1.10x over DFlash cannot be predicted",
                 "tree budget not published: 16 assumed", MLX_4BIT[1],
                 "context: up to 8K generated; 4096 tokens assumed", DRAFTER_WIDTHS),
        alt_budgets=(32, 64)),
    Figure(
        key="lucebox-b22", engine="ggml", graph="compiled",
        source="Luce-Org/lucebox #86, dflash/RESULTS.md (RTX 5090 budget sweep)", url=LUCEBOX,
        model="Qwen3.6-27B Q5_K_XL hybrid + DFlash", hardware="RTX 5090", batch=1,
        mode="own C++/ggml engine (graph capture not stated)", tree=Arm("DDTree(22)", 22, 7.25),
        ref=Arm("DFlash chain (15)", 15, 4.99), published=211.20 / 174.45,
        published_as="211.20 vs 174.45 tok/s, AL 7.25 vs 4.99 (budget 22 best of 15-64; budget 15 is the chain)",
        target=QWEN35_27B, draft=_QWEN35_27B_DRAFT, gpu="RTX 5090", prompt_len=256, weight_bits=Q5_K[0],
        ref_step_s=4.99 / 174.45, calibration="chain 4.99 / 174.45 tok/s = 28.6 ms/step (published)",
        assumed=("the chain is the sweep's budget 15, run on the source's fast K=1 path",
                 Q5_K[1],
                 "context not published: 256 tokens assumed (HumanEval prompts, 128 generated)", DRAFTER_WIDTHS)),
    Figure(
        key="lucebox-b64", engine="ggml", graph="compiled",
        source="Luce-Org/lucebox #86, dflash/RESULTS.md (RTX 5090 budget sweep)", url=LUCEBOX,
        model="Qwen3.6-27B Q5_K_XL hybrid + DFlash", hardware="RTX 5090", batch=1,
        mode="own C++/ggml engine (graph capture not stated)", tree=Arm("DDTree(64)", 64, 7.14),
        ref=Arm("DDTree(16)", 16, 5.76, tree=True), published=148.12 / 176.98,
        published_as="148.12 vs 176.98 tok/s, AL 7.14 vs 5.76",
        target=QWEN35_27B, draft=_QWEN35_27B_DRAFT, gpu="RTX 5090", prompt_len=256, weight_bits=Q5_K[0],
        ref_step_s=5.76 / 176.98, calibration="DDTree(16) 5.76 / 176.98 tok/s = 32.5 ms/step (published)",
        assumed=("a tree against a tree: budget 16 is the reference, as the source compares them (row 15 has the chain)",
                 Q5_K[1],
                 "context not published: 256 tokens assumed", DRAFTER_WIDTHS)),
    Figure(
        key="hxri-ddtree-vs-ar", engine="transformers", graph="eager",
        source="hxri/ddtreeplus, BLOG_dynamic_tree_negative_result.md", url=HXRI,
        model="Qwen3-4B + Qwen3-4B-DFlash-b16", hardware="RTX PRO 6000 Blackwell", batch=1,
        mode="eager (HF transformers, SDPA)", tree=Arm("DDTree(128)", 128, 9.08), ref=Arm("AR", None, 1.0),
        published=5.76, published_as="5.76x AR, acceptance 9.08 (GSM8K, B = 128)",
        target=QWEN3_4B, draft=_QWEN3_4B_DRAFT, gpu="RTX PRO 6000 Blackwell", prompt_len=512,
        calibration="no per-step time published: roofline only",
        assumed=("no chain arm: DDTree is compared with AR", "no step time published: overhead 0",
                 "context not published: 512 tokens assumed (GSM8K, up to 2048 generated)", DRAFTER_WIDTHS)),
    Figure(
        key="hxri-prop-budget", engine="transformers", graph="eager",
        source="hxri/ddtreeplus, BLOG_dynamic_tree_negative_result.md", url=HXRI,
        model="Qwen3-4B + Qwen3-4B-DFlash-b16", hardware="RTX PRO 6000 Blackwell", batch=1,
        mode="eager (HF transformers, SDPA)", tree=Arm("budget-proportional tree", 128, 8.86),
        ref=Arm("DDTree(128), best-first", 128, 9.08, tree=True), published=5.85 / 5.76,
        published_as="5.85x vs 5.76x AR, acceptance 8.86 vs 9.08 (+1.6%, the best of 7 strategies)",
        target=QWEN3_4B, draft=_QWEN3_4B_DRAFT, gpu="RTX PRO 6000 Blackwell", prompt_len=512,
        ref_speedup_vs_ar=5.76, calibration="DDTree(128) 5.76x AR with tau 9.08 (published)",
        assumed=("the budget-proportional tree's node count is not published: 128 (DDTree's) assumed",
                 "context not published: 512 tokens assumed", DRAFTER_WIDTHS)),
    Figure(
        key="ddtree-paper", engine="transformers", graph="eager", origin=PAPER_ORIGIN,
        source="DDTree paper (Ringel & Romano), Table 1, HumanEval T=0; Appendix B", url=PAPER,
        model="Qwen3-Coder-30B-A3B (MoE) + DFlash", hardware="1 of 8x H200 (data parallel)", batch=1,
        mode="eager (HF transformers, SDPA target)", tree=Arm("DDTree (best of 16-1024)", 1024, 10.72),
        ref=Arm("DFlash chain (15)", 15, 8.02), published=8.22 / 6.09,
        published_as="8.22x vs 6.09x AR, tau 10.72 vs 8.02",
        target="qwen3-coder-30b-a3b", draft="qwen3-coder-30b-a3b-dflash", gpu="H200", prompt_len=512,
        ref_speedup_vs_ar=6.09, calibration="DFlash 6.09x AR with tau 8.02 (published)",
        sweep=PAPER_SWEEP, assumed=(BEST_OF_SWEEP, "context not published: 512 tokens assumed (HumanEval, up to "
                                    "2048 generated)"),
        alt_budgets=(64, 256)),
    _rmagur_27b_superset(1, 8, 3.200, 60.77),
    _rmagur_27b_superset(2, 9, 3.329, 62.04),
    _rmagur_27b_superset(5, 12, 3.273, 61.98),
    _rmagur_27b_superset(9, 16, 3.310, 63.23),
    _rmagur_27b_superset(25, 32, 3.282, 72.53),
    Figure(
        key="patrick-thor-typical", engine="vllm", graph="graphs",
        source="patrickbdevaney/dflash-caddtree-integrations, staged-optimization-final.md (Stage 1)",
        url=PATRICK_STAGED, model="Qwen3.6-35B-A3B-NVFP4 (MoE hybrid) + DFlash", hardware="Jetson AGX Thor",
        batch=1, mode="CUDA graphs (vLLM fork), T=0.3", tree=Arm("tree + typical acceptance, B=13", 12, 6.35),
        ref=Arm("linear + typical acceptance (12)", 12, 6.84), published=66.1 / 90.71,
        published_as="66.1 vs 90.71 tok/s, tau 6.35 vs 6.84 (typical acceptance in both arms)",
        target="qwen3.6-35b-a3b", draft=_QWEN36_A3B_DRAFT, gpu="Jetson AGX Thor", prompt_len=128, weight_bits=NVFP4[0],
        ref_step_s=6.84 / 90.71, calibration="linear 6.84 / 90.71 tok/s = 75.4 ms/step (published)",
        tree_machinery="the tree's per-step overhead: per-branch GDN, eager attention, host tree ops (the source)",
        assumed=(NVFP4[1],
                 "context not published: 128 tokens assumed (5 coding prompts x 128 tokens)",
                 "drafter: 5 layers and block 16 assumed (num_spec=12)", DRAFTER_WIDTHS)),
    Figure(
        key="hipfire-qwen36-code", engine="hipfire", graph="compiled",
        source="warpfront/hipfire, findings/path-c-qwen36.md (code)", url=HIPFIRE_QWEN36,
        model="Qwen3.6-27B MQ4 hybrid + DFlash MQ4", hardware="Radeon 8060S (Strix Halo)", batch=1,
        mode="HIP, own engine (graph capture not stated)",
        tree=Arm("Path C phase 1, budget 12, top-2", 12, 5.722),
        ref=Arm("DFlash chain (15)", 15, 5.737), published=34.51 / 36.73,
        published_as="34.51 vs 36.73 tok/s, tau 5.722 vs 5.737 (-6.0%, code)",
        target=QWEN35_27B, draft=_QWEN35_27B_DRAFT, gpu="Radeon 8060S", prompt_len=384, weight_bits=MQ4[0],
        ref_step_s=5.737 / 36.73, calibration="chain 5.737 / 36.73 tok/s = 156 ms/step (published)",
        assumed=(MQ4[1],
                 "context not published: 384 tokens assumed (an LRU-cache prompt, 120 generated)",
                 "Qwen3.6-27B costed with the Qwen3.5-27B text layout", DRAFTER_WIDTHS)),
    Figure(
        key="hipfire-qwen36-prose", engine="hipfire", graph="compiled",
        source="warpfront/hipfire, findings/path-c-qwen36.md (prose)", url=HIPFIRE_QWEN36,
        model="Qwen3.6-27B MQ4 hybrid + DFlash MQ4", hardware="Radeon 8060S (Strix Halo)", batch=1,
        mode="HIP, own engine (graph capture not stated)",
        tree=Arm("Path C phase 1, budget 12, top-2", 12, 9.500),
        ref=Arm("DFlash chain (15)", 15, 9.500), published=65.20 / 69.36,
        published_as="65.20 vs 69.36 tok/s, tau 9.500 in both (-6.0%, prose)",
        target=QWEN35_27B, draft=_QWEN35_27B_DRAFT, gpu="Radeon 8060S", prompt_len=384, weight_bits=MQ4[0],
        ref_step_s=9.5 / 69.36, calibration="chain 9.500 / 69.36 tok/s = 137 ms/step (published)",
        assumed=(MQ4[1],
                 "context not published: 384 tokens assumed (a merge-sort prompt, 169 generated)",
                 "Qwen3.6-27B costed with the Qwen3.5-27B text layout", DRAFTER_WIDTHS)),
    _paper_humaneval("Qwen3-4B", QWEN3_4B, _QWEN3_4B_DRAFT, (4.81, 6.62), (6.81, 9.44)),
    _paper_humaneval("Qwen3-8B", "qwen3-8b", "qwen3-8b-dflash-b16", (4.84, 6.61), (6.90, 9.67)),
    _autobench("HumanEval", "qwen3-coder-30b-a3b-ddtree-humaneval", 64, (47.87, 7.96), (49.34, 9.74), 256),
    _autobench("HumanEval", "qwen3-coder-30b-a3b-ddtree-humaneval", 256, (47.87, 7.96), (41.30, 10.50), 256),
    _autobench("MT-Bench", "qwen3-coder-30b-a3b-ddtree", 64, (16.95, 2.25), (20.75, 3.22), 512),
    _autobench("MT-Bench", "qwen3-coder-30b-a3b-ddtree", 256, (16.95, 2.25), (17.32, 3.69), 512),
    Figure(
        key="users-8x-rtx-pro-6000", engine="not published", graph="not published",
        source="our users' report of a standalone DDTree service (not public; the "
        "project's reference notes, ddtree-in-production.md)", url=None,
        model="not published (Qwen3-8B + DFlash-b16 assumed)", hardware="8x RTX PRO 6000 Blackwell, PCIe",
        batch=1, mode="not published", tree=Arm("DDTree (budget not published)", 64, None),
        ref=Arm("DFlash chain (15)", 15, None), published=1.24,
        published_as="+24% over linear DFlash; best prompt 174.1 tok/s (2.1x)",
        target="qwen3-8b", draft="qwen3-8b-dflash-b16", gpu="RTX PRO 6000 Blackwell", prompt_len=512, tp=8,
        interconnect="pcie5", calibration="no per-step time published",
        assumed=("no acceptance published for either arm: no speedup can be predicted; the tau ratio the model "
                 "needs for +24% is given instead", "model, TP, budget and batch not published: Qwen3-8B + "
                 "DFlash-b16, TP8 over PCIe Gen5, budget 64, batch 1 assumed",
                 "context not published: 512 tokens assumed")),
)
