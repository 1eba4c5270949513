# %% [markdown]
# # 09 · What a verify costs on a GPU: when is a tree free?
#
# **Question.** On a GPU a decode step streams every weight once, and a verify of a few hundred tokens
# streams them once too: up to some size the extra tree nodes ride along for free. Where does a tree
# verify stop being free for Qwen3-8B and Qwen3-Coder-30B-A3B on an H200 and an RTX PRO 6000, at batch
# 1 and 8? How does that move with batch size and prompt length? And given the embedded drafter's
# acceptance, what would a tree buy at each budget? Everything below is computed from configs
# (`wb.shapes.cost`: FLOPs as `FlopCounterMode` counts them, bytes moved, a roofline per GPU) plus one short
# run of the embedded pair on this CPU, which sits in the other regime.

# %%
import workbench as wb

for name, g in wb.shapes.cost_gpus().items():
    print(f"{name:24s} {g.flops / 1e12:7.1f} TFLOP/s bf16 dense  {g.bandwidth / 1e12:5.2f} TB/s  "
          f"ridge {g.ridge:4.0f} FLOP/byte")

# %% [markdown]
# One table: every forward a DDTree decode of Qwen3-8B runs, at batch 1 with a 512-token prompt on an
# H200. DECODE does 1 FLOP per byte; the ridge is 206, so it is memory-bound by a factor of 200 and a
# verify can add nodes until its FLOPs catch up with the weight bytes it reads anyway.

# %%
c = wb.shapes.cost("qwen3-8b", gpu="H200", batch=1, prompt_len=512, budgets=[4, 16, 64, 256],
                   draft_config="qwen3-8b-dflash-b16")
c

# %% [markdown]
# **Where verify stops being free** (largest budget B whose verify of 1 + B tokens per request costs at
# most 1.1x the DECODE forward, solved over the integers), with the verify / decode cost ratio at a few
# budgets:

# %%
models = {"Qwen3-8B": ("qwen3-8b", "qwen3-8b-dflash-b16"), "Qwen3-Coder-30B-A3B": ("qwen3-coder-30b-a3b", None)}
print(f"{'model':20s} {'gpu':24s} {'batch':>5s} {'free B':>7s} {'verify/decode at B=4':>21s} {'16':>6s} {'64':>6s} {'256':>6s}")
free = {}
for label, (cfg, dcfg) in models.items():
    for gpu in ("H200", "RTX PRO 6000"):
        for batch in (1, 8):
            t = wb.shapes.cost(cfg, gpu=gpu, batch=batch, prompt_len=512, draft_config=dcfg)
            free[label, gpu, batch] = t.free_budget
            r = [t.verify_seconds(B) / t.decode["seconds"] for B in (4, 16, 64, 256)]
            print(f"{label:20s} {t.gpu.name:24s} {batch:5d} {t.free_budget:7d} {r[0]:21.2f} {r[1]:6.2f} {r[2]:6.2f} {r[3]:6.2f}")

# %% [markdown]
# Qwen3-8B (dense): at batch 1 a tree of about 200-300 nodes is free; the RTX PRO 6000 has a higher ridge
# (it has half the H200's FLOP/s but only 37% of its bandwidth), so its free budget is larger. At batch 8
# the same weight read serves 8 requests' trees, so each request's share of the free tokens is about an
# eighth.
#
# Qwen3-Coder-30B-A3B (MoE, 128 experts, 8 per token) is different: a decode step reads only the 8 experts
# its token picked in each layer, and every extra tree node picks its own 8. Under balanced routing (the
# model's assumption: distinct tokens route independently) a verify of 17 tokens touches about 84 of the
# 128 experts per layer, so verify costs several decodes and no budget is free. It saturates once every
# expert is touched (B around 64); beyond that it is flat again until compute catches up. Real routing
# within one context is correlated, so this is the pessimistic end; batch 8 already touches half the
# experts during decode, which is why the ratio is smaller there.
#
# **How it moves with batch size and prompt length** (Qwen3-8B on the H200, free budget per request):

# %%
lens = (128, 512, 4096, 32768)
print(f"{'batch':>5s} " + " ".join(f"{'prompt ' + str(P):>13s}" for P in lens))
for batch in (1, 2, 4, 8, 16, 32):
    row = [wb.shapes.cost("qwen3-8b", gpu="H200", batch=batch, prompt_len=P, budgets=[]).free_budget for P in lens]
    print(f"{batch:5d} " + " ".join(f"{b:13d}" for b in row))

# %% [markdown]
# Batch divides the free budget while the weights dominate the bytes: FLOPs grow with batch x tokens,
# the weights are read once. Prompt length pulls towards a second limit. Every verify node attends to
# the whole context (4 x heads x head_dim FLOPs per cached token per layer) while the cache is read once
# for all nodes (4 x kv_heads x head_dim bytes per token per layer in bf16), so attention alone does
# about heads / kv_heads = 4 FLOPs per byte per node and turns compute-bound near ridge / 4, about 50
# nodes, whatever the batch. At batch 1 the weights dominate and a long prompt *lowers* the free budget
# (222 -> 130 at 32k); at batch 16-32 the KV cache dominates decode's bytes and a long prompt *raises* it
# towards that limit.
#
# **This CPU is the other regime.** A short sweep of the embedded pair (6-layer target, hidden 256):
# tau per budget measured, and the measured verify time per cycle. Here compute is the limit, so every
# node costs time:

# %%
from workbench.shipped import eval_prompts

engine = wb.load()
prompts = [p["prompt"] for p in eval_prompts("long")[:3]]
sweep = {B: [engine.generate(p, wb.DDTree(B), max_new_tokens=48, record_topk=64) for p in prompts] for B in (4, 16, 64)}
measured_tau = {B: sum(sum(t.accept_lengths) for t in ts) / sum(len(t) for t in ts) for B, ts in sweep.items()}
need = wb.analysis.budget_needed(sweep[64])     # tau at every budget up to 64, from the DDTree(64) runs
print("measured tau:", {B: round(t, 3) for B, t in measured_tau.items()})
print("tau from budget_needed:", {B: round(need.tau_at(B), 3) for B in (1, 2, 4, 8, 16, 32, 64)})

# %% [markdown]
# The CPU's verify time per budget, measured directly: one target forward over 1 + B tokens after a
# 256-token prefix, the budgets interleaved and the fastest of 5 repeats kept (the machine is shared).

# %%
# NBVAL_IGNORE_OUTPUT

import time
import torch
from transformers import DynamicCache
from workbench.records.forward import ForwardMode
from workbench.models.run import run_target

target, P = engine.models.target, 256
cache = DynamicCache(config=target.config)
with torch.inference_mode():
    run_target(target, torch.zeros(1, P, dtype=torch.long), torch.arange(P)[None], cache, ForwardMode.EXTEND, None)
    cpu_verify = {B: float("inf") for B in (0, 4, 16, 64, 256)}
    for _ in range(5):
        for B in cpu_verify:
            n = 1 + B
            mask = torch.ones(1, 1, n, P + n, dtype=torch.bool).tril(P)  # prefix + a chain: the same work as a tree
            t0 = time.perf_counter()
            run_target(target, torch.zeros(1, n, dtype=torch.long), torch.arange(P, P + n)[None], cache,
                       ForwardMode.TARGET_VERIFY, None, mask)
            cpu_verify[B] = min(cpu_verify[B], time.perf_counter() - t0)
            cache.crop(-n)  # back to the prefix
print("CPU verify ms (fastest of 5):", {B: round(s * 1e3, 2) for B, s in cpu_verify.items()})
curves = [wb.shapes.cost("qwen3-8b", gpu=g, batch=b).curve() for g in ("H200", "RTX PRO 6000") for b in (1, 8)]
curves.append(wb.shapes.cost("qwen3-coder-30b-a3b", gpu="H200", batch=1).curve())
wb.views.verify_cost_figure(curves, measured=cpu_verify, measured_label="embedded pair on this CPU")

# %% [markdown]
# **What a tree buys.** The speedup a DDTree of budget B would reach over AR on the GPU, from the roofline
# (one drafter forward + one verify per cycle, committing tau(B) tokens; AR commits one per DECODE), with
# tau(B) from the embedded drafter's runs above. The embedded pair is a stand-in: a real Qwen3-8B drafter
# has its own acceptance, and the model ignores kernel launches and the engine's own time (which decide
# small models; see 05). Qwen3-Coder has no drafter config here, so its drafter is costed at 0 s (a ceiling).

# %%
taus = {B: need.tau_at(B) for B in (1, 2, 4, 8, 16, 32, 64)}
preds = {}
for label, (cfg, dcfg) in models.items():
    for gpu in ("H200", "RTX PRO 6000"):
        for batch in (1, 8):
            sp = wb.shapes.cost(cfg, gpu=gpu, batch=batch, draft_config=dcfg).speedup(taus)
            preds[label, gpu, batch] = sp
            row = "  ".join(f"{r['budget']}:{r['speedup']:.2f}x" for r in sp.rows)
            print(f"{label:20s} {gpu:13s} batch {batch}: best B={sp.best['budget']:>2d} ({sp.best['speedup']:.2f}x)  {row}")

# %%
# NBVAL_IGNORE_OUTPUT

wb.views.speedup_figure([preds[k] for k in preds if k[2] == 1])

# %% [markdown]
# Dense Qwen3-8B at batch 1: verify stays free up to 220 nodes, so the best budget is the largest one this
# drafter's tau still rises at; at batch 8 the verify turns compute-bound past about 27 nodes per request
# and the best budget drops. Qwen3-Coder at batch 1 barely gains: every node reads new experts, so the
# verify grows faster than tau. At batch 8 decode already reads half the experts and the tree pays again.

# %% [markdown]
# ## CUDA graph readiness checklist
#
# A CUDA graph records a forward's kernels once and replays them with one launch. A model as small as the
# embedded pair does little work per kernel, so on a GPU its step is expected to be bound by kernel launches
# rather than compute (an expectation: this repository stores no GPU timing of it), which is where graphs
# help. A replay reads the same addresses with the same shapes, so a capturable forward needs: the
# same input shapes every cycle (trees padded to one node count), the same storage (inputs copied into
# kept buffers, K/V and mask preallocated, never regrown), and no host read between the draft and the
# verify forward (the host must not wait for the device mid-cycle). `workbench.engine.graphs.readiness` checks
# each on a live session of the embedded pair: pre-hooks on the target and the drafter record every
# forward's tensor inputs (shape and address, the K/V store included), and a log of host reads runs
# from the draft stage to the end of the verify stage. The default (dynamic) engine against
# `static_shapes=True`:

# %%
from workbench.engine.graphs import readiness

prompt = eval_prompts("long")[0]["prompt"]
checks = {st: readiness(engine, prompt, wb.DDTree(16), max_new_tokens=24, static_shapes=st) for st in (False, True)}
print(f"{'requirement':58s} {'dynamic':>8s} {'static':>8s}   evidence (static | dynamic)")
for req in checks[True]:
    (d_ok, d_ev), (s_ok, s_ev) = checks[False][req], checks[True][req]
    print(f"{req:58s} {'yes' if d_ok else 'no':>8s} {'yes' if s_ok else 'no':>8s}   {s_ev} | {d_ev}")

# %% [markdown]
# The dynamic engine fails nearly every requirement by design: its verify mask widens with the prefix,
# its trees have as many nodes as they find, the drafter's context is as long as the last accept, and
# on a CPU the tree build reads the top-k on the host (a heap is cheaper there than tensor calls). With
# `static_shapes=True` every forward of a fixed policy has one shape and one set of buffers, attention
# reads the whole preallocated capacity (the mask hides the unused columns), lengths live on the device,
# and the tree is built by the device kernel; the tokens stay the same. On CUDA, `wb.load(...,
# cuda_graphs=True)` captures the draft and the verify forward once per (batch, nodes, length bucket)
# and replays them (`tests/gpu/check_cuda.py`, section `cuda_graphs`, compares replay with eager; it has
# not run on a GPU yet).
#
# **What SGLang's graph runner captures**, read from the installed source without importing it (as
# notebook 04 does): the decode runner captures TARGET_VERIFY when speculative decoding is on, at a
# static width of `num_draft_tokens` tokens per request, for each batch size of its configured list
# that passes the alignment filters, with input buffers sized for the largest batch:

# %%
import ast
from workbench.shapes.sglang_source import CUDA_GRAPH_RUNNER, expressions_in, find_def, parsed_source

BASE = "srt/model_executor/runner/base_cuda_graph_runner.py"
BUFFERS = "srt/model_executor/runner_utils/buffers.py"
init = expressions_in(find_def(parsed_source(CUDA_GRAPH_RUNNER), "DecodeCudaGraphRunner.__init__"))
wanted = ("self.capture_forward_mode = ForwardMode.TARGET_VERIFY", "self.captured_req_width =",
          "self.capture_bs, self.compile_bs =", "self.max_num_token =")
print(CUDA_GRAPH_RUNNER, "(DecodeCudaGraphRunner.__init__):")
for w in wanted:
    for e in sorted(x for x in init if x.startswith(w)):
        print("  ", e)
print(BASE, "(get_batch_sizes_to_capture):")
for e in sorted(x for x in expressions_in(find_def(parsed_source(BASE), "get_batch_sizes_to_capture"))
                if x.startswith("capture_bs = ")):
    print("  ", e)
print(BUFFERS, "(DecodeInputBuffers.create): the static input buffers")
for n in ast.walk(find_def(parsed_source(BUFFERS), "DecodeInputBuffers.create")):
    if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and ast.unparse(n.value.func) in ("torch.zeros", "torch.full", "torch.empty")):
        print(f"   {ast.unparse(n.targets[0]):34s} {ast.unparse(n.value.args[0])}")

# %% [markdown]
# So SGLang's captured verify is `[max_bs * num_draft_tokens]` tokens flat (`input_ids`, `positions`,
# `out_cache_loc` per token; `seq_lens`, `req_pool_indices` per request), padded up to the next captured
# batch size, with paged K/V addressed through `out_cache_loc` and the request-to-token table instead of a
# per-request contiguous buffer. Our static path is the same contract in the padded layout: `[bs, N]` with
# N = budget + 1 fixed (SGLang's `num_draft_tokens`), K/V rows written at device-side rows, and one graph per
# (batch, N, length bucket). What differs: SGLang's attention backend reads only each request's real
# context (`seq_lens`), while ours attends over the whole preallocated capacity with a mask, which
# costs compute proportional to the bucket, not the prefix (fine for a launch-bound small model, not for
# a long-context large one).

# %% [markdown]
# **What we learned.** On a GPU a dense target's verify is memory-bound up to roughly FLOP/s / bandwidth
# tokens per batch: for Qwen3-8B a tree of about 220 nodes costs what one decode step costs on an H200 at
# batch 1 (about 300 on an RTX PRO 6000) and about 27 per request at batch 8. A larger batch divides it;
# a long prompt pulls it towards ridge / (heads / kv_heads), about 50 nodes, where attention over the
# cached context becomes the compute limit. For an MoE target the weights a forward reads grow with
# the distinct experts its tokens route to, so under balanced routing no tree is free at batch 1, and
# the cost levels off only once every expert is read. With this drafter's acceptance, the predicted
# speedup on Qwen3-8B peaks where tau stops rising while verify is still free; at batch 8 it peaks at a
# smaller budget. On this CPU every node costs compute time, so notebook 05's best budget is not the
# GPU's.
