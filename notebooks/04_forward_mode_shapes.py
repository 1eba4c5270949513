# %% [markdown]
# # 04 · Forward-mode shapes: what every forward computes, here and in SGLang
#
# **Question.** Before grafting a tree onto SGLang's DFlash path: does SGLang's TARGET_VERIFY forward
# compute logits for every draft token of every request, and EXTEND only for each request's last
# token? How big is the verify mask at batch 8, prefix 512 and 16 tokens, and for a DDTree of 64
# nodes, in each of SGLang's mask modes? What does a ragged batch of trees look like in SGLang's
# `RaggedVerifyLayout`? Our engine runs Hugging Face forwards on `[bs, n]` tensors, which return logits
# at every position, so its own shapes cannot answer this: each answer below comes from SGLang's
# code (sglang 0.5.23, installed without its dependencies), named with the file it comes from.

# %%
import workbench as wb
from workbench.shapes import sglang_layout as L

engine = wb.load()
traces = {}
for policy in [wb.AR(), wb.DFlash(), wb.DDTree(32)]:
    s = engine.session("def merge(a, b):\n    ", policy=policy, max_new_tokens=24)
    with wb.shapes.capture(s):
        s.run()
    traces[str(policy)] = s.trace

# %% [markdown]
# Our forwards side by side, rows aligned by module. The `(sglang layout)` rows at the end are the
# tensors SGLang would build for the same forward: one flat token dimension, int32 `qo_indptr` /
# `kv_indptr`, a flat custom mask for the tree, and only the logits rows its logits processor keeps.

# %%
wb.shapes.compare(traces)

# %%
wb.shapes.table(traces["DDTree(32)"], mode="TARGET_VERIFY", model="target", view="sglang")

# %%
wb.shapes.check_contracts(traces["DDTree(32)"])

# %% [markdown]
# ### 1. Which logits rows does SGLang keep per mode?
#
# `LogitsProcessor._get_pruned_states` (`sglang/srt/layers/logits_processor.py`) decides. Its module
# cannot be imported on this machine (transformers' image processors want torchvision), so
# `sglang_logits_rows` executes that one method from the installed file, on hidden states whose rows
# carry their own index: what comes out is the list of rows SGLang keeps.

# %%
for name in ("logits all rows", "logits last row", "logits with logprobs"):
    print(f"{name:22s}", L.SGLANG_RULES[name])
lens = [4, 5, 6]                                     # three requests, ragged
print("EXTEND, prompts of", lens, "tokens       -> rows", L.sglang_logits_rows("EXTEND", lens))
print("EXTEND with prompt log-probs        -> rows", L.sglang_logits_rows("EXTEND", lens, return_logprob=True))
verify = [16, 16, 16]                                # DFlash: 16 draft tokens per request
kept = L.sglang_logits_rows("TARGET_VERIFY", verify)
print(f"TARGET_VERIFY, 3 x 16 draft tokens  -> {len(kept)} rows of {sum(verify)}: {kept == list(range(sum(verify)))}")

# %% [markdown]
# ### 2. The verify mask: DFlash at bs 8, prefix 512, 16 tokens; a DDTree of 64 nodes
#
# DFlash's worker passes no custom mask at all: its verify is a chain, causal attention suffices.
# If a mask is handed in, `DFlashVerifyInput.generate_attn_arg_prefill` (`dflash_info.py`) pads it to
# `sum(prefix) * n + n**2 * bs` entries; EAGLE's tree build (`eagle_utils.py`,
# `build_tree_kernel_efficient`) allocates one per mask mode. Both are run below from the installed
# source (the tree kernel itself is not run: only the allocation matters), next to our
# `custom_mask_elements`, the one function the workbench uses for these sizes.

# %%
from workbench.shapes import fmt_bytes

bs, prefix = 8, 512
print(L.SGLANG_RULES["dflash verify mask"])
args = L.sglang_verify_args([prefix] * bs, [16] * bs, with_mask=True)
print("dflash_info.py, a mask handed to DFlash verify is padded to", args["custom_mask"].numel(), "entries;",
      "qo_indptr", args["qo_indptr"].tolist())
print()
print(f"{'bs 8, prefix 512':38s} {'mask mode':22s} {'sglang (eagle_utils.py)':26s} workbench")
for label, n in [("DFlash chain, 16 tokens", 16), ("DDTree, 64 nodes", 64), ("DDTree(64) here: root + 64 = 65", 65)]:
    for mode in L.MASK_MODES:
        try:
            m = L.sglang_tree_mask([prefix] * bs, n, mode)
            theirs = f"{m.numel():,} {str(m.dtype)[6:]}"
        except Exception as e:
            theirs = f"fails: {type(e).__name__}"
        try:
            ours = L.custom_mask_elements([prefix] * bs, [n] * bs, mode)
            mine = f"{ours.numel:,} {ours.dtype} = {fmt_bytes(ours.bytes)}"
        except ValueError as e:
            mine = str(e).split(";")[0]
        print(f"{label:38s} {mode:22s} {theirs:26s} {mine}")

# %% [markdown]
# ### 3. A ragged batch of trees in `RaggedVerifyLayout`
#
# Three requests whose trees have 9, 65 and 17 nodes (root included), at prefixes 100, 512 and 37.
# `RaggedVerifyLayout` (`sglang/srt/speculative/ragged_verify.py`) imports here and is used as is:
# per-request `verify_lens`, `qo_indptr`, and the CUDA-graph token tier, from a grid built the way
# `decode_cuda_graph_runner.py` builds it (`bs * tokens per request` for each captured batch size).

# %%
import torch
from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout, build_ragged_target_verify_geometry

prefix_lens, verify_lens = [100, 512, 37], [9, 65, 17]
grid = L.ragged_token_grid(capture_bs=[1, 2, 4, 8], tokens_per_req=65)
lay = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=verify_lens, device=torch.device("cpu"), grid=grid)
print("grid (token tiers)   ", grid, "  ", L.SGLANG_RULES["ragged token grid"])
print("verify_lens          ", lay.verify_lens.tolist())
print("qo_indptr            ", lay.qo_indptr_device.tolist())
print("extend_start_loc     ", lay.extend_start_loc.tolist())
print("tokens / graph tier  ", lay.total_verify_tokens, "/", lay.graph_num_tokens)
geo = build_ragged_target_verify_geometry(seq_lens=torch.tensor(prefix_lens, dtype=torch.int32), layout=lay)
print("kv lens, cu_seqlens_k", geo.cache_seqlens_int32.tolist(), geo.cu_seqlens_k.tolist())
padded = lay.padded_to_bucket(padded_bs=4)      # a CUDA graph captured for 4 requests
print("padded to 4 slots    ", padded.verify_lens.tolist(), "(the pad row takes the tier's leftover tokens)")

# %%
L.layout("TARGET_VERIFY", prefix_lens, verify_lens, tree=True, vocab_size=151936, hidden_size=4096, aux_layers=5)

# %% [markdown]
# ### Qwen3-8B with its DFlash-b16 drafter, batch 8, prompt 512, budget 64: no weights
#
# `plan` builds both models on the meta device and runs this engine's forwards; each line gives our
# `[bs, n]` layout and SGLang's flat one. The prefill keeps one logits row per request, as SGLang's
# logits processor does (`prompt_logprobs=True` keeps every prompt row).

# %%
import pathlib
configs = pathlib.Path(wb.__file__).parent / "configs"
p = wb.shapes.plan(configs / "qwen3-8b.json", batch=8, prompt_len=512, budget=64,
                   draft_config=configs / "qwen3-8b-dflash-b16.json")
print(p)

# %%
p.sglang()

# %% [markdown]
# **What we learned.** In SGLang, TARGET_VERIFY keeps a logits row for every draft token of every
# request (48 of 48 above; 520 rows for DDTree(64) at batch 8), while EXTEND keeps only each
# request's last row unless prompt log-probs are asked for: the Qwen3-8B prefill at batch 8 has 8
# logits rows (2.3 MiB), not 8 x 512 (1.2 GiB). DFlash verifies its chain with no custom mask; a
# mask at bs 8, prefix 512, 16 tokens would hold 67,584 entries in FULL_MASK and 2,048 in QLEN_ONLY.
# A 64-node DDTree needs 294,912 (FULL_MASK) or 32,768 (QLEN_ONLY); with the root it is 65 tokens,
# 300,040 or 33,800. QLEN_ONLY_BITPACKING stops at 32 tokens per request (uint32 words), so no
# DDTree of useful size fits it. A ragged batch of trees is exactly what `RaggedVerifyLayout`
# describes: per-request `verify_lens`, a `qo_indptr` over them, and a graph tier the batch is
# padded to.

# %% [markdown]
# ### Every family: an MLA target and a hybrid one
#
# `plan` builds each family's own transformers model on the meta device: Llama, Qwen3-MoE (router logits
# and experts touched), DeepSeek-V3 / Kimi-K2 (MLA: no `head_dim`, the cache is a latent), Qwen3-Next
# and Qwen3.5 / 3.6 (from their nested `text_config`). `p.states` holds what each forward leaves behind,
# by kind: per token (KV or latent), per request (a linear layer's conv window and recurrent state) and
# per verified node (the copies SGLang's `MambaPool.SpeculativeState` keeps so any node can be committed).

# %%
for name in ("deepseek-v3", "qwen3-next-80b-a3b"):
    q = wb.shapes.plan(configs / f"{name}.json", batch=8, prompt_len=512, budget=64)
    held = q.state_bytes("DDTree(64) verify (65 tokens)")
    print(name, {kind: wb.shapes.fmt_bytes(b) for kind, b in held.items()})
    keep = ("  " + q.facts.model_type, "  experts DDTree", "  linear attention")
    print("\n".join(line for line in repr(q).splitlines() if line.startswith(keep)))

# %% [markdown]
# **What we learned.** DeepSeek-V3 caches 576 numbers per token per layer (the 512-wide latent and the
# 64-wide rotary key), 68.6 KiB per token over 61 layers in bfloat16: 309 MiB for 8 requests of 577
# tokens. Qwen3-Next keeps KV only in its 12 attention layers (24 KiB per token), but each of its 36
# linear layers holds a 2 MiB float32 recurrent state per request, and a tree verify one per node: 73.7
# MiB per node, against 12 MiB for a whole 512-token prompt's KV. A 65-node tree for 8 requests would
# need 37.4 GiB of per-node copies, so a hybrid's tree verify has to avoid them (scan by tree level,
# replay the accepted path), not copy SGLang's chain layout.

# %% [markdown]
# ## A real batched verify
#
# The plan above is on the meta device. A batch session runs several requests for real: one drafter
# forward and one TARGET_VERIFY forward per cycle for all of them, one tree per request, budgets and
# prompt lengths differing. Our forward pads the trees to a common node count `[bs, N]` (inert padding
# nodes, masked); SGLang flattens the same batch into `sum(1 + budget_i)` token rows with a ragged
# `qo_indptr` (computed here by SGLang's own `RaggedVerifyLayout`).

# %%
batch = engine.batch_session(
    ["def merge(a, b):\n    ", "class Stack:\n    def push(self, x):", "import json\n"],
    policy=[wb.DDTree(16), wb.DDTree(32), wb.DDTree(8)], max_new_tokens=24)
batch.step()
lay = batch.verify_layout()
f = lay["padded"]["forward"]
print("requests (policy -> verified rows):", list(zip(lay["policies"], lay["verify_lens"])))
print("ours, padded   input_ids", f["inputs"]["input_ids"]["shape"], " mask", f["inputs"]["attention_mask"]["shape"],
      " logits", lay["padded"]["logits"], f"= {lay['padded']['rows']} rows, {lay['padded']['padding_rows']} padding")
print("SGLang, ragged input_ids", lay["ragged"]["input_ids"], " logits", lay["ragged"]["logits"],
      " qo_indptr", lay["ragged"]["qo_indptr"], f"({lay['ragged']['source']})")
print("logits for every draft token of every request:", lay["every_draft_token_has_logits"])

# %%
# The shapes tables take the batch session too: SGLang's rows for the same batched verify forward.
t = wb.shapes.table(batch, mode="TARGET_VERIFY", model="target", view="sglang")
[(r["tensor"], r["shape"], r["ours"]) for r in t if r["tensor"] in ("input_ids", "qo_indptr") or "logits" in r["tensor"]]

# %%
batch.run()
[(s.policy, s.text[:40]) for s in batch.sessions]

# %% [markdown]
# **What we learned from the real batch.** Every verified token of every request gets a logits row:
# SGLang's flattened layout has exactly sum(1 + budget) rows; ours pads to batch x N and masks the padding.

# %% [markdown]
# ### 4. SGLang's own DFlash verify checks against this ragged batch
#
# `check_contracts` above runs *our* contract checks. SGLang's DFlash worker has its own, in
# `sglang/srt/speculative/dflash_utils.py`: every `if ...: raise` of the functions it runs on the verify
# logits, read here from the installed file (nothing imported), with the branch of
# `DFlashWorkerV2` that reaches each one and whether the batch above (node counts 17, 33 and 9:
# ragged) passes it. Candidates are given two ways: flattened like the logits (SGLang's ragged layout)
# and padded to `[bs, max nodes]`.

# %%
from workbench.shapes.dflash_checks import dflash_verify_checks, greedy_accept_call

counts = [n for n in lay["verify_lens"]]
for padded in (False, True):
    print("candidates", "padded [bs, max nodes]" if padded else "flat [sum nodes]")
    for c in dflash_verify_checks(counts, vocab=engine.tokenizer.vocab_size, block_size=engine.models.block_size,
                                  padded=padded):
        verdict = {True: "passes", False: "FAILS", None: "unknown"}[c.ragged]
        print(f"  {verdict:7s} {c.function}: {c.condition}  ({c.why})")
print()
paths = {c.function: c.path for c in dflash_verify_checks(counts)}
for fn, path in paths.items():
    print(f"{fn} runs in {path}")
name, when = greedy_accept_call()
print(f"greedy accept calls {name} ({when}): no shape checks on that path")

# %% [markdown]
# **What we learned from SGLang's checks.** A ragged batch of trees does not pass SGLang's DFlash verify
# as it stands: flattened, it fails `candidates.ndim != 2` (and cannot be unpacked into `bs,
# draft_token_num`); padded, it passes the dimension and sample-shape checks (the device checks pass by construction here: the
# stand-in tensors carry real shapes but are all placed on `cuda:0`, so they say nothing about devices) but fails
# `next_token_logits.shape[0] != bs * draft_token_num`, because its logits have `sum(nodes)` rows, not
# `bs * block_size`; `apply_dflash_verify_logits_adjustments` fails the same row count against the
# block size. Those checks guard only the sampling path (non-greedy requests) and the logit
# adjustments (any `sampling_info`); the greedy path calls an accept kernel named `..._unchecked`, so
# a ragged tree there meets no check at all and would be read with the chain's fixed stride: the
# place a tree port must add its own check.
