# %% [markdown]
# # 11 · Does DDTree pay off? Acceptance and per-step cost measured apart, with significance
#
# **Question.** On this pair, this batch size and this device, is a DDTree faster than the same drafter's
# chain (DFlash), and what decides it? The public evidence disagrees: the DDTree paper reports 8.22x vs
# DFlash's 6.09x over AR at batch 1; an independent vLLM port measured 0.68-1.00x against the same drafter's
# chain, with the loss in per-step machinery, and the best budget shrinking as the batch grows.
#
# `wb.pays_off` measures the three things apart:
#
# - **acceptance**: every tree shape is its own decode (never a replay of another shape's trace); target
#   forwards are counted from the cycles, so tokens per forward is a count, not an inference;
# - **per-step cost**: the engine's stage times (draft, tree build and compile, verify, accept, commit,
#   record), medians over steps;
# - **speed**: per prompt (batch 1) or per window of prompts (batch B), every shape interleaved on the same
#   unit, compared pair by pair with scipy's Wilcoxon signed-rank and sign tests. Two rules, each named on
#   the line that uses it: the table's order column compares each shape with DFlash on its own and claims an
#   order where p < 0.05 (uncorrected); the verdict tries every DDTree budget at once, so a budget counts only
#   where p < 0.05 / the number of budgets (Bonferroni: with the two budgets here, p < 0.025).
#
# Their product, tokens-per-forward gain x step-cost ratio, is the **predicted** speedup, shown beside the
# **measured** one. Here: the embedded dense pair, 10 prompts (the fewest a paired test accepts), 12 new
# tokens, batch 1 and 4: the numbers illustrate the method. The figures in `docs/pays-off.md` come from
# `python -m workbench pays-off` on more tokens, batch 1 and 8, both pairs.

# %%
# NBVAL_IGNORE_OUTPUT
import workbench as wb
from workbench.shipped import eval_prompts

engine = wb.load()
prompts = eval_prompts("short")[:10]
shapes = [wb.Spine(2), wb.DDTree(4), wb.DDTree(16)]  # AR and DFlash are always added
res = wb.pays_off(engine, prompts, batch=(1, 4), policies=shapes, max_new_tokens=12, progress=False)

# %% [markdown]
# **Acceptance per shape.** Forwards per committed token and tau are counts (greedy decoding is
# deterministic), so they are the same on every machine. At batch 4 a forward verifies four trees, one per
# row, so AR's forwards per token drop to 1/4. Spine(2), DFlash's chain plus its two best siblings as leaves,
# gains little over the chain: a sibling leaf adds at most one token where the chain misses.

# %%
for b, v in res.batches.items():
    print(f"batch {b}")
    for r in v.rows:
        gain = "-" if r.gain_vs_chain is None else f"{r.gain_vs_chain:.2f}x DFlash"
        print(f"  {r.label:20s} forwards/token {r.forwards_per_token:.3f}  tau {r.tau:.2f}  "
              f"tokens/forward {r.tokens_per_forward:.2f}  ({gain})")

# %% [markdown]
# **Cost per step and the two speedups.** Timings depend on the machine and its load (this one is shared),
# so this cell's output is not compared. `pred` is the tokens-per-forward gain times the step-cost ratio;
# `meas` is the median of the per-unit ratios of tokens per second, its IQR and worst unit beside it, and the
# Wilcoxon / sign-test p-values.

# %%
# NBVAL_IGNORE_OUTPUT
from workbench.payoff.tables import batch_tables

print(batch_tables(res.batches[1]))

# %% [markdown]
# **The verdict.** One summary line per batch size first: the fastest policy, AR included, against the
# runner-up, paired. Then, per batch size, the best DDTree budget (by the measured median) and whether it beats
# the chain significantly (Bonferroni over the budgets: p < 0.025 here), and what decides: the largest term of
# log(predicted speedup) in the direction of the outcome (the acceptance gain, the verify's extra width, or the
# rest of the step) that stands on a structural difference, and only under a separated result; a prediction
# the measurement contradicts is said to be missed. Last, each shape against AR: a tree can beat the chain and
# still lose to plain decoding (Bonferroni over every shape compared with AR).

# %%
# NBVAL_IGNORE_OUTPUT
for b in res.batches:
    print(res.headline(b).summary)
for b, v in res.batches.items():
    print(v.verdict)
    print("  ", v.decides)
    print(v.fastest)

# %% [markdown]
# The "what decides" rule on made-up steps, to see it separate the three causes: a 20 ms step, half of it
# the verify. The same 15% acceptance gain pays with a cheap tree, and loses to a verify that takes 40%
# longer (+20% of the step) or to 40% more time in the rest of the step (host work).

# %%
from workbench.payoff import what_decides

base = {"draft": 5e-3, "tree_build": 0.0, "tree_compile": 0.0, "verify": 10e-3, "accept": 0.0, "commit": 5e-3,
        "record": 0.0, "other": 0.0}
for name, verify, rest in (("cheap tree", 1.02, 1.02), ("wide verify", 1.40, 1.02), ("host work", 1.02, 1.40)):
    shape = {**base, "verify": 10e-3 * verify, "draft": 5e-3 * rest, "commit": 5e-3 * rest}
    print(f"{name:12s}", what_decides(1.15, base, shape).sentence("tree", "chain"))

# %% [markdown]
# **Why siblings help this drafter: conditional rates from the traces.** After the run the target's token at
# every drafted slot is known, so its rank among the drafter's candidates is too. Where the chain first
# misses, how often is the target's token the rank-1 sibling? And after the target took a sibling, is the
# next depth's top-1 still right, as often as on the spine? A block-diffusion drafter drafts every slot from
# one forward, conditioned on its own argmax path, so a sibling's continuation may not follow.

# %%
print(res.branching)
print(res.branching.table(depths=6))

# %% [markdown]
# **The counterfactual from one trace, and its bias.** "What would DDTree(N) have accepted?" can be
# computed from the chain's trace alone (`wb.analysis.budget_needed`), but that trace's cycles start where
# the chain stopped, exactly where continuing is hard, and a tree run moves the cycle boundaries. The
# difference between the counterfactual gain and the end-to-end gain is its bias: a teaching row, never a
# substitute for the end-to-end decode.

# %%
from workbench.payoff.tables import counterfactual_table

print(counterfactual_table(res.counterfactual))

# %% [markdown]
# The full measurement, with both evaluation splits, batch 1 and 8 and both embedded pairs, and its
# check against a direct `bench` run, is in `docs/pays-off.md`; each figure there carries the command that
# reproduces it, e.g. `python -m workbench pays-off --target dense --prompts short --limit 12 --batch 1,8`.
