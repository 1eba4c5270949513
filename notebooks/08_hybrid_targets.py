# %% [markdown]
# # 08 · Hybrid targets: tree verify over a recurrent state
#
# **Questions.** Qwen3-Next, Qwen3.5 and Qwen3.6 interleave GatedDeltaNet *linear-attention* layers with
# gated full-attention layers. A recurrent layer takes no attention mask: its short conv and its state run
# over the tokens in order. (1) What goes wrong when a tree is verified the way a dense target is, in one
# flattened forward? (2) What rule fixes it, and does the engine follow it? (3) Do SGLang's own Triton
# tree kernels agree with our torch oracle on a real cycle? (4) What does each tree node's state cost at
# full size? (5) DDTree against DFlash on a hybrid pair.

# %%
import tempfile
from pathlib import Path
import torch
import workbench as wb
from ddtree_kernels import Tree
from workbench.engine import stages
from workbench.models.path_oracle import flattened_logits, path_logits
from workbench.models import HybridGDN

PAIR = "hybrid"  # the embedded hybrid pair (workbench/assets/hybrid); "tiny-random": a random nested Qwen3.5 pair
if PAIR == "hybrid":
    engine = wb.load("hybrid")
else:  # a random Qwen3.5 checkpoint in the layout Qwen3.5 / 3.6 ship in (text model under text_config), random drafter
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    from workbench.models.stand_ins import make_hybrid_pair
    target_dir, draft_dir = make_hybrid_pair(Path(tempfile.mkdtemp()), "qwen3_5", nested=True, vocab=24)
    engine = wb.load(target=target_dir, draft=draft_dir)
model = engine.models.target
print(type(model).__name__, model.config.layer_types)

# %% [markdown]
# ## 1 · The naive flattened forward gives siblings wrong logits
#
# One real DDTree cycle. The truth for every node is its own root-to-node path run through transformers
# as a chain (`hybrid_oracle.path_logits`). The naive verify is one forward over all nodes with the tree
# mask: the attention layers honour it, but each GatedDeltaNet layer runs its conv and state over the
# *flattened* order, so a node whose flattened predecessor is not its parent continues another branch.
# The engine's verify (`HybridGDN`) starts every node from its parent's state instead.

# %%
from workbench.shipped import eval_prompts

prompt = eval_prompts("short")[0]["prompt"] if PAIR == "hybrid" else "t3 t1 t4 t1 t5 t9"
s = engine.session(prompt, policy=wb.DDTree(8), max_new_tokens=24)
cycle = s.step()
tree = Tree(*(getattr(cycle, f)[None] for f in ("tokens", "parents", "depth", "rank", "score")))
context = torch.tensor([s.prompt_ids])
with torch.inference_mode():
    truth = path_logits(model, context, tree)       # [1, n, V]: each node through its own path
    naive = flattened_logits(model, context, tree)  # one forward, tree mask, linear layers in flat order
    state = HybridGDN(engine.models)                 # the engine's target state, on its own
    state.prefill([s.prompt_ids])
    layout = stages.tree_compile([tree], [len(s.prompt_ids)], [int(tree.depth.max())])
    ours = state.verify(layout).logits.float()
naive_err = (naive - truth).abs().amax(-1)[0]
ours_err = (ours - truth).abs().amax(-1)[0]
print("node  parent  flattened predecessor is its parent  max|naive - truth|  max|ours - truth| < 1e-4")
for i, p in enumerate(tree.parents[0].tolist()):
    chain = all(q == j - 1 for j, q in enumerate(tree.parents[0, 1 : i + 1].tolist(), start=1))
    print(f"{i:>4}  {p:>6}  {str(chain):>35}  {float(naive_err[i]):>18.2f}  {str(bool(ours_err[i] < 1e-4)):>24}")

# %% [markdown]
# Nodes on the leading chain (0, 1, 2, ... each the next one's parent) are right either way; every other
# node inherits the state of the branch before it and is off by whole units of logit. A dense target
# gives the same table with zeros in the naive column (`tests/models/test_hybrid_oracle.py`).
#
# ## 2 · The parent-state rule
#
# For each linear-attention layer and each node *i* with parent *p(i)*:
#
# - **conv**: node *i* convolves its own input with the last K−1 inputs along its ancestor chain (itself,
#   parent, grandparent, ..., then the request's committed window); its window is kept per node.
# - **delta rule**: node *i* starts from *p(i)*'s recurrent state (the root from the request's committed
#   state) and keeps its own.
#
# After accept, the deepest accepted node's window and state *become* the request's (nothing is recomputed,
# nothing cropped; a recurrent state has no crop). Every `Cycle` of a hybrid target records which node
# each node's state continued from (`state_from`, SGLang's `retrieve_parent_token`), and the contracts check it:

# %%
print("parents   ", cycle.parents.tolist())
print("state_from", cycle.state_from.tolist())
s.run()
checks = wb.shapes.check_contracts(s)
print(checks.passed, [r["result"] for r in checks if r["check"] == "recurrent state from the parent"])

# %% [markdown]
# What a verify holds per linear layer, beside SGLang's layout (its mamba pool keeps the state as
# `[HV, Dv, Dk]`, ours is transformers' `[HV, Dk, Dv]`):

# %%
table = wb.shapes.table(s, mode="TARGET_VERIFY", model="target", view="sglang")
for r in table:
    if r["tensor"].startswith(("mamba", "intermediate", "retrieve_parent")):
        print(f"{r['tensor']:<26} {str(r['shape']):<18} {r['dtype']:<8} ours {r['ours']}")

# %% [markdown]
# ## 3 · SGLang's kernels agree with the oracle on a real cycle
#
# The same verify through SGLang 0.5.23's Triton kernels (`causal_conv1d_update` in tree mode and the
# fused-gating delta rule its GDN backend runs in TARGET_VERIFY), under Triton's interpreter on this CPU:
# `kernel_backend="sglang-triton"` (on CUDA, `"sglang"` runs them natively).

# %%
with torch.inference_mode():
    sg = HybridGDN(engine.models)
    sg.kernel_backend = "sglang-triton"
    sg.prefill([s.prompt_ids])
    sg_logits = sg.verify(layout).logits.float()
print("max |logits: sglang - torch oracle| < 1e-4:", bool((sg_logits - ours).abs().max() < 1e-4))
print("max |logits: sglang - path truth|  < 1e-4:", bool((sg_logits - truth).abs().max() < 1e-4))
for layer, a, b in zip(state.cache.linear_ids, state.cache.slots, sg.cache.slots):
    dw = float((a.scratch[0] - b.scratch[0].float()).abs().max() / a.scratch[0].abs().max())
    ds = float((a.scratch[1] - b.scratch[1]).abs().max() / a.scratch[1].abs().max())
    print(f"layer {layer}: per-node conv windows and states agree within 1e-5 of their largest entry: "
          f"{dw < 1e-5 and ds < 1e-5}")

# %% [markdown]
# ## 4 · What each node's state costs at full size
#
# From the configs alone (transformers' defaults for these classes are the released models' shapes:
# Qwen3-Next-80B-A3B, and Qwen3.6-35B-A3B's text model), with SGLang's default dtypes (conv windows in
# bfloat16, delta-rule states in float32): the per-node scratch of a tree verify against the K/V of one
# token, and the tree size at which the per-node states outweigh the K/V of a whole prompt.

# %%
from transformers import Qwen3NextConfig, Qwen3_5MoeTextConfig
from workbench.models.hybrid import describe
from workbench.shapes import fmt_bytes

for name, cfg in {"Qwen3-Next-80B-A3B": Qwen3NextConfig(), "Qwen3.6-35B-A3B": Qwen3_5MoeTextConfig()}.items():
    one = {x.name: x for x in describe(cfg, batch=1, length=1, nodes=0, dtype=torch.bfloat16)}
    node = {x.name: x for x in describe(cfg, batch=1, length=0, nodes=1, dtype=torch.bfloat16)}
    kv_token = one["keys"].bytes + one["values"].bytes
    per_node = sum(x.bytes for x in node.values() if x.kind == "scratch_per_node")
    committed = one["conv_window"].bytes + one["ssm_state"].bytes
    print(f"{name}: {cfg.layer_types.count('linear_attention')} linear + {cfg.layer_types.count('full_attention')} "
          f"attention layers; K/V per token {fmt_bytes(kv_token)}; recurrent state per request {fmt_bytes(committed)}; "
          f"per tree node {fmt_bytes(per_node)} (= K/V of {per_node // kv_token} tokens)")
    for budget in (16, 64):
        print(f"  budget {budget}: per-node states {fmt_bytes(budget * per_node)} per request, "
              f"outweigh the K/V of prompts up to {budget * per_node // kv_token} tokens")

# %% [markdown]
# A tree node's recurrent scratch costs as much as the K/V of about three thousand tokens: on these
# targets the tree budget is a memory question long before it is a compute one. SGLang keeps these
# buffers per request slot (`[layers, slots + 1, draft tokens, ...]`); replaying the accepted path from the
# committed state instead (its ReplaySSM) avoids the dominant one.
#
# ## 5 · DDTree against DFlash on the hybrid pair
#
# Greedy, float32: every policy's output equals plain decoding token for token (`tests/models/test_hybrid.py`
# checks this against transformers' own `generate` too). Five long and five short held-out prompts, 32
# new tokens, the policies interleaved prompt by prompt, one pass: a speed order is stated only where a
# paired test over the ten prompts (each prompt's speedup over AR; Wilcoxon, p < 0.05 between neighbours)
# separates it (`wb.analysis.order_verdict`); the range beside each speedup is over the prompts.

# %%
# NBVAL_IGNORE_OUTPUT

from workbench.bench.policy_bench import compare_policies

policies = [wb.AR(), wb.DFlash(), wb.DDTree(4), wb.DDTree(8), wb.DDTree(16)]
if PAIR == "hybrid":
    prompts = eval_prompts("long")[:5] + eval_prompts("short")[:5]
else:
    prompts = [{"id": str(i), "prompt": p} for i, p in enumerate(["t3 t1 t4 t1 t5 t9", "t7 t7 t2", "t10 t11 t12"])]
result = compare_policies(engine, policies, prompts, max_new_tokens=32, repeats=1, progress=True)

# %%
print("lossless (greedy == AR for every prompt):", result.lossless)
for name, row in result.summary.items():
    print(f"{name:<11} tau {row['tau']:.2f}")

# %%
# NBVAL_IGNORE_OUTPUT

for name, row in result.summary.items():
    lo, hi = min(row["speedup_vs_ar_per_prompt"]), max(row["speedup_vs_ar_per_prompt"])
    print(f"{name:<11} tok/s {row['tokens_per_s']:6.1f}  vs AR {row['speedup_vs_ar']:.2f}x [{lo:.2f}-{hi:.2f} over prompts]")
print(wb.analysis.order_verdict(result.summary, labels=["AR", "DDTree(4)", "DDTree(8)", "DDTree(16)"]))

# %% [markdown]
# **Where a hybrid cycle's time goes**, against the dense embedded pair of about the same size (both
# targets 6 layers, hidden 256; the dense one is all attention), DDTree(8) on the same prompts:
# milliseconds per steady cycle, p50 / p90.

# %%
# NBVAL_IGNORE_OUTPUT

dense = compare_policies(wb.load(), [wb.DDTree(8)], prompts, max_new_tokens=32, repeats=1, progress=True,
                         warmup=True)
stages = ["draft", "tree_build", "tree_compile", "verify", "accept", "commit", "record", "cycle"]
print(f"{'stage':<13}{'hybrid p50/p90':>16}{'dense p50/p90':>16}")
for st in stages:
    h = result.summary["DDTree(8)"]["stage_percentiles"][st]
    d = dense.summary["DDTree(8)"]["stage_percentiles"][st]
    print(f"{st:<13}{1e3 * h['p50']:>8.2f}/{1e3 * h['p90']:<7.2f}{1e3 * d['p50']:>8.2f}/{1e3 * d['p90']:<7.2f}")

# %% [markdown]
# **What we learned.** The flattened verify gives wrong logits to the nodes off the leading chain (the
# table in section 1); starting each node from its parent's state makes every node's logits equal its
# own path's, and SGLang's tree kernels compute the same states. At full size the price is memory: each
# tree node holds a copy of every linear layer's state. On this small pair the price is time too: the
# verify's extra work over a dense target's is the recurrence run a tree level at a time (the conv over
# each node's ancestor chain, the delta rule from its parent's state), so a hybrid's verify grows faster
# with the tree than a dense one's and the best budget is smaller. Whether DDTree beats AR here, and at
# which budget, is what the verdict line above says for this run.
