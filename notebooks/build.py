"""Write the notebooks from the cell sources below and execute them in place (outputs committed).

    .venv/bin/python notebooks/build.py            # all notebooks
    .venv/bin/python notebooks/build.py 03         # the ones whose name starts with 03

nbval (``make test``) re-runs every notebook and compares its outputs with the
stored ones, so a notebook whose stored outputs are stale fails the suite.
Cells starting with ``# NBVAL_IGNORE_OUTPUT`` hold figures, widgets and timings.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).parent
IGNORE = "# NBVAL_IGNORE_OUTPUT\n"


def md(text: str):
    return nbformat.v4.new_markdown_cell(text.strip())


def code(text: str):
    return nbformat.v4.new_code_cell(text.strip())


NOTEBOOKS: dict[str, list] = {}

NOTEBOOKS["01_quickstart"] = [
    md("""
# 01 · Quickstart: is speculative decoding lossless here, and what does it buy?

**Question.** With the embedded target and its DFlash drafter, do plain autoregressive decoding
(AR), linear DFlash and a DDTree draft tree produce the *same* text under greedy decoding, and how
do they differ in tokens accepted per target forward (tau) and in speed? Everything here runs on a
laptop CPU in seconds; on a GPU host the same cells run with `wb.load(target=..., draft=..., device="cuda")`.
"""),
    code("""
import workbench as wb

engine = wb.load()          # the embedded Qwen3-architecture target + DFlash drafter (trained in this repo)
engine
"""),
    code("""
prompt = "def parse_header(line):\\n    "
runs = {}
for policy in [wb.AR(), wb.DFlash(), wb.DDTree(budget=32)]:
    s = engine.session(prompt, policy=policy, temperature=0.0, seed=0, max_new_tokens=64)
    s.run()
    runs[str(policy)] = s
print(runs["AR"].text)
"""),
    code("""
texts = {name: s.text for name, s in runs.items()}
print("identical greedy text:", len(set(texts.values())) == 1)
for name, s in runs.items():
    print(f"{name:12s} tau = {s.trace.tau:.2f}   cycles = {len(s.cycles)}   new tokens = {len(s.tokens)}")
"""),
    code(IGNORE + """
for name, s in runs.items():
    print(s.trace.summary())          # tokens/s are timings: they vary from run to run
"""),
    md("""
**About the speed above.** On this CPU, DFlash and DDTree can come out *slower* than AR although
they commit several tokens per target forward. The embedded target is tiny (6 layers, hidden 256):
its forward costs about as much as the drafter's forward plus the tree bookkeeping, so saving
target forwards saves little time, and one 64-token run is too short and too noisy (the machine
is shared; AR alone has varied 78-146 tok/s across runs) to rank policies. Speculative decoding
pays when the target forward dominates the cycle: a large target on a GPU, where a forward over
33 tree nodes costs about what a one-token forward costs. `05_budget_sweep` measures where each
cycle's time goes, over many prompts with repeats.
"""),
    md("""
One DDTree cycle: the tree the drafter proposed (the root is the previous bonus token), coloured by
what the target did. The bold path is what it accepted; the last node is the new bonus token.
"""),
    code(IGNORE + """
cycle = runs["DDTree(32)"].cycles[1]
wb.views.tree_figure(cycle, engine.tokenizer)
"""),
    md("""
**What we learned.** Greedy speculative decoding is lossless: the three policies print the same
text token for token. They differ in how many tokens each target forward commits: linear DFlash
commits several per cycle, and the DDTree, which verifies many alternative continuations in one
forward, commits more. Whether that is faster depends on what a wider verify costs; see
`05_budget_sweep`.
"""),
]

NOTEBOOKS["02_step_through_cycles"] = [
    md("""
# 02 · Step through cycles: what happens inside one draft/verify cycle?

**Question.** In one DDTree cycle, what did the drafter propose at each depth, which tree was
built from it, what did the target choose at every node, and why did the accept walk stop where it
did? First with the interactive stepper, then by hand on the same data.
"""),
    code("""
import workbench as wb

engine = wb.load()
session = engine.session("class LineReader:\\n    def __init__(self, path):\\n        ", policy=wb.DDTree(budget=16), seed=0, max_new_tokens=96)
"""),
    code(IGNORE + """
stepper = wb.Stepper(session)      # Step, Run N, Reset; a slider over past cycles; budget/width/temperature for the next cycle
stepper
"""),
    md("""
The widget needs a live kernel (its state is not stored in this file). Driven from Python, it
follows the session: a policy set in code is what the next Step uses, and the controls show it.
A static picture of the cycle it shows:
"""),
    code(IGNORE + """
stepper.run(3)
session.policy = wb.DDTree(budget=16, width=2)   # set in code: the stepper keeps it
stepper.step()
print(session.cycles[-1].policy, "| dropdown:", stepper.policy_kind.value, stepper.budget.value)
wb.views.tree_figure(session.cycles[-1], engine.tokenizer)
"""),
    md("By hand: a fresh session, one `step()`, and a look inside the `Cycle` it returns."),
    code("""
s = engine.session("class LineReader:\\n    def __init__(self, path):\\n        ", policy=wb.DDTree(budget=16), seed=0, max_new_tokens=96)
c = s.step()
tok = engine.tokenizer
show = lambda t: repr(tok.decode([int(t)]))
print(f"cycle {c.index}: root (previous bonus) {show(c.root_token)} at position {c.start}, {c.n_nodes} drafted nodes")
"""),
    code("""
# The drafter's top-3 tokens per slot (slot d predicts depth d+1), with probabilities
import math
for d in range(5):
    row = ", ".join(f"{show(t)} {math.exp(lp):.2f}" for t, lp in zip(c.draft_topk_tokens[d, :3], c.draft_topk_logprobs[d, :3]))
    print(f"slot {d + 1}: {row}")
"""),
    code("""
# The tree, flattened best-first: parent index, depth, token, target's choice at that node
for i in range(c.tokens.shape[0]):
    p = int(c.parents[i])
    agreed = "root" if p < 0 else ("agreed" if int(c.tokens[i]) == int(c.target_choice[p]) else "")
    print(f"{i:2d} parent {p:2d} depth {int(c.depth[i])}  {show(c.tokens[i]):14s} target -> {show(c.target_choice[i]):14s} {agreed}")
"""),
    md("""
**The accept walk on this cycle.** Start at the root. The target's choice at the current node is a
token; if one of the node's children carries that token, move to it and repeat. When no child
matches, stop: the target's choice at the last accepted node is the new bonus token. Nodes the
target agreed with but whose parent was rejected are never reached.
"""),
    code("""
path = c.accepted_nodes.tolist()
print("accepted nodes:", path)
print("accepted text :", repr(tok.decode(c.accepted_tokens.tolist()[1:])), "+ bonus", show(c.bonus))
print("accept length (incl. bonus):", c.accept_length)
"""),
    code("""
c2 = s.step()
print(f"next cycle starts at position {c2.start} = {c.start} + {c.accept_length}; accepted {c2.accepted} drafted tokens")
"""),
    md("""
**What we learned.** A cycle is one drafter forward (all slots at once), one tree, one target
forward over every node, and a walk that keeps the longest path the target agrees with, plus the
target's own next token. The next cycle starts exactly `accept_length` positions later.
"""),
]

NOTEBOOKS["03_tree_anatomy"] = [
    md("""
# 03 · Tree anatomy: from per-slot log-probs to a verified tree

**Question.** How does DDTree turn the drafter's per-slot log-probs into a tree, what arrays does
the target's verify forward receive, and does SGLang's production tree-verify kernel accept the
same path as ours on a real cycle?
"""),
    code("""
import torch
import workbench as wb
import ddtree_kernels as K

engine = wb.load()
s = engine.session("def read_config(path):\\n    ", policy=wb.DDTree(budget=12), seed=0, max_new_tokens=64)
c = s.step()
while c.accepted < 2:       # a cycle where the target accepted a few drafted tokens
    c = s.step()
tok = engine.tokenizer
print(f"cycle {c.index}: {c.n_nodes} nodes, accepted {c.accepted} drafted tokens")
"""),
    code(IGNORE + """
wb.views.draft_heatmap(c, tok)
"""),
    md("""
**Best-first order.** A node is a prefix; its score is the sum of the drafter's log-probs along it.
The tree is the `budget` best prefixes, listed in the order a best-first search pops them
(score descending; ties by depth, then parent index, then token rank).
"""),
    code("""
for i in range(1, c.tokens.shape[0]):
    print(f"node {i:2d}: score {float(c.score[i]):7.3f}  depth {int(c.depth[i])}  rank {int(c.rank[i])}  parent {int(c.parents[i]):2d}  {tok.decode([int(c.tokens[i])])!r}")
"""),
    code("""
print("parents     ", c.parents.tolist())
print("depths      ", c.depth.tolist())
print("positions   ", c.position_ids.tolist(), " <- start + depth: siblings share a position")
print("next_token  ", c.retrieve_next_token.tolist())
print("next_sibling", c.retrieve_next_sibling.tolist())
"""),
    code(IGNORE + """
wb.views.mask_figure(c, tok)
"""),
    code("""
print(c.visibility.int())     # row i: the nodes node i may attend to (its ancestors and itself)
"""),
    md("""
**SGLang's kernel on this cycle.** `verify_tree_greedy_triton` (from the `sglang` wheel) walks the
same tree through the EAGLE retrieve arrays. On a CPU it runs under Triton's interpreter.
"""),
    code("""
tree = K.Tree(c.tokens[None], c.parents[None], c.depth[None], c.rank[None], c.score[None])
depth = int(c.depth.max())
compiled = K.compile_tree(tree, c.start, depth)
ours = K.accept("torch", tree, compiled, c.target_choice[None], depth)
theirs = K.accept("sglang", tree, compiled, c.target_choice[None], depth)
print("ours  :", ours.index[0].tolist(), "bonus", int(ours.bonus[0]))
print("sglang:", theirs.index[0].tolist(), "bonus", int(theirs.bonus[0]))
print("same:", torch.equal(ours.index, theirs.index) and torch.equal(ours.bonus, theirs.bonus))
"""),
    md("""
**What we learned.** The tree is fully determined by the per-slot log-probs and the budget; it is
flattened so every parent precedes its children, positions follow depth, and the verify mask is
the ancestor relation. SGLang's own greedy tree-verify kernel, fed our retrieve arrays, accepts the
same path and bonus as our vectorized walk.
"""),
]

NOTEBOOKS["04_forward_mode_shapes"] = [
    md("""
# 04 · Forward-mode shapes: what every forward computes, here and in SGLang

**Question.** Before grafting a tree onto SGLang's DFlash path: does SGLang's TARGET_VERIFY forward
compute logits for every draft token of every request, and EXTEND only for each request's last
token? How big is the verify mask at batch 8, prefix 512 and 16 tokens, and for a DDTree of 64
nodes, in each of SGLang's mask modes? What does a ragged batch of trees look like in SGLang's
`RaggedVerifyLayout`? Our engine runs Hugging Face forwards on `[bs, n]` tensors, which return logits
at every position, so its own shapes cannot answer this: each answer below comes from SGLang's
code (sglang 0.5.23, installed without its dependencies), named with the file it comes from.
"""),
    code("""
import workbench as wb
from workbench.shapes import sglang_layout as L

engine = wb.load()
traces = {}
for policy in [wb.AR(), wb.DFlash(), wb.DDTree(32)]:
    s = engine.session("def merge(a, b):\\n    ", policy=policy, max_new_tokens=24)
    with wb.shapes.capture(s):
        s.run()
    traces[str(policy)] = s.trace
"""),
    md("""
Our forwards side by side, rows aligned by module. The `(sglang layout)` rows at the end are the
tensors SGLang would build for the same forward: one flat token dimension, int32 `qo_indptr` /
`kv_indptr`, a flat custom mask for the tree, and only the logits rows its logits processor keeps.
"""),
    code("""
wb.shapes.compare(traces)
"""),
    code("""
wb.shapes.table(traces["DDTree(32)"], mode="TARGET_VERIFY", model="target", view="sglang")
"""),
    code("""
wb.shapes.check_contracts(traces["DDTree(32)"])
"""),
    md("""
### 1. Which logits rows does SGLang keep per mode?

`LogitsProcessor._get_pruned_states` (`sglang/srt/layers/logits_processor.py`) decides. Its module
cannot be imported on this machine (transformers' image processors want torchvision), so
`sglang_logits_rows` executes that one method from the installed file, on hidden states whose rows
carry their own index: what comes out is the list of rows SGLang keeps.
"""),
    code("""
for name in ("logits all rows", "logits last row", "logits with logprobs"):
    print(f"{name:22s}", L.SGLANG_RULES[name])
lens = [4, 5, 6]                                     # three requests, ragged
print("EXTEND, prompts of", lens, "tokens       -> rows", L.sglang_logits_rows("EXTEND", lens))
print("EXTEND with prompt log-probs        -> rows", L.sglang_logits_rows("EXTEND", lens, return_logprob=True))
verify = [16, 16, 16]                                # DFlash: 16 draft tokens per request
kept = L.sglang_logits_rows("TARGET_VERIFY", verify)
print(f"TARGET_VERIFY, 3 x 16 draft tokens  -> {len(kept)} rows of {sum(verify)}: {kept == list(range(sum(verify)))}")
"""),
    md("""
### 2. The verify mask: DFlash at bs 8, prefix 512, 16 tokens; a DDTree of 64 nodes

DFlash's worker passes no custom mask at all: its verify is a chain, causal attention suffices.
If a mask is handed in, `DFlashVerifyInput.generate_attn_arg_prefill` (`dflash_info.py`) pads it to
`sum(prefix) * n + n**2 * bs` entries; EAGLE's tree build (`eagle_utils.py`,
`build_tree_kernel_efficient`) allocates one per mask mode. Both are run below from the installed
source (the tree kernel itself is not run: only the allocation matters), next to our
`custom_mask_elements`, the one function the workbench uses for these sizes.
"""),
    code("""
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
"""),
    md("""
### 3. A ragged batch of trees in `RaggedVerifyLayout`

Three requests whose trees have 9, 65 and 17 nodes (root included), at prefixes 100, 512 and 37.
`RaggedVerifyLayout` (`sglang/srt/speculative/ragged_verify.py`) imports here and is used as is:
per-request `verify_lens`, `qo_indptr`, and the CUDA-graph token tier, from a grid built the way
`decode_cuda_graph_runner.py` builds it (`bs * tokens per request` for each captured batch size).
"""),
    code("""
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
"""),
    code("""
L.layout("TARGET_VERIFY", prefix_lens, verify_lens, tree=True, vocab_size=151936, hidden_size=4096, aux_layers=5)
"""),
    md("""
### Qwen3-8B with its DFlash-b16 drafter, batch 8, prompt 512, budget 64: no weights

`plan` builds both models on the meta device and runs this engine's forwards; each line gives our
`[bs, n]` layout and SGLang's flat one. The prefill keeps one logits row per request, as SGLang's
logits processor does (`prompt_logprobs=True` keeps every prompt row).
"""),
    code("""
import pathlib
configs = pathlib.Path(wb.__file__).parent / "configs"
p = wb.shapes.plan(configs / "qwen3-8b.json", batch=8, prompt_len=512, budget=64,
                   draft_config=configs / "qwen3-8b-dflash-b16.json")
print(p)
"""),
    code("""
p.sglang()
"""),
    md("""
**What we learned.** In SGLang, TARGET_VERIFY keeps a logits row for every draft token of every
request (48 of 48 above; 520 rows for DDTree(64) at batch 8), while EXTEND keeps only each
request's last row unless prompt log-probs are asked for: the Qwen3-8B prefill at batch 8 has 8
logits rows (2.3 MiB), not 8 x 512 (1.2 GiB). DFlash verifies its chain with no custom mask; a
mask at bs 8, prefix 512, 16 tokens would hold 67,584 entries in FULL_MASK and 2,048 in QLEN_ONLY.
A 64-node DDTree needs 294,912 (FULL_MASK) or 32,768 (QLEN_ONLY); with the root it is 65 tokens,
300,040 or 33,800. QLEN_ONLY_BITPACKING stops at 32 tokens per request (uint32 words), so no
DDTree of useful size fits it. A ragged batch of trees is exactly what `RaggedVerifyLayout`
describes: per-request `verify_lens`, a `qo_indptr` over them, and a graph tier the batch is
padded to.
"""),
    md("""
### Every family: an MLA target and a hybrid one

`plan` builds each family's own transformers model on the meta device: Llama, Qwen3-MoE (router logits
and experts touched), DeepSeek-V3 / Kimi-K2 (MLA: no `head_dim`, the cache is a latent), Qwen3-Next
and Qwen3.5 / 3.6 (from their nested `text_config`). `p.states` holds what each forward leaves behind,
by kind: per token (KV or latent), per request (a linear layer's conv window and recurrent state) and
per verified node (the copies SGLang's `MambaPool.SpeculativeState` keeps so any node can be committed).
"""),
    code("""
for name in ("deepseek-v3", "qwen3-next-80b-a3b"):
    q = wb.shapes.plan(configs / f"{name}.json", batch=8, prompt_len=512, budget=64)
    held = q.state_bytes("DDTree(64) verify (65 tokens)")
    print(name, {kind: wb.shapes.fmt_bytes(b) for kind, b in held.items()})
    keep = ("  " + q.facts.model_type, "  experts DDTree", "  linear attention")
    print("\\n".join(line for line in repr(q).splitlines() if line.startswith(keep)))
"""),
    md("""
**What we learned.** DeepSeek-V3 caches 576 numbers per token per layer (the 512-wide latent and the
64-wide rotary key), 68.6 KiB per token over 61 layers in bfloat16: 309 MiB for 8 requests of 577
tokens. Qwen3-Next keeps KV only in its 12 attention layers (24 KiB per token), but each of its 36
linear layers holds a 2 MiB float32 recurrent state per request, and a tree verify one per node: 73.7
MiB per node, against 12 MiB for a whole 512-token prompt's KV. A 65-node tree for 8 requests would
need 37.4 GiB of per-node copies, so a hybrid's tree verify has to avoid them (scan by tree level,
replay the accepted path), not copy SGLang's chain layout.
"""),
    md("""
## A real batched verify

The plan above is on the meta device. A batch session runs several requests for real: one drafter
forward and one TARGET_VERIFY forward per cycle for all of them, one tree per request, budgets and
prompt lengths differing. Our forward pads the trees to a common node count `[bs, N]` (inert padding
nodes, masked); SGLang flattens the same batch into `sum(1 + budget_i)` token rows with a ragged
`qo_indptr` (computed here by SGLang's own `RaggedVerifyLayout`).
"""),
    code("""
batch = engine.batch_session(
    ["def merge(a, b):\\n    ", "class Stack:\\n    def push(self, x):", "import json\\n"],
    policy=[wb.DDTree(16), wb.DDTree(32), wb.DDTree(8)], max_new_tokens=24)
batch.step()
lay = batch.verify_layout()
f = lay["padded"]["forward"]
print("requests (budget -> verified rows):", list(zip(lay["budgets"], lay["verify_lens"])))
print("ours, padded   input_ids", f["inputs"]["input_ids"]["shape"], " mask", f["inputs"]["attention_mask"]["shape"],
      " logits", lay["padded"]["logits"], f"= {lay['padded']['rows']} rows, {lay['padded']['padding_rows']} padding")
print("SGLang, ragged input_ids", lay["ragged"]["input_ids"], " logits", lay["ragged"]["logits"],
      " qo_indptr", lay["ragged"]["qo_indptr"], f"({lay['ragged']['source']})")
print("logits for every draft token of every request:", lay["every_draft_token_has_logits"])
"""),
    code("""
# The shapes tables take the batch session too: SGLang's rows for the same batched verify forward.
t = wb.shapes.table(batch, mode="TARGET_VERIFY", model="target", view="sglang")
[(r["tensor"], r["shape"], r["ours"]) for r in t if r["tensor"] in ("input_ids", "qo_indptr") or "logits" in r["tensor"]]
"""),
    code("""
batch.run()
[(s.policy, s.text[:40]) for s in batch.sessions]
"""),
    md("""
**What we learned from the real batch.** Every verified token of every request gets a logits row:
SGLang's flattened layout has exactly sum(1 + budget) rows; ours pads to batch x N and masks the padding.
"""),
    md("""
### 4. SGLang's own DFlash verify checks against this ragged batch

`check_contracts` above runs *our* contract checks. SGLang's DFlash worker has its own, in
`sglang/srt/speculative/dflash_utils.py`: every `if ...: raise` of the functions it runs on the verify
logits, read here from the installed file (nothing imported), with the branch of
`DFlashWorkerV2` that reaches each one and whether the batch above (node counts 17, 33 and 9:
ragged) passes it. Candidates are given two ways: flattened like the logits (SGLang's ragged layout)
and padded to `[bs, max nodes]`.
"""),
    code("""
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
"""),
    md("""
**What we learned from SGLang's checks.** A ragged batch of trees does not pass SGLang's DFlash verify
as it stands: flattened, it fails `candidates.ndim != 2` (and cannot be unpacked into `bs,
draft_token_num`); padded, it passes the dimension and sample-shape checks (the device checks pass by construction here: the
stand-in tensors carry real shapes but are all placed on `cuda:0`, so they say nothing about devices) but fails
`next_token_logits.shape[0] != bs * draft_token_num`, because its logits have `sum(nodes)` rows, not
`bs * block_size`; `apply_dflash_verify_logits_adjustments` fails the same row count against the
block size. Those checks guard only the sampling path (non-greedy requests) and the logit
adjustments (any `sampling_info`); the greedy path calls an accept kernel named `..._unchecked`, so
a ragged tree there meets no check at all and would be read with the chain's fixed stride: the
place a tree port must add its own check.
"""),
]

NOTEBOOKS["05_budget_sweep"] = [
    md("""
# 05 · Budget sweep: where does DDTree's throughput peak, and why?

**Question.** As the tree budget grows, how do tau, tokens/s and the time per stage change on the
evaluation prompts, the long excerpts and the short openings people type? We compare the measured
decode speedup over AR (the cycles alone) with its *ceiling*: the speedup the policy would reach if
its cycles cost only their model forwards (drafter and target). Their ratio is the share of cycle
time spent in the forwards, at most 1 by construction, so the gap is what the engine spends outside
them. All measured side by side, interleaved prompt by prompt, three repeats per split: a speed
order is stated only where it holds across the repeats' spread (`wb.analysis.order_verdict`). The
prompt sets and sizes of every figure are listed in `docs/figures.md`. Then: what sampling does to tau.
"""),
    code(IGNORE + """
import workbench as wb
from workbench.bench.runs import bench
from workbench.bench.prompts import eval_prompts

engine = wb.load()
policies = [wb.AR(), wb.DFlash()] + [wb.DDTree(b) for b in (1, 4, 16, 64, 256)]
results = {split: bench(engine, policies, eval_prompts(split)[:4], max_new_tokens=48, repeats=3, progress=True)
           for split in ("long", "short")}
result, prompts = results["long"], eval_prompts("long")
"""),
    code("""
print("lossless (greedy == AR for every prompt):", all(r.lossless for r in results.values()))
print(f"{'policy':12s} {'tau long':>9s} {'tau short':>9s}")
for name in result.summary:
    print(f"{name:12s} {results['long'].summary[name]['tau']:9.2f} {results['short'].summary[name]['tau']:9.2f}")
"""),
    code(IGNORE + """
for split, r in results.items():
    print(split)
    for name, row in r.summary.items():
        lo, hi = min(row["speedup_vs_ar_per_repeat"]), max(row["speedup_vs_ar_per_repeat"])
        print(f"  {name:12s} tok/s {row['tokens_per_s']:7.1f}  speedup {row['speedup_vs_ar']:.2f}x "
              f"[{lo:.2f}-{hi:.2f} over repeats]  decode speedup {row['decode_speedup_vs_ar']:.2f}x  "
              f"ceiling {row['ceiling_speedup']:.2f}x  share of cycle in forwards {row['ceiling_ratio']:.0%}")
"""),
    md("""
**What the speed figures allow.** A speedup from one run is not a conclusion: on a loaded machine the
same DDTree(16) has measured 1.80x and 0.40x AR. The verdict below orders the policies by their
speedup over AR only where the min-max ranges over the three interleaved repeats do not overlap; where
they do, it says the machine was too noisy and no order is claimed.
"""),
    code(IGNORE + """
for split, r in results.items():
    print(split, "->", wb.analysis.order_verdict(r.summary, labels=["AR", "DFlash", "DDTree(16)", "DDTree(64)"]))
"""),
    code(IGNORE + """
wb.views.budget_sweep_figure(result.summary)
"""),
    md("""
A median hides the slow cycles that decide throughput: per stage, milliseconds per steady cycle as
p50 / p90 / max (the first cycle of each run left out), then the time outside the cycles.
"""),
    code(IGNORE + """
from workbench.bench.runs import percentile_table
print(percentile_table(result.summary))
"""),
    md("""
**Sampling.** At temperature > 0 the target draws one sample at every tree node and the walk follows
the child that matches it (lossless; for deterministic drafts it accepts exactly as often as
SGLang's target-only tree sampling). How does tau change with the temperature? DDTree(16), the
same prompts and seeds:
"""),
    code("""
def pooled_tau(temperature):
    lengths = []
    for i, p in enumerate(prompts[:4]):
        t = engine.generate(p["prompt"], wb.DDTree(16), max_new_tokens=48, temperature=temperature, seed=i)
        lengths += t.accept_lengths
    return sum(lengths) / len(lengths)

for temperature in (0.0, 0.3, 0.6, 1.0):
    print(f"temperature {temperature:.1f}: tau {pooled_tau(temperature):.2f}")
"""),
    md("""
**What we learned.** tau keeps rising with the budget but saturates, since deeper and wider
alternatives are ever less likely to be what the target says (tau does not depend on the machine's
load); the verify forward grows with every node, so throughput should peak at a middle budget. Whether
this run shows that peak is what the verdict lines above say: an order is claimed only where it held
across the repeats' spread, and "too noisy" means this machine could not tell. The measured decode speedup stays below its
ceiling, and the share of cycle time spent in the forwards says how much: what is left is the
engine's own work (tree build and compile, accept, commit, record keeping), which matters most
when, as here, the model forwards are cheap.

tau falls as the temperature rises. At temperature 0 the target's choice is its argmax, which the
drafter was trained to predict. When sampling, a drafted child is accepted only when the target's
draw equals it, which happens with the target's probability of that token; temperature spreads the
target's probability over more tokens, so drafted tokens are drawn less often and the walk stops
earlier. Sampling stays lossless; it is the speedup that shrinks.
"""),
]

NOTEBOOKS["06_real_checkpoints"] = [
    md("""
# 06 · Real checkpoints: the same workbench on a GPU host

**Question.** What does a GPU-host user type to run a real target and its DFlash drafter (for
example Qwen3-8B and z-lab's Qwen3-8B-DFlash-b16)? The same functions load the embedded default and
published checkpoints. Where your checkpoints are not on this machine, a tiny random pair written in
the very same on-disk layout stands in (z-lab's drafter config, a mask id the tokenizer has no
string for), so every cell below runs here too; cells that need CUDA say so and print why they skip.
"""),
    code("""
import os, pathlib, sys, tempfile, torch
import workbench as wb

TARGET = os.environ.get("WB_TARGET", "/models/Qwen3-8B")              # your target: a local HF directory
DRAFT = os.environ.get("WB_DRAFT", "/models/Qwen3-8B-DFlash-b16")     # its DFlash drafter
has_cuda = torch.cuda.is_available()
if not (os.path.isdir(TARGET) and os.path.isdir(DRAFT)):
    sys.path.insert(0, str(pathlib.Path(wb.__file__).parents[1] / "tests"))
    from real_layouts import write_draft, write_qwen3     # the test suite's writers of published layouts
    stand_in = pathlib.Path(tempfile.mkdtemp())
    TARGET, DRAFT = write_qwen3(stand_in / "target"), write_draft(stand_in / "draft", "zlab")
    print("stand-in: a tiny random Qwen3 target and DFlash drafter in the published layout")
print("CUDA available:", has_cuda)
"""),
    md("""
Loading: `dtype="auto"` (the default) keeps the checkpoint's own dtype (bfloat16 for Qwen3-8B; the
embedded pair is float32), weights go straight onto the device, and a target larger than one GPU
takes `device_map="auto"`. A checkpoint that needs its own Python code (Kimi-K2) loads only with
`trust_remote_code=True`; hybrid targets load for the families whose tree verify is built (Qwen3-Next,
Qwen3.5 / 3.6: notebook 08) and are refused, with the reason, for others. The
notes say what the loader noticed, here that the drafter's mask id has no string in the tokenizer
(as in z-lab's Qwen3 drafters: only its embedding is used).
"""),
    code("""
engine = wb.load(target=TARGET, draft=DRAFT, device="cuda" if has_cuda else "cpu",
                 kernel_backend="sglang" if has_cuda else "torch")
engine
"""),
    md("Bad pairs are refused before any weights load, with messages that name both values:"),
    code("""
try:
    wb.load(target="/models/does-not-exist")
except wb.ModelPairError as e:
    print("ModelPairError:", e)
"""),
    md("""
z-lab's drafters were trained on chat-formatted, non-thinking prompts, so give the session
`messages=`: the target tokenizer's chat template is applied (with `enable_thinking=False` where the
template has that switch). Raw text goes in as `prompt=` (with the BOS the tokenizer would add, as
Llama 3's does) and exact ids as `prompt_ids=`; the trace records which was used.
"""),
    code("""
chat = [{"role": "user", "content": "Write a Python function that parses an HTTP header line."}]
s = engine.session(messages=chat, policy=wb.DDTree(64), max_new_tokens=64)
meta = s.trace.meta
print(meta["prompt_format"], meta["chat_template_kwargs"], "|", len(s.prompt_ids), "prompt tokens:")
print(s.prompt)
"""),
    code(IGNORE + """
print(s.run().summary())
"""),
    code("""
ar = engine.session(messages=chat, policy=wb.AR(), max_new_tokens=64)
ar.run()
d = wb.first_divergence(s, ar, tokenizer=engine.tokenizer)
print("DDTree(64) == AR token for token:", s.tokens == ar.tokens, "|", "identical" if d is None else d)
"""),
    md("""
## Lossless, precisely: float32 vs bfloat16

Greedy speculative decoding is **token-for-token lossless in float32** and **lossless up to
near-ties in reduced precision**. A tree-verify forward and a one-token decode (or a CPU and a CUDA
kernel) round differently; where the target's two best tokens are within rounding of each other
(bfloat16 keeps 8 bits of mantissa) the argmax can flip, and the outputs go their own ways from
there. Every `Cycle` keeps the target's top-2 tokens and logits at each verified node, so
`wb.first_divergence` shows where two runs part and whether a near-tie explains it. In float32 the
same engine's DDTree and AR outputs are identical:
"""),
    code("""
from workbench.bench.prompts import eval_prompts
cpu32 = wb.load()
p = eval_prompts()[0]["prompt"]
fp32_ar, fp32_tree = (cpu32.session(p, policy=pol, max_new_tokens=64) for pol in (wb.AR(), wb.DDTree(32)))
fp32_ar.run(); fp32_tree.run()
print("float32 DDTree(32) == AR:", fp32_tree.tokens == fp32_ar.tokens, "| first divergence:", wb.first_divergence(fp32_tree, fp32_ar))
"""),
    md("""
A real divergence on this CPU: bfloat16 DDTree(32) against float32 AR on the evaluation prompts,
stopping at the first prompt whose outputs differ (its output is not compared by the tests: bfloat16
rounding on a CPU depends on its instruction set; the cell still fails if a divergence is not a near-tie).
"""),
    code("""
# NBVAL_IGNORE_OUTPUT
cpu16 = wb.load(dtype="bfloat16")
found = None
from tqdm.auto import tqdm

for i, item in enumerate(tqdm(eval_prompts()[:12], desc="prompts", leave=False)):
    ref = cpu32.session(item["prompt"], policy=wb.AR(), max_new_tokens=64); ref.run()
    low = cpu16.session(item["prompt"], policy=wb.DDTree(32), max_new_tokens=64); low.run()
    found = wb.first_divergence(low, ref, tokenizer=cpu32.tokenizer)
    if found is not None:
        break
if found is None:
    print(f"no divergence: bfloat16 and float32 agreed token for token on all {i + 1} prompts tried")
else:
    print(f"prompt {i}: {found.position} tokens agree, then")
    print(found)
    assert found.near_tie, found.cause
"""),
    md("""
On a GPU host the same comparison runs on CUDA, with the accept walk in SGLang's CUDA JIT kernel
(`kernel_backend="sglang"`): the kernel in use, a bfloat16 run beside a float32 run, and the
divergence explanation. `tests/gpu/check_cuda.py` runs this (and more) as a check.
"""),
    code("""
# Needs CUDA: skipped with a reason otherwise.
if has_cuda:
    from ddtree_kernels.sglang_backend import kernel_name
    gpu16 = wb.load(device="cuda", dtype="bfloat16", kernel_backend="sglang")
    gpu32 = wb.load(device="cuda", dtype="float32", kernel_backend="sglang")
    print("accept kernel:", kernel_name(gpu16.kernel_backend, gpu16.device))
    for item in eval_prompts()[:8]:
        r16 = gpu16.session(item["prompt"], policy=wb.DDTree(32), max_new_tokens=64); r16.run()
        r32 = gpu32.session(item["prompt"], policy=wb.DDTree(32), max_new_tokens=64); r32.run()
        d = wb.first_divergence(r16, r32, tokenizer=gpu16.tokenizer)
        print(f"bf16: {r16.text[:60]!r}")
        print(f"fp32: {r32.text[:60]!r}")
        print("  ->", d if d else "identical")
else:
    print("skipped: no CUDA device here (torch.cuda.is_available() is False); on a GPU host this cell "
          "runs the embedded pair in bfloat16 and float32 through SGLang's CUDA JIT kernel")
"""),
    md("""
The GPU check: float32 on CUDA against the CPU, bfloat16 divergences explained as near-ties, the
accept kernels against each other, and per-stage timings, in one JSON report (a few minutes).
"""),
    code("""
# Needs CUDA: skipped with a reason otherwise.
import subprocess
check = [sys.executable, str(pathlib.Path(wb.__file__).parents[1] / "tests/gpu/check_cuda.py"),
         "--target", str(TARGET), "--draft", str(DRAFT)]
if has_cuda:
    subprocess.run(check, check=True)
else:
    print("skipped: no CUDA device here; on the GPU host: python tests/gpu/check_cuda.py --target $WB_TARGET --draft $WB_DRAFT")
"""),
    md("Planning a deployment needs no GPU and no weights: shapes from the config alone."),
    code("""
import pathlib
configs = pathlib.Path(wb.__file__).parent / "configs"
wb.shapes.plan(configs / "qwen3-8b.json", batch=1, prompt_len=1024, budget=128,
               draft_config=configs / "qwen3-8b-dflash-b16.json")   # with the drafter's block forward
"""),
    md("""
## An engine that outlives the notebook

Loading an 8B target and its drafter takes minutes; a kernel restart should not throw that away,
and two notebooks should be able to share one loaded engine. On the GPU host the engine runs in
its own process, and notebooks attach to it:

```
python -m workbench serve --target DIR --draft DIR --device cuda --token-file ~/.wb-token
```

It binds 127.0.0.1 (reach it through an SSH tunnel) and needs its token on every request. Here we
serve the embedded default from a subprocess on loopback, the same way.
"""),
    code(IGNORE + """
import os, pathlib, signal, subprocess, sys, tempfile

work = pathlib.Path(tempfile.mkdtemp())
token_file, server_log = work / "token", open(work / "server.log", "w")
env = {**os.environ, "PYTHONPATH": str(pathlib.Path(wb.__file__).parents[1])}  # the workbench this kernel runs
server = subprocess.Popen([sys.executable, "-m", "workbench", "serve", "--port", "0", "--threads", "1",
                           "--token-file", str(token_file), "--session-ttl", "600"],
                          stdout=subprocess.PIPE, stderr=server_log, text=True, env=env)
for line in server.stdout:           # the server says where it listens once the models are loaded
    print(line.rstrip())
    if "listening on" in line:
        url = line.split("listening on ")[1].strip()
        break
"""),
    md("`wb.connect` returns an object with the local engine's API; the client needs only the standard library."),
    code("""
remote = wb.connect(url, token_file=token_file)
info = remote.info
print(info["models"]["target_layers"], "target layers on", info["device"], info["dtype"], "| wire version", info["wire_version"])
print("limits:", info["limits"])
"""),
    code("""
s = remote.session("def parse_header(line):\\n    ", policy=wb.DDTree(budget=16), max_new_tokens=48)
c = s.step()                       # one cycle on the server -> a wb.Cycle, as a local session returns
print(type(c).__name__, "| cycle", c.index, "|", c.n_nodes, "nodes,", c.accepted, "accepted |", repr(s.text))
"""),
    code(IGNORE + """
wb.views.tree_figure(c, remote.tokenizer)   # the views read the Cycle; the tokenizer comes from the server
"""),
    md("The records are the very ones a local engine makes (timings aside):"),
    code("""
local = wb.load().session("def parse_header(line):\\n    ", policy=wb.DDTree(budget=16), max_new_tokens=48)
lc = local.step()
same = {k: v for k, v in lc.to_dict().items() if k != "stage_seconds"} == {k: v for k, v in c.to_dict().items() if k != "stage_seconds"}
print("remote cycle == local cycle:", same)
"""),
    md("""
**Surviving a kernel restart.** The session lives on the server; keep its id (here a variable,
in practice a file or the notebook itself) and re-attach after the restart: the whole trace comes back.
"""),
    code("""
session_id = s.id
del remote, s, c                   # all a kernel restart loses
remote = wb.connect(url, token_file=token_file)
s = remote.session_by_id(session_id)
print(len(s.cycles), "cycle(s) back |", repr(s.text))
t = s.run()                        # carry on where it stopped
print(f"{len(t.cycles)} cycles, tau {t.tau:.2f}, {t.new_tokens} new tokens, finished: {t.finish_reason}")
"""),
    code("""
wb.shapes.check_contracts(s)       # shapes tables and contract checks take a remote session as they take a local one
"""),
    md("Stopping the server (Ctrl-C, SIGINT or SIGTERM) finishes the running cycle, drops the live sessions with a log line, and exits cleanly."),
    code("""
server.send_signal(signal.SIGINT)
print("server exit code:", server.wait(timeout=120))
server_log.close()
print(next(l for l in (work / "server.log").read_text().splitlines() if "stopped" in l).split(";")[0])
"""),
    md("""
**What we learned.** Nothing in the workbench is specific to the embedded models: `wb.load` takes
local directories in every published DFlash layout, keeps the checkpoint's dtype, validates the pair,
and never downloads; chat prompts go through the target's own template. With CUDA the
accept walk runs through SGLang's own CUDA JIT kernel. Greedy speculative decoding is lossless token
for token in float32 and up to near-ties in reduced precision, and `wb.first_divergence` tells the
two apart from the recorded top-2 logits. And the engine need not live in the notebook:
`python -m workbench serve` keeps it loaded, and `wb.connect` attaches any notebook to it with the same API.
"""),
]

NOTEBOOKS["07_tree_policies"] = [
    md("""
# 07 · Tree policies: DDTree beside SGLang's EAGLE tree, your own tree, and is the drafter calibrated?

**Questions.** (1) Built from the *same* DFlash drafter, which tree accepts more per verified token:
DDTree (the best prefixes of the drafter's per-slot log-probs), the top-k-per-step tree that SGLang's
EAGLE worker builds, a linear chain, or a tree of our own? (2) DDTree ranks prefixes by the drafter's
probabilities: are those probabilities calibrated? (3) After one run, how large a tree would each
cycle have needed, and does that predict what smaller budgets will do?
"""),
    code("""
import torch
import workbench as wb
from ddtree_kernels import Tree
from workbench.bench.runs import bench
from workbench.bench.prompts import eval_prompts

engine = wb.load()
prompts = eval_prompts("long")[:2] + eval_prompts("short")[:2]  # both splits
"""),
    md("""
A custom policy is a function `build(logprobs [bs, D, V], root_tokens [bs], budget) -> Tree`. This one
is a *caterpillar*: the drafter's argmax chain, plus the runner-up token beside each chain node.
"""),
    code("""
def caterpillar(logprobs, root_tokens, budget):
    bs, D, V = logprobs.shape
    v, i = torch.topk(logprobs.float(), 2, dim=-1)                # [bs, D, 2]
    depth = min(D, (budget + 1) // 2)                            # chain nodes 1..depth
    side = min(depth, budget - depth)                            # runner-ups at depths 1..side
    chain_score = v[:, :depth, 0].cumsum(1)
    parent_score = torch.cat([torch.zeros(bs, 1), chain_score], 1)[:, :side]
    ar = lambda a, b: torch.arange(a, b).expand(bs, -1)
    zero, one = torch.zeros(bs, 1, dtype=torch.long), torch.ones(bs, side, dtype=torch.long)
    return Tree(
        tokens=torch.cat([root_tokens.reshape(bs, 1), i[:, :depth, 0], i[:, :side, 1]], 1),
        parents=torch.cat([zero - 1, ar(0, depth), ar(0, side)], 1),       # side node at depth d hangs off chain node d-1
        depth=torch.cat([zero, ar(1, depth + 1), ar(1, side + 1)], 1),
        rank=torch.cat([zero, torch.zeros(bs, depth, dtype=torch.long), one], 1),   # token rank: 0 on the chain
        score=torch.cat([torch.zeros(bs, 1), chain_score, parent_score + v[:, :side, 1]], 1),
    )

custom = wb.TreePolicy(caterpillar, name="caterpillar", budget=15)
"""),
    md("The engine checks every tree a custom policy returns, and names the first thing wrong:"),
    code("""
def sloppy(logprobs, root_tokens, budget):
    t = caterpillar(logprobs, root_tokens, budget)
    return Tree(t.tokens, t.parents.flip(1), t.depth, t.rank, t.score)   # parents scrambled

try:
    engine.session("x = 1\\n", policy=wb.TreePolicy(sloppy, name="sloppy", budget=15)).step()
except ValueError as e:
    print(type(e).__name__ + ":", e)
"""),
    md("""
**Equal verified tokens.** Each cycle the target verifies the root plus the drafted nodes: `DDTree(N)`,
`EagleTree(num_draft_tokens=N + 1)` and a custom tree of budget N all verify N + 1 tokens; linear DFlash
verifies its whole block (16). `EagleTree(topk, steps, n)` uses SGLang's `speculative_eagle_topk`,
`speculative_num_steps` and `speculative_num_draft_tokens`.
"""),
    code(IGNORE + """
policies = [wb.AR(), wb.DFlash(), custom,
            wb.DDTree(15), wb.EagleTree(topk=4, steps=8, num_draft_tokens=16),
            wb.DDTree(31), wb.EagleTree(topk=4, steps=8, num_draft_tokens=32)]
verified = {"DFlash": 16}
for p in policies[2:]:
    verified[str(p)] = p.budget + 1
result = bench(engine, policies, prompts, max_new_tokens=48, repeats=3, progress=True)
"""),
    code("""
print("lossless (greedy == AR for every prompt and policy):", result.lossless)
print(f"{'policy':22s} {'verified':>8s} {'tau':>6s} {'tau/verified':>12s}")
for name, n in verified.items():
    tau = result.summary[name]["tau"]
    print(f"{name:22s} {n:8d} {tau:6.2f} {tau / n:12.3f}")
"""),
    code(IGNORE + """
for name in verified:
    row = result.summary[name]
    lo, hi = min(row["speedup_vs_ar_per_repeat"]), max(row["speedup_vs_ar_per_repeat"])
    print(f"{name:22s} {row['tokens_per_s']:7.1f} tok/s   speedup over AR {row['speedup_vs_ar']:.2f}x "
          f"[{lo:.2f}-{hi:.2f} over 3 interleaved repeats]")
# An order of speed is claimed only where the repeats' ranges separate; else: too noisy.
print(wb.analysis.order_verdict(result.summary, labels=["DDTree(15)", "EagleTree(4, 8, 16)", "DFlash"]))
rows = [{"family": name.split("(")[0], "policy": name, "verified": n, "tau": result.summary[name]["tau"]}
        for name, n in verified.items()]
wb.views.policy_compare_figure(rows)
"""),
    md("""
**Calibration.** One DDTree run per prompt at a large budget, recording the drafter's top-64 tokens per
slot. A node's *drafted path probability* is the product of the drafter's probabilities along its path;
it is *accepted* when the target's own continuation starts with that path. A calibrated drafter's
nodes of probability p are accepted a share p of the time.
"""),
    code("""
big = [engine.session(p["prompt"], policy=wb.DDTree(64), max_new_tokens=48, record_topk=64).run() for p in prompts]
cal = wb.analysis.calibration(big, bins=10)
print(cal)
for row in cal.depth_table()[:6]:
    print(f"depth {row['depth']}: accepted {row['rate']:.0%} of {row['reached']} reached cycles "
          f"(drafter's mass on the drafted children: {row['predicted']:.0%})")
"""),
    code(IGNORE + """
wb.views.reliability_figure(cal)
"""),
    md("""
**Budget needed.** After the run the target's continuation is known, so for every cycle we can rank its
length-L prefix among all the drafter's prefixes: that rank is the number of nodes a best-first tree
needed to contain it. From the same runs we predict tau at smaller budgets and compare with the
measured DDTree(15) and DDTree(31) above (different runs: the cycles start at other places).
"""),
    code("""
need = wb.analysis.budget_needed(big)
print(need)
errors = {}
for b in (15, 31):
    pred, meas = need.tau_at(b), result.summary[f"DDTree({b})"]["tau"]
    errors[b] = (pred - meas) / meas
    print(f"budget {b}: predicted tau {pred:.2f}, measured {meas:.2f} ({errors[b]:+.1%})")
print(f"at the run's own budget 64: predicted {need.tau_at(64):.3f} = measured "
      f"{sum(sum(t.accept_lengths) for t in big) / sum(len(t) for t in big):.3f}")
"""),
    code(IGNORE + """
wb.views.budget_needed_figure(need, measured={b: result.summary[f"DDTree({b})"]["tau"] for b in (15, 31)})
"""),
    md("""
**What we learned.** All four tree shapes are lossless, so only their acceptance and cost differ. With
the same per-slot log-probs, DDTree takes the globally best prefixes while SGLang's EAGLE tree can only
extend the top-k paths of each step, so at equal verified tokens DDTree should accept at least as much;
the table shows by how much (on the embedded pair: clearly more at both 16 and 32 verified tokens). The
hand-made caterpillar and the linear chain trail both. tau is a count, the same on any machine; speed
is not, so the verdict line above states a speed order only where it held across the three
interleaved repeats, and says "too noisy" otherwise. The reliability diagram tests DDTree's premise directly: the printed ECE and the
per-depth rates show how close the drafter's path probabilities are to the target's acceptance (a
calibrated drafter sits on the diagonal). The budget-needed curve, from a single run, predicts tau at
other budgets to within the printed error, and reproduces the run's own tau exactly: it tells where to
set the budget before spending GPU hours on sweeps.
"""),
]

NOTEBOOKS["09_verify_cost"] = [
    md("""
# 09 · What a verify costs on a GPU: when is a tree free?

**Question.** On a GPU a decode step streams every weight once, and a verify of a few hundred tokens
streams them once too: up to some size the extra tree nodes ride along for free. Where does a tree
verify stop being free for Qwen3-8B and Qwen3-Coder-30B-A3B on an H200 and an RTX PRO 6000, at batch
1 and 8? How does that move with batch size and prompt length? And given the embedded drafter's
acceptance, what would a tree buy at each budget? Everything below is computed from configs
(`wb.shapes.cost`: FLOPs as `FlopCounterMode` counts them, bytes moved, a roofline per GPU) plus one short
run of the embedded pair on this CPU, which sits in the other regime.
"""),
    code("""
import workbench as wb

for name, g in wb.shapes.cost_gpus().items():
    print(f"{name:24s} {g.flops / 1e12:7.1f} TFLOP/s bf16 dense  {g.bandwidth / 1e12:5.2f} TB/s  "
          f"ridge {g.ridge:4.0f} FLOP/byte")
"""),
    md("""
One table: every forward a DDTree decode of Qwen3-8B runs, at batch 1 with a 512-token prompt on an
H200. DECODE does 1 FLOP per byte; the ridge is 206, so it is memory-bound by a factor of 200 and a
verify can add nodes until its FLOPs catch up with the weight bytes it reads anyway.
"""),
    code("""
c = wb.shapes.cost("qwen3-8b", gpu="H200", batch=1, prompt_len=512, budgets=[4, 16, 64, 256],
                   draft_config="qwen3-8b-dflash-b16")
c
"""),
    md("""
**Where verify stops being free** (largest budget B whose verify of 1 + B tokens per request costs at
most 1.1x the DECODE forward, solved over the integers), with the verify / decode cost ratio at a few
budgets:
"""),
    code("""
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
"""),
    md("""
Qwen3-8B (dense): at batch 1 a tree of about 200-300 nodes is free; the RTX PRO 6000 has a higher ridge
(it has half the H200's FLOP/s but only 37% of its bandwidth), so its free budget is larger. At batch 8
the same weight read serves 8 requests' trees, so each request's share of the free tokens is about an
eighth.

Qwen3-Coder-30B-A3B (MoE, 128 experts, 8 per token) is different: a decode step reads only the 8 experts
its token picked in each layer, and every extra tree node picks its own 8. Under balanced routing (the
model's assumption: distinct tokens route independently) a verify of 17 tokens touches about 84 of the
128 experts per layer, so verify costs several decodes and no budget is free. It saturates once every
expert is touched (B around 64); beyond that it is flat again until compute catches up. Real routing
within one context is correlated, so this is the pessimistic end; batch 8 already touches half the
experts during decode, which is why the ratio is smaller there.

**How it moves with batch size and prompt length** (Qwen3-8B on the H200, free budget per request):
"""),
    code("""
lens = (128, 512, 4096, 32768)
print(f"{'batch':>5s} " + " ".join(f"{'prompt ' + str(P):>13s}" for P in lens))
for batch in (1, 2, 4, 8, 16, 32):
    row = [wb.shapes.cost("qwen3-8b", gpu="H200", batch=batch, prompt_len=P, budgets=[]).free_budget for P in lens]
    print(f"{batch:5d} " + " ".join(f"{b:13d}" for b in row))
"""),
    md("""
Batch divides the free budget while the weights dominate the bytes: FLOPs grow with batch x tokens,
the weights are read once. Prompt length pulls towards a second limit. Every verify node attends to
the whole context (4 x heads x head_dim FLOPs per cached token per layer) while the cache is read once
for all nodes (4 x kv_heads x head_dim bytes per token per layer in bf16), so attention alone does
about heads / kv_heads = 4 FLOPs per byte per node and turns compute-bound near ridge / 4, about 50
nodes, whatever the batch. At batch 1 the weights dominate and a long prompt *lowers* the free budget
(222 -> 130 at 32k); at batch 16-32 the KV cache dominates decode's bytes and a long prompt *raises* it
towards that limit.

**This CPU is the other regime.** A short sweep of the embedded pair (6-layer target, hidden 256):
tau per budget measured, and the measured verify time per cycle. Here compute is the limit, so every
node costs time:
"""),
    code("""
from workbench.bench.prompts import eval_prompts

engine = wb.load()
prompts = [p["prompt"] for p in eval_prompts("long")[:3]]
sweep = {B: [engine.generate(p, wb.DDTree(B), max_new_tokens=48, record_topk=64) for p in prompts] for B in (4, 16, 64)}
measured_tau = {B: sum(sum(t.accept_lengths) for t in ts) / sum(len(t) for t in ts) for B, ts in sweep.items()}
need = wb.analysis.budget_needed(sweep[64])     # tau at every budget up to 64, from the DDTree(64) runs
print("measured tau:", {B: round(t, 3) for B, t in measured_tau.items()})
print("tau from budget_needed:", {B: round(need.tau_at(B), 3) for B in (1, 2, 4, 8, 16, 32, 64)})
"""),
    md("""
The CPU's verify time per budget, measured directly: one target forward over 1 + B tokens after a
256-token prefix, the budgets interleaved and the fastest of 5 repeats kept (the machine is shared).
"""),
    code(IGNORE + """
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
"""),
    md("""
**What a tree buys.** The speedup a DDTree of budget B would reach over AR on the GPU, from the roofline
(one drafter forward + one verify per cycle, committing tau(B) tokens; AR commits one per DECODE), with
tau(B) from the embedded drafter's runs above. The embedded pair is a stand-in: a real Qwen3-8B drafter
has its own acceptance, and the model ignores kernel launches and the engine's own time (which decide
small models; see 05). Qwen3-Coder has no drafter config here, so its drafter is costed at 0 s (a ceiling).
"""),
    code("""
taus = {B: need.tau_at(B) for B in (1, 2, 4, 8, 16, 32, 64)}
preds = {}
for label, (cfg, dcfg) in models.items():
    for gpu in ("H200", "RTX PRO 6000"):
        for batch in (1, 8):
            sp = wb.shapes.cost(cfg, gpu=gpu, batch=batch, draft_config=dcfg).speedup(taus)
            preds[label, gpu, batch] = sp
            row = "  ".join(f"{r['budget']}:{r['speedup']:.2f}x" for r in sp.rows)
            print(f"{label:20s} {gpu:13s} batch {batch}: best B={sp.best['budget']:>2d} ({sp.best['speedup']:.2f}x)  {row}")
"""),
    code(IGNORE + """
wb.views.speedup_figure([preds[k] for k in preds if k[2] == 1])
"""),
    md("""
Dense Qwen3-8B at batch 1: verify stays free up to 220 nodes, so the best budget is the largest one this
drafter's tau still rises at; at batch 8 the verify turns compute-bound past about 27 nodes per request
and the best budget drops. Qwen3-Coder at batch 1 barely gains: every node reads new experts, so the
verify grows faster than tau. At batch 8 decode already reads half the experts and the tree pays again.
"""),
    md("""
## CUDA graph readiness checklist

A CUDA graph records a forward's kernels once and replays them with one launch. A model as small as the
embedded pair does little work per kernel, so on a GPU its step is expected to be bound by kernel launches
rather than compute (an expectation: this repository stores no GPU timing of it), which is where graphs
help. A replay reads the same addresses with the same shapes, so a capturable forward needs: the
same input shapes every cycle (trees padded to one node count), the same storage (inputs copied into
kept buffers, K/V and mask preallocated, never regrown), and no host read between the draft and the
verify forward (the host must not wait for the device mid-cycle). `workbench.engine.graphs.readiness` checks
each on a live session of the embedded pair: pre-hooks on the target and the drafter record every
forward's tensor inputs (shape and address, the K/V store included), and a log of host reads runs
from the draft stage to the end of the verify stage. The default (dynamic) engine against
`static_shapes=True`:
"""),
    code("""
from workbench.engine.graphs import readiness

prompt = eval_prompts("long")[0]["prompt"]
checks = {st: readiness(engine, prompt, wb.DDTree(16), max_new_tokens=24, static_shapes=st) for st in (False, True)}
print(f"{'requirement':58s} {'dynamic':>8s} {'static':>8s}   evidence (static | dynamic)")
for req in checks[True]:
    (d_ok, d_ev), (s_ok, s_ev) = checks[False][req], checks[True][req]
    print(f"{req:58s} {'yes' if d_ok else 'no':>8s} {'yes' if s_ok else 'no':>8s}   {s_ev} | {d_ev}")
"""),
    md("""
The dynamic engine fails nearly every requirement by design: its verify mask widens with the prefix,
its trees have as many nodes as they find, the drafter's context is as long as the last accept, and
on a CPU the tree build reads the top-k on the host (a heap is cheaper there than tensor calls). With
`static_shapes=True` every forward of a fixed policy has one shape and one set of buffers, attention
reads the whole preallocated capacity (the mask hides the unused columns), lengths live on the device,
and the tree is built by the device kernel; the tokens stay the same. On CUDA, `wb.load(...,
cuda_graphs=True)` captures the draft and the verify forward once per (batch, nodes, length bucket)
and replays them (`tests/gpu/check_cuda.py`, section `cuda_graphs`, compares replay with eager; it has
not run on a GPU yet).

**What SGLang's graph runner captures**, read from the installed source without importing it (as
notebook 04 does): the decode runner captures TARGET_VERIFY when speculative decoding is on, at a
static width of `num_draft_tokens` tokens per request, for each batch size of its configured list
that passes the alignment filters, with input buffers sized for the largest batch:
"""),
    code("""
import ast
from workbench.shapes.sglang_source import CUDA_GRAPH_RUNNER, _parsed, expressions_in, find_def

BASE = "srt/model_executor/runner/base_cuda_graph_runner.py"
BUFFERS = "srt/model_executor/runner_utils/buffers.py"
init = expressions_in(find_def(_parsed(CUDA_GRAPH_RUNNER), "DecodeCudaGraphRunner.__init__"))
wanted = ("self.capture_forward_mode = ForwardMode.TARGET_VERIFY", "self.captured_req_width =",
          "self.capture_bs, self.compile_bs =", "self.max_num_token =")
print(CUDA_GRAPH_RUNNER, "(DecodeCudaGraphRunner.__init__):")
for w in wanted:
    for e in sorted(x for x in init if x.startswith(w)):
        print("  ", e)
print(BASE, "(get_batch_sizes_to_capture):")
for e in sorted(x for x in expressions_in(find_def(_parsed(BASE), "get_batch_sizes_to_capture"))
                if x.startswith("capture_bs = ")):
    print("  ", e)
print(BUFFERS, "(DecodeInputBuffers.create): the static input buffers")
for n in ast.walk(find_def(_parsed(BUFFERS), "DecodeInputBuffers.create")):
    if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and ast.unparse(n.value.func) in ("torch.zeros", "torch.full", "torch.empty")):
        print(f"   {ast.unparse(n.targets[0]):34s} {ast.unparse(n.value.args[0])}")
"""),
    md("""
So SGLang's captured verify is `[max_bs * num_draft_tokens]` tokens flat (`input_ids`, `positions`,
`out_cache_loc` per token; `seq_lens`, `req_pool_indices` per request), padded up to the next captured
batch size, with paged K/V addressed through `out_cache_loc` and the request-to-token table instead of a
per-request contiguous buffer. Our static path is the same contract in the padded layout: `[bs, N]` with
N = budget + 1 fixed (SGLang's `num_draft_tokens`), K/V rows written at device-side rows, and one graph per
(batch, N, length bucket). What differs: SGLang's attention backend reads only each request's real
context (`seq_lens`), while ours attends over the whole preallocated capacity with a mask, which
costs compute proportional to the bucket, not the prefix (fine for a launch-bound small model, not for
a long-context large one).
"""),
    md("""
**What we learned.** On a GPU a dense target's verify is memory-bound up to roughly FLOP/s / bandwidth
tokens per batch: for Qwen3-8B a tree of about 220 nodes costs what one decode step costs on an H200 at
batch 1 (about 300 on an RTX PRO 6000) and about 27 per request at batch 8. A larger batch divides it;
a long prompt pulls it towards ridge / (heads / kv_heads), about 50 nodes, where attention over the
cached context becomes the compute limit. For an MoE target the weights a forward reads grow with
the distinct experts its tokens route to, so under balanced routing no tree is free at batch 1, and
the cost levels off only once every expert is read. With this drafter's acceptance, the predicted
speedup on Qwen3-8B peaks where tau stops rising while verify is still free; at batch 8 it peaks at a
smaller budget. On this CPU every node costs compute time, so notebook 05's best budget is not the
GPU's.
"""),
]


NOTEBOOKS["08_hybrid_targets"] = [
    md("""
# 08 · Hybrid targets: tree verify over a recurrent state

**Questions.** Qwen3-Next, Qwen3.5 and Qwen3.6 interleave GatedDeltaNet *linear-attention* layers with
gated full-attention layers. A recurrent layer takes no attention mask: its short conv and its state run
over the tokens in order. (1) What goes wrong when a tree is verified the way a dense target is, in one
flattened forward? (2) What rule fixes it, and does the engine follow it? (3) Do SGLang's own Triton
tree kernels agree with our torch oracle on a real cycle? (4) What does each tree node's state cost at
full size? (5) DDTree against DFlash on a hybrid pair.
"""),
    code("""
import sys, tempfile
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
    sys.path.insert(0, str(Path("..") / "tests"))
    from tiny_hybrid import make_hybrid_pair
    target_dir, draft_dir = make_hybrid_pair(Path(tempfile.mkdtemp()), "qwen3_5", nested=True, vocab=24)
    engine = wb.load(target=target_dir, draft=draft_dir)
model = engine.models.target
print(type(model).__name__, model.config.layer_types)
"""),
    md("""
## 1 · The naive flattened forward gives siblings wrong logits

One real DDTree cycle. The truth for every node is its own root-to-node path run through transformers
as a chain (`hybrid_oracle.path_logits`). The naive verify is one forward over all nodes with the tree
mask: the attention layers honour it, but each GatedDeltaNet layer runs its conv and state over the
*flattened* order, so a node whose flattened predecessor is not its parent continues another branch.
The engine's verify (`HybridGDN`) starts every node from its parent's state instead.
"""),
    code("""
from workbench.bench.prompts import eval_prompts

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
"""),
    md("""
Nodes on the leading chain (0, 1, 2, ... each the next one's parent) are right either way; every other
node inherits the state of the branch before it and is off by whole units of logit. A dense target
gives the same table with zeros in the naive column (`tests/models/test_hybrid_oracle.py`).

## 2 · The parent-state rule

For each linear-attention layer and each node *i* with parent *p(i)*:

- **conv**: node *i* convolves its own input with the last K−1 inputs along its ancestor chain (itself,
  parent, grandparent, ..., then the request's committed window); its window is kept per node.
- **delta rule**: node *i* starts from *p(i)*'s recurrent state (the root from the request's committed
  state) and keeps its own.

After accept, the deepest accepted node's window and state *become* the request's (nothing is recomputed,
nothing cropped; a recurrent state has no crop). Every `Cycle` of a hybrid target records which node
each node's state continued from (`state_from`, SGLang's `retrieve_parent_token`), and the contracts check it:
"""),
    code("""
print("parents   ", cycle.parents.tolist())
print("state_from", cycle.state_from.tolist())
s.run()
checks = wb.shapes.check_contracts(s)
print(checks.passed, [r["result"] for r in checks if r["check"] == "recurrent state from the parent"])
"""),
    md("""
What a verify holds per linear layer, beside SGLang's layout (its mamba pool keeps the state as
`[HV, Dv, Dk]`, ours is transformers' `[HV, Dk, Dv]`):
"""),
    code("""
table = wb.shapes.table(s, mode="TARGET_VERIFY", model="target", view="sglang")
for r in table:
    if r["tensor"].startswith(("mamba", "intermediate", "retrieve_parent")):
        print(f"{r['tensor']:<26} {str(r['shape']):<18} {r['dtype']:<8} ours {r['ours']}")
"""),
    md("""
## 3 · SGLang's kernels agree with the oracle on a real cycle

The same verify through SGLang 0.5.23's Triton kernels (`causal_conv1d_update` in tree mode and the
fused-gating delta rule its GDN backend runs in TARGET_VERIFY), under Triton's interpreter on this CPU:
`kernel_backend="sglang-triton"` (on CUDA, `"sglang"` runs them natively).
"""),
    code("""
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
"""),
    md("""
## 4 · What each node's state costs at full size

From the configs alone (transformers' defaults for these classes are the released models' shapes:
Qwen3-Next-80B-A3B, and Qwen3.6-35B-A3B's text model), with SGLang's default dtypes (conv windows in
bfloat16, delta-rule states in float32): the per-node scratch of a tree verify against the K/V of one
token, and the tree size at which the per-node states outweigh the K/V of a whole prompt.
"""),
    code("""
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
"""),
    md("""
A tree node's recurrent scratch costs as much as the K/V of about three thousand tokens: on these
targets the tree budget is a memory question long before it is a compute one. SGLang keeps these
buffers per request slot (`[layers, slots + 1, draft tokens, ...]`); replaying the accepted path from the
committed state instead (its ReplaySSM) avoids the dominant one.

## 5 · DDTree against DFlash on the hybrid pair

Greedy, float32: every policy's output equals plain decoding token for token (`tests/models/test_hybrid.py`
checks this against transformers' own `generate` too). Four long and four short held-out prompts, 48
new tokens, the policies interleaved prompt by prompt, three repeats: a speed order is stated only
where it holds across the repeats' spread (`wb.analysis.order_verdict`).
"""),
    code(IGNORE + """
from workbench.bench.runs import bench

policies = [wb.AR(), wb.DFlash(), wb.DDTree(4), wb.DDTree(8), wb.DDTree(16)]
if PAIR == "hybrid":
    prompts = eval_prompts("long")[:4] + eval_prompts("short")[:4]
else:
    prompts = [{"id": str(i), "prompt": p} for i, p in enumerate(["t3 t1 t4 t1 t5 t9", "t7 t7 t2", "t10 t11 t12"])]
result = bench(engine, policies, prompts, max_new_tokens=48, repeats=3, progress=True)
"""),
    code("""
print("lossless (greedy == AR for every prompt):", result.lossless)
for name, row in result.summary.items():
    print(f"{name:<11} tau {row['tau']:.2f}")
"""),
    code(IGNORE + """
for name, row in result.summary.items():
    lo, hi = min(row["speedup_vs_ar_per_repeat"]), max(row["speedup_vs_ar_per_repeat"])
    print(f"{name:<11} tok/s {row['tokens_per_s']:6.1f}  vs AR {row['speedup_vs_ar']:.2f}x [{lo:.2f}-{hi:.2f} over repeats]")
print(wb.analysis.order_verdict(result.summary, labels=["AR", "DDTree(4)", "DDTree(8)", "DDTree(16)"]))
"""),
    md("""
**Where a hybrid cycle's time goes**, against the dense embedded pair of about the same size (both
targets 6 layers, hidden 256; the dense one is all attention), DDTree(8) on the same prompts:
milliseconds per steady cycle, p50 / p90.
"""),
    code(IGNORE + """
dense = bench(wb.load(), [wb.DDTree(8)], prompts, max_new_tokens=48, repeats=3, progress=True, warmup=True)
stages = ["draft", "tree_build", "tree_compile", "verify", "accept", "commit", "record", "cycle"]
print(f"{'stage':<13}{'hybrid p50/p90':>16}{'dense p50/p90':>16}")
for st in stages:
    h = result.summary["DDTree(8)"]["stage_percentiles"][st]
    d = dense.summary["DDTree(8)"]["stage_percentiles"][st]
    print(f"{st:<13}{1e3 * h['p50']:>8.2f}/{1e3 * h['p90']:<7.2f}{1e3 * d['p50']:>8.2f}/{1e3 * d['p90']:<7.2f}")
"""),
    md("""
**What we learned.** The flattened verify gives wrong logits to the nodes off the leading chain (the
table in section 1); starting each node from its parent's state makes every node's logits equal its
own path's, and SGLang's tree kernels compute the same states. At full size the price is memory: each
tree node holds a copy of every linear layer's state. On this small pair the price is time too: the
verify's extra work over a dense target's is the recurrence run a tree level at a time (the conv over
each node's ancestor chain, the delta rule from its parent's state), so a hybrid's verify grows faster
with the tree than a dense one's and the best budget is smaller. Whether DDTree beats AR here, and at
which budget, is what the verdict line above says for this run.
"""),
]


NOTEBOOKS["10_production_engines"] = [
    md("""
# 10 · Production engines: does vLLM's DFlash accept what ours does, and if not, where does it differ?

**Question.** Users run DFlash in production engines. On the same target, drafter and prompts, vLLM's
greedy output is lossless, but is its *acceptance* the same as the workbench's? A drafter that reads a
wrong feature, or a layer that computes something slightly different, keeps the output lossless and
only costs acceptance: nothing in the outputs shows it. Here vLLM (its CPU build, in this process) runs
the embedded pair, one engine step = one draft/verify cycle recorded as a `wb.Cycle`, and
`wb.compare` holds every one of its drafts against the reference drafter for the same context.
"""),
    code(IGNORE + """
import workbench as wb

vllm = wb.load(engine="vllm")          # vLLM's own LLMEngine, in process, with its 'dflash' method (vLLM logs here)
s = vllm.session("def parse_header(line):\\n    ", max_new_tokens=48)
c = s.step()                           # one vLLM engine step: verify the pending drafts, draft the next block
t = s.run()
ours = wb.load().session("def parse_header(line):\\n    ", policy=wb.AR(), max_new_tokens=48)
ours.run()
"""),
    code("""
print(vllm.version, t.cycles[0])
print("tokens equal to the workbench's AR:", s.tokens == ours.tokens, "| cycles:", len(t.cycles), "| tau:", round(t.tau, 2))
print("not recorded:", "; ".join(t.meta["not_recorded"]))
"""),
    md("""
The cycle's record is the workbench's own: the stepper, tree figure, acceptance and stage views read it.
vLLM's DFlash drafts a chain, so the "tree" is one branch; the bold path is what its rejection sampler kept.
"""),
    code(IGNORE + """
wb.views.tree_figure(t.cycles[1], vllm.tokenizer)
"""),
    md("""
## The conformance report

Same pair, same prompts, both engines: tokens, drafts per request, committed tau (tokens per verify,
the bonus included), per-position acceptance, tokens/s over repeats; then, at the first cycle whose
drafts differ, the drafter's inputs and outputs compared per slot, per context-feature chunk (one per
target layer the drafter reads) and per drafter layer (the reference layer run on vLLM's own inputs).
"""),
    code(IGNORE + """
from workbench.bench.prompts import eval_prompts

vllm.close()
PROMPTS = [p["prompt"] for p in eval_prompts()[:4]]      # the first 4 held-out long prompts
report = wb.compare(prompts=PROMPTS, max_new_tokens=48, repeats=2, progress=print)   # one line per step
"""),
    code("""
for k, v in report.lossless.items():
    print("tokens equal,", k, v)
for name, r in report.runs.items():
    if r.drafts:
        print(f"{name:22s} drafts {r.drafts:4d}   committed tau {r.tau:.2f}")
print("drafts equal to the reference's: %d/%d cycles" % report.same_drafts)
for line in report.divergence.verdict():
    print("-", line)
"""),
    code(IGNORE + """
print(report)          # the whole report, with tokens/s (timings vary from run to run)
"""),
    md("""
**What the report found, by itself.** Two differences, both silent in the outputs:
- the context-feature chunk of the target's *last* layer is not the reference's: vLLM captures a layer's
  feature inside the layer loop, before the final norm, so for the last layer it hands the drafter the
  pre-norm residual stream (RMS about 11) where transformers' `hidden_states[-1]`, which dflash trains on,
  is the final-normed output (RMS about 1.5). SGLang captures "before layer k + 1" and would capture
  nothing at all for that layer. The embedded pair reads layers [1, 3, 5] of 6: a pair problem, to be
  retrained away; published drafters never read the last layer.
- drafter layer 1's attention differs for identical inputs while layer 0's and both MLPs agree: on the CPU
  build, vLLM normalises every drafter layer's context keys in one grouped RMSNorm call, and that kernel
  applies layer 0's `k_norm` weights to every layer.

With both worked around at runtime (`workbench.engines.vllm_workarounds`, vLLM 0.32.0 only), vLLM drafts
exactly the reference's tokens, cycle for cycle:
"""),
    code(IGNORE + """
fixed = wb.compare(prompts=PROMPTS, max_new_tokens=48, repeats=1, workarounds=True, progress=print)
"""),
    code("""
print("workarounds:", ", ".join(fixed.workarounds))
for name, r in fixed.runs.items():
    if r.drafts:
        print(f"{name:22s} drafts {r.drafts:4d}   committed tau {r.tau:.2f}")
print("drafts equal to the reference's: %d/%d cycles" % fixed.same_drafts, "| divergence:", fixed.divergence)
"""),
    md("""
**A served engine.** For models the workbench's own engine cannot hold (tensor parallel on 8 GPUs is
vLLM's or SGLang's job), the same comparison runs against a server: outputs from its OpenAI-compatible
API, acceptance from its own speculative counters (vLLM's `/metrics`), one request at a time:

```python
from workbench.engines.served import compare_served
print(compare_served("http://127.0.0.1:8000", PROMPTS, api_key=KEY, target=TARGET, draft=DRAFT))
# SGLang's launch_server: kind="sglang" (per-request counts from meta_info; not run here: it needs CUDA)
```

**What we learned.** Lossless output says nothing about acceptance. vLLM 0.32 on a CPU needs more verifies
than the workbench on these prompts for the same pair (the drafts above), for two reasons the report
located from its own measurements, a feature chunk and a drafter layer, without being told what to look
for; with both worked around, the two engines draft and accept alike.
"""),
]


MAX_NOTEBOOK_BYTES = 1_000_000


def drop_widget_state(nb) -> None:
    """Widgets need a live kernel; their saved state is no use in a file and can be huge (each plotly
    FigureWidget stores the plotly.js bundle: 5 MB), so a notebook keeps none."""
    nb.metadata.pop("widgets", None)


RUN_TIME_MARK = "<!-- run time -->"  # the note at the top of every notebook: how long its cells took


def cell_seconds(cell) -> float:
    """Seconds one executed cell took, from the timings nbclient stores in its metadata (0 if none)."""
    from datetime import datetime

    ex = (cell.get("metadata") or {}).get("execution") or {}
    start, end = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = lambda t: datetime.fromisoformat(t.replace("Z", "+00:00"))  # noqa: E731
    return max((parse(end) - parse(start)).total_seconds(), 0.0)


def run_time_note(nb, cores: int | None = None) -> str:
    total = sum(cell_seconds(c) for c in nb["cells"] if c.get("cell_type") == "code")
    longest = max((cell_seconds(c) for c in nb["cells"] if c.get("cell_type") == "code"), default=0.0)
    say = lambda t: f"{t:.0f} s" if t < 90 else f"{t / 60:.1f} min"  # noqa: E731
    cores = cores or os.cpu_count() or 1
    return (f"{RUN_TIME_MARK}\n*Run time: about {say(total)} for all cells (the longest {say(longest)}), from the cell "
            f"timings stored at its last build, on a {cores}-core CPU machine. On a machine shared with other work (a "
            "training run, other notebooks) expect several times that; the long cells show a progress bar.*")


def stamp_run_time(nb, cores: int | None = None) -> None:
    """Put (or update) the run-time note right after the title cell, from the stored cell timings."""
    text = run_time_note(nb, cores)
    cells = nb["cells"]
    at = next((i for i, c in enumerate(cells) if c.get("cell_type") == "markdown" and RUN_TIME_MARK in
               "".join(c.get("source", ""))), None)
    if at is not None:
        cells[at]["source"] = text
    else:
        cells.insert(1 if cells and cells[0].get("cell_type") == "markdown" else 0, nbformat.v4.new_markdown_cell(text))


def build(name: str, cells: list, execute: bool = True, out_dir: Path = HERE, static: bool = True) -> Path:
    """Write (and execute) one notebook. ``static``: give every stored figure a PNG and every widget a
    run-the-cell sentence (``workbench.views.static``), so they show on GitHub, nbviewer and in an
    HTML export; a missing browser stops the build with one line rather than storing figures silently
    without them."""
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    path = Path(out_dir) / f"{name}.ipynb"
    if execute:
        # one browser start for all figures (add_static_fallbacks below), not one per figure at display time
        os.environ["WORKBENCH_STATIC_FIGURES"] = "0"
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    drop_widget_state(nb)
    if execute:
        stamp_run_time(nb)
    if execute and static:
        from workbench.views.static import add_static_fallbacks

        try:
            counts = add_static_fallbacks(nb)
        except RuntimeError as e:
            raise SystemExit(f"{path.name}: {e}") from None
        if counts["rendered"] < counts["figures"]:
            raise SystemExit(f"{path.name}: only {counts['rendered']} of {counts['figures']} figures rendered to PNG")
    text = nbformat.writes(nb)
    if len(text.encode()) > MAX_NOTEBOOK_BYTES:
        raise SystemExit(f"{path.name} would be {len(text.encode()) / 1e6:.1f} MB (limit {MAX_NOTEBOOK_BYTES / 1e6:.0f} MB): "
                         "store figures, not big widget states")
    path.write_text(text, encoding="utf-8")
    return path


if __name__ == "__main__":
    # --stamp: only (re)write the run-time note of the committed notebooks, from their stored cell timings
    stamp_only = "--stamp" in sys.argv[1:]
    wanted = [a for a in sys.argv[1:] if a != "--stamp"]
    for name, cells in NOTEBOOKS.items():
        if not wanted or any(name.startswith(w) for w in wanted):
            if stamp_only:
                path = HERE / f"{name}.ipynb"
                nb = nbformat.read(path, as_version=4)
                stamp_run_time(nb)
                nbformat.write(nb, path)
                print("stamped", path)
            else:
                print("building", build(name, cells))
