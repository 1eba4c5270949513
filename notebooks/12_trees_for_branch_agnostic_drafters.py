# %% [markdown]
# # 12 · Trees for a drafter whose siblings don't know their branch
#
# **Question.** A DFlash drafter drafts every slot of its block in one forward, each slot's distribution a
# marginal along the drafter's *own* argmax path. DDTree scores a prefix by the product of those marginals, so
# once a path takes a sibling (a rank >= 1 candidate), the slots below it are scored as if the path had never
# left the argmax. How much does that misrank the tree, and what does each of the field's 2026 fixes buy?
#
# | policy | spelling | what it changes | after |
# | --- | --- | --- | --- |
# | `PathTree(16)` | `path:16` | a node's score is a calibrated estimate of P(the whole path is accepted), by path state (spine, sibling, off) | TAPS |
# | `CostTree(64)` | `costed:64` | PathTree's nodes, cut per cycle where expected tokens per predicted ms peak | CaDDTree |
# | `CutTree(16)` | `cut:16` | PathTree's nodes, cut where the estimated path acceptance falls below a calibrated threshold | DSpark |
# | `PairTree(16)` | `pairtree:16` | each candidate rescored given its *parent's token* by a previous-token head | TreeFlash |
# | `PairChain(8)` | `pairchain:8` | one chain: the best path through each slot's top-8 under that head | DFlash2 |
# | `CondTree(16)` | `condtree:16` | PairTree's tree, each candidate scored by a *learned* head: the drafter's state at the slot with its parent's token | |
# | `CondChain(8)` | `condchain:8` | one chain: the most expected accepted tokens through each slot's top-8 under the learned head | |
#
# Each is calibrated (or, the learned head, trained) on the pair's own traces, from prompts cut from the *training*
# files (`docs/calibrated-policies.md`); everything below runs on held-out evaluation prompts none of them saw.
# Here: the embedded dense pair, 8 short held-out prompts, 32 new tokens, greedy (so every count repeats
# exactly). This notebook counts tokens per target forward only: speed is `pays-off`'s to measure (the last
# cells draw its saved results).

# %%
# NBVAL_IGNORE_OUTPUT
import workbench as wb
from workbench.shipped import eval_prompts

engine = wb.load()
prompts = [p["prompt"] for p in eval_prompts("short")[:8]]  # held out from training and from every calibration
NEW = 32

# %% [markdown]
# **Why marginal trees misrank siblings.** After a greedy run the target's token at every drafted slot is
# known, so its rank among the drafter's candidates is too (`wb.analysis.branching`, from DFlash runs with the
# top-16 per slot recorded). Two rates decide a tree's shape: where the chain first misses, how often the
# target's token is the rank-1 sibling (a tree that keeps siblings recovers those), and, once the target has
# taken a sibling, how often the next depth's top-1 is still right, against the same rate on the spine.

# %%
from workbench.analysis.branching import branching

traces = [engine.session(p, policy=wb.DFlash(), max_new_tokens=NEW, record_topk=16).run() for p in prompts]
b = branching(traces)
print(b)
print(b.table(depths=6))

# %% [markdown]
# The rank-1 sibling is often the target's token where the chain misses, so keeping siblings is worth it; but
# after a sibling the next depth's top-1 is right far less often than on the spine. The drafter's next slot was
# drafted for its own argmax, not for the sibling, and DDTree still ranks the sibling's children by that slot's
# marginal: it spends nodes on continuations that do not fit. Two ways out: estimate what a path state does
# to acceptance (PathTree, and CostTree and CutTree on top of it), or score each slot's candidates *given the
# token before them* (PairTree, PairChain).
#
# **Given the previous token.** The pair head is the training corpus's successor table (each token's 32 most
# frequent followers). Rescoring each slot's candidates given the target's own previous token, how often is the
# top candidate the target's token, by the state of the path above the slot? (Cycles of greedy DFlash and
# DDTree(16) decodes of the same held-out prompts, as the calibration collects them.)

# %%
from workbench.calibrate.choose import next_top1
from workbench.calibrate.collect import collect
from workbench.engine.policies.calibration import load

head, beta = load("dense").head()
cycles = collect(engine, prompts, NEW, 16)
without, with_head = next_top1(cycles, head, 0.0), next_top1(cycles, head, beta)
print(f"next slot's top candidate is the target's token ({cycles.topv.shape[0]} cycles; beta {beta}):")
where = {"spine": "on the spine", "sibling": "right after a sibling", "off": "below a sibling"}
for state in without:
    print(f"  {where[state]:22s} {100 * without[state]['top1']:3.0f}% as drafted, "
          f"{100 * with_head[state]['top1']:3.0f}% given the previous token ({without[state]['slots']} slots)")

# %% [markdown]
# **Given the previous token and the drafter's state.** The learned head (`workbench.train.cond_head`) scores each
# candidate from the drafter's hidden state at the slot and the parent's token, where the table sees the parent's
# token alone. The same decodes' continuations, a block rooted at every position (the drafter's states recomputed
# as the head's training computes them), every slot a tree can reach: the top candidate as drafted, given the
# previous token by the table, and by the learned head.

# %%
# NBVAL_IGNORE_OUTPUT
from workbench.engine.policies.cond_head import load_head
from workbench.payoff.sizing import cond_blocks
from workbench.train.cond_head import accuracy_table, describe_accuracy, examples

learned = load_head("dense")
blocks = cond_blocks(engine.models, cycles.sequences, learned.K, anchors=NEW)  # every root of every continuation
acc = accuracy_table(examples(blocks), learned, head, beta)
print(describe_accuracy(acc))
wb.views.next_top1_figure(acc)

# %% [markdown]
# The learned head's top candidate is the target's token more often than the table's in every path state, and the
# gap is widest right after a sibling, where the drafter's own top-1 is rarely right: what follows a sibling
# depends on more than the sibling's token alone.

# %% [markdown]
# **What each fix buys: tokens per target forward.** Every policy is its own greedy decode of the same prompts;
# target forwards are counted from the cycles' forward records (`workbench.payoff.measure.decode_unit`, what
# `pays-off` decodes with). At batch 1 a forward verifies one tree; then the same 8 prompts as one batch, where
# a forward verifies 8 trees and a node costs 8 tokens of verify. `nodes` is the drafted nodes verified per
# row and cycle. Greedy output is the target's own, whatever the tree: every policy commits the same tokens.
# (The decodes show a progress bar; the counts are printed by the next cell.)

# %%
# NBVAL_IGNORE_OUTPUT
from tqdm.auto import tqdm

from workbench.payoff.measure import decode_unit

policies = [wb.DFlash(), wb.DDTree(16), wb.PathTree(16), wb.CostTree(64), wb.CutTree(16), wb.PairTree(16),
            wb.PairChain(8), wb.CondTree(16), wb.CondChain(8)]
counts = {}  # (batch, label) -> (tokens per forward, nodes per row and cycle, the generated tokens, per unit)
with tqdm(total=len(policies) * (len(prompts) + 1), desc="decodes", unit="decode") as bar:
    for batch in (1, 8):
        units = [[p] for p in prompts] if batch == 1 else [prompts]
        for policy in policies:
            tokens = forwards = nodes = cycles_run = 0
            out, each = [], []
            for unit in units:
                run, unit_traces = decode_unit(engine, policy, unit, NEW, 0.0, 0)
                tokens, forwards, out = tokens + run.tokens, forwards + run.forwards, out + run.outputs
                each.append(run.tokens / run.forwards)
                for c in (c for t in unit_traces for c in t.cycles):
                    nodes, cycles_run = nodes + len(c.tokens) - 1, cycles_run + 1
                bar.update(1)
            counts[batch, str(policy)] = (tokens / forwards, nodes / cycles_run, out, each)

# %%
for batch in (1, 8):
    chain, tree = counts[batch, "DFlash"][0], counts[batch, "DDTree(16)"][0]
    print(f"batch {batch}: {'shape':14s} {'tok/fwd':>8s} {'x DFlash':>9s} {'x DDTree(16)':>13s} {'nodes':>6s}")
    for policy in policies:
        tpf, n, _, _ = counts[batch, str(policy)]
        print(f"         {str(policy):14s} {tpf:8.2f} {tpf / chain:9.2f} {tpf / tree:13.2f} {n:6.1f}")
    same = [p for p in policies if counts[batch, str(p)][2] == counts[batch, "DFlash"][2]]
    print(f"         the same tokens as DFlash: {len(same)} of {len(policies)} policies\n")

# %%
# NBVAL_IGNORE_OUTPUT
import numpy as np

# batch 1: pooled over the prompts, the interval the interquartile range of the prompts' own; batch 8: one batch
series = {"batch 1 (IQR over prompts)": {str(p): (counts[1, str(p)][0], *np.percentile(counts[1, str(p)][3],
                                                                                       [25, 75])) for p in policies},
          "batch 8 (one static batch)": {str(p): (counts[8, str(p)][0], None, None) for p in policies}}
wb.views.by_policy_figure(series, "tokens per target forward")

# %% [markdown]
# How to read it (the counts above are exact; what follows holds for these prompts and this pair):
#
# - **The previous token is what decides.** PairTree keeps DDTree's budget and rescores each candidate given
#   its parent's token; CondTree scores it with the learned head instead, and at batch 1 commits the most tokens
#   per forward of every tree here, PairTree next. At batch 8 the order turns: one static batch's forwards are
#   set by its slowest row, so a single window's tail decides there, not the average cycle. PairChain and
#   CondChain do the same for a single chain: more tokens per forward than DFlash's argmax chain at the same
#   width (one node per slot), CondChain the more at batch 1.
# - **Path states alone buy little.** PathTree ranks by the calibrated path estimate and gains a few percent
#   over DDTree(16): the drafter's marginal already ranks a sibling's continuation low; what it lacks is
#   *which* continuation follows the sibling.
# - **CostTree and CutTree trade tokens per forward for width.** They verify fewer nodes than their budget
#   (CostTree far fewer at batch 8, where each node costs 8 tokens of verify), and commit no more per forward
#   than DDTree(16); whether the narrower verify pays for that is a question of time, not of counts.
#
# Tokens per forward is the acceptance term only. The verify's width and the per-step overhead (the tree
# build runs on the host for every cycle) decide the rest, and the published figures say where, on a GPU:

# %%
from workbench.shapes.published import predictions, summary

preds = list(enumerate(predictions(), 1))
no_faster = [i for i, p in preds if round(p.figure.published, 2) <= 1.0]
slower = [i for i, p in preds if p.figure.published < 0.95]
graphed = [(i, p) for i, p in preds if p.figure.batch == 1 and "CUDA graphs" in p.figure.mode
           and p.overhead_error is not None]
over = [p.overhead_error for _, p in graphed]
implied = [1e3 * p.implied_tree_s for _, p in graphed]
err = summary([p for _, p in preds])["with overhead"]
print(f"{len(preds)} published tree figures: the tree was no faster than what it was compared with in "
      f"{len(no_faster)} (at most 1.00x), more than 5% slower in {len(slower)} (rows {', '.join(map(str, slower))})")
print(f"batch 1 under CUDA graphs ({len(graphed)} rows): the cost model, forwards plus the reference arm's own "
      f"per-step overhead, predicts {sum(e > 0 for e in over)} of {len(over)} too fast, by {100 * min(over):+.0f}% to "
      f"{100 * max(over):+.0f}%: the tree spends {min(implied):.1f} to {max(implied):.1f} ms per step the model "
      "does not see (tree build, masks, host round trips), not verify width")
print(f"over all {err['figures']} rows with a prediction: median |error| {100 * err['median_abs_error']:.0f}%, "
      f"largest {100 * err['max_abs_error']:.0f}%")

# %% [markdown]
# **Conclusion of the published figures** (`docs/published-figures.md`, from `workbench/shapes/published.py`):
# on a GPU at batch 1 a tree's extra verify width is nearly free, and its per-step machinery and its acceptance
# decide. So a policy that only raises tokens per forward, as PairTree does here, pays off only if its host work
# per cycle stays small against the step; that is what no count in this notebook can tell.
#
# **The speed verdict** is `pays-off`'s: every shape its own decode, interleaved per prompt, stage times
# measured, paired with significance, and each calibrated policy compared with the best DDTree budget with the
# term that decides (acceptance, verify width, per-step overhead) named:
#
# ```bash
# .venv/bin/python -m workbench pays-off --target dense --prompts short --batch 1,8
# .venv/bin/python -m workbench pays-off --target hybrid --prompts short --batch 1,8
# ```
#
# (`docs/pays-off.md` explains every line; the hybrid pair, `wb.load("hybrid")`, has its own calibration.)
# With `--json > notebooks/data/pays-off-PAIR.json` the next cell draws each pair's result: tokens per target
# forward and tokens/s over DFlash's (the median per unit, its interquartile range as the interval) per shape,
# at batch 1 and at batch 8 static and refilled (`wb.views.payoff_figure`, which takes a result object too).

# %%
# NBVAL_IGNORE_OUTPUT
import json
from pathlib import Path

saved = Path(wb.__file__).parents[1] / "notebooks" / "data"  # `pays-off --json` results, one file per pair
for pair in ("dense", "hybrid"):
    path = saved / f"pays-off-{pair}.json"
    if path.is_file():
        wb.views.payoff_figure(json.loads(path.read_text())).update_layout(title=f"pays-off, {pair} pair").show()
    else:
        print(f"{pair}: no saved result; python -m workbench pays-off --target {pair} --json > "
              f"notebooks/data/{path.name}")

# %% [markdown]
# **Measured here** (2026-12-07, 12 held-out prompts, 64 tokens, one CPU thread, idle machine; the saved results
# drawn above; `docs/pays-off.md`, "The conditioned policies against the best budget"): CondTree beats the best
# DDTree budget, separated after correction, in four of six cells: dense batch 1 (CondTree(16) 1.32x DDTree(8)),
# dense batch 8 static and refilled (CondTree(8) 1.12x DDTree(8), 1.20x DDTree(4)) and hybrid batch 1 (CondTree(8)
# 1.19x DDTree(4)). On the hybrid at batch 8 each verified node costs compute on this CPU, the head buys 8% of tau
# at 4 nodes, and plain AR is the fastest shape there.
