# %% [markdown]
# # 07 · Tree policies: DDTree beside SGLang's EAGLE tree, your own tree, and how reliable is the drafter?
#
# **Questions.** (1) Built from the *same* DFlash drafter, which tree accepts more per verified token:
# DDTree (the best prefixes of the drafter's per-slot log-probs), the top-k-per-step tree that SGLang's
# EAGLE worker builds, a linear chain, or a tree of our own? (2) DDTree ranks prefixes by the drafter's
# probabilities: are those probabilities calibrated? (3) After one run, how large a tree would each
# cycle have needed, and does that predict what smaller budgets will do?

# %%
import torch
import workbench as wb
from ddtree_kernels import Tree
from workbench.bench.policy_bench import compare_policies
from workbench.shipped import eval_prompts

engine = wb.load()
prompts = eval_prompts("long")[:2] + eval_prompts("short")[:2]  # both splits


# %% [markdown]
# A custom policy is a function `build(logprobs [bs, D, V], root_tokens [bs], budget) -> Tree`. This one
# is a *caterpillar*: the drafter's argmax chain, plus the runner-up token beside each chain node.

# %%
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


# %% [markdown]
# The engine checks every tree a custom policy returns, and names the first thing wrong:

# %%
def sloppy(logprobs, root_tokens, budget):
    t = caterpillar(logprobs, root_tokens, budget)
    return Tree(t.tokens, t.parents.flip(1), t.depth, t.rank, t.score)   # parents scrambled

try:
    engine.session("x = 1\n", policy=wb.TreePolicy(sloppy, name="sloppy", budget=15)).step()
except ValueError as e:
    print(type(e).__name__ + ":", e)

# %% [markdown]
# **Equal verified tokens.** Each cycle the target verifies the root plus the drafted nodes: `DDTree(N)`,
# `EagleTree(num_draft_tokens=N + 1)` and a custom tree of budget N all verify N + 1 tokens; linear DFlash
# verifies its whole block (16). `EagleTree(topk, steps, n)` uses SGLang's `speculative_eagle_topk`,
# `speculative_num_steps` and `speculative_num_draft_tokens`.

# %%
# NBVAL_IGNORE_OUTPUT

policies = [wb.AR(), wb.DFlash(), custom,
            wb.DDTree(15), wb.EagleTree(topk=4, steps=8, num_draft_tokens=16),
            wb.DDTree(31), wb.EagleTree(topk=4, steps=8, num_draft_tokens=32)]
verified = {"DFlash": 16}
for p in policies[2:]:
    verified[str(p)] = p.budget + 1
result = compare_policies(engine, policies, prompts, max_new_tokens=48, repeats=1,
                          progress=True)  # tau is a count: one pass

# %%
print("lossless (greedy == AR for every prompt and policy):", result.lossless)
print(f"{'policy':22s} {'verified':>8s} {'tau':>6s} {'tau/verified':>12s}")
for name, n in verified.items():
    tau = result.summary[name]["tau"]
    print(f"{name:22s} {n:8d} {tau:6.2f} {tau / n:12.3f}")

# %%
# NBVAL_IGNORE_OUTPUT

for name in verified:
    row = result.summary[name]
    lo, hi = min(row["speedup_vs_ar_per_prompt"]), max(row["speedup_vs_ar_per_prompt"])
    print(f"{name:22s} {row['tokens_per_s']:7.1f} tok/s   speedup over AR {row['speedup_vs_ar']:.2f}x "
          f"[{lo:.2f}-{hi:.2f} over prompts]")
# An order of speed is claimed only where a paired test (per prompt, Wilcoxon) separates it; else: too noisy.
print(wb.analysis.order_verdict(result.summary, labels=["DDTree(15)", "EagleTree(4, 8, 16)", "DFlash"]))
rows = [{"family": name.split("(")[0], "policy": name, "verified": n, "tau": result.summary[name]["tau"]}
        for name, n in verified.items()]
wb.views.policy_compare_figure(rows)

# %% [markdown]
# **Reliability.** One DDTree run per prompt at a large budget, recording the drafter's top-64 tokens per
# slot. A node's *drafted path probability* is the product of the drafter's probabilities along its path;
# it is *accepted* when the target's own continuation starts with that path. A calibrated drafter's
# nodes of probability p are accepted a share p of the time.

# %%
big = [engine.session(p["prompt"], policy=wb.DDTree(64), max_new_tokens=48, record_topk=64).run() for p in prompts]
rel = wb.analysis.reliability(big, bins=10)
print(rel)
for row in rel.depth_table()[:6]:
    print(f"depth {row['depth']}: accepted {row['rate']:.0%} of {row['reached']} reached cycles "
          f"(drafter's mass on the drafted children: {row['predicted']:.0%})")

# %%
# NBVAL_IGNORE_OUTPUT

wb.views.reliability_figure(rel)

# %% [markdown]
# **Budget needed.** After the run the target's continuation is known, so for every cycle we can rank its
# length-L prefix among all the drafter's prefixes: that rank is the number of nodes a best-first tree
# needed to contain it. From the same runs we predict tau at smaller budgets and compare with the
# measured DDTree(15) and DDTree(31) above (different runs: the cycles start at other places).

# %%
need = wb.analysis.budget_needed(big)
print(need)
errors = {}
for b in (15, 31):
    pred, meas = need.tau_at(b), result.summary[f"DDTree({b})"]["tau"]
    errors[b] = (pred - meas) / meas
    print(f"budget {b}: predicted tau {pred:.2f}, measured {meas:.2f} ({errors[b]:+.1%})")
print(f"at the run's own budget 64: predicted {need.tau_at(64):.3f} = measured "
      f"{sum(sum(t.accept_lengths) for t in big) / sum(len(t) for t in big):.3f}")

# %%
# NBVAL_IGNORE_OUTPUT

wb.views.budget_needed_figure(need, measured={b: result.summary[f"DDTree({b})"]["tau"] for b in (15, 31)})

# %% [markdown]
# **What we learned.** All four tree shapes are lossless, so only their acceptance and cost differ. With
# the same per-slot log-probs, DDTree takes the globally best prefixes while SGLang's EAGLE tree can only
# extend the top-k paths of each step, so at equal verified tokens DDTree should accept at least as much;
# the table shows by how much (on the embedded pair: clearly more at both 16 and 32 verified tokens). The
# hand-made caterpillar and the linear chain trail both. tau is a count, the same on any machine; speed
# is not, so the verdict line above states a speed order only where a paired test over the prompts
# separates it (four prompts here are too few: `python -m workbench pays-off` is the paired
# measurement), and says "too noisy" otherwise. The reliability diagram tests DDTree's premise directly: the printed ECE and the
# per-depth rates show how close the drafter's path probabilities are to the target's acceptance (a
# calibrated drafter sits on the diagonal). The budget-needed curve, from a single run, predicts tau at
# other budgets to within the printed error, and reproduces the run's own tau exactly: it tells where to
# set the budget before spending GPU hours on sweeps.
