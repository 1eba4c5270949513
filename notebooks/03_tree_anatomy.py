# %% [markdown]
# # 03 · Tree anatomy: from per-slot log-probs to a verified tree
#
# **Question.** How does DDTree turn the drafter's per-slot log-probs into a tree, what arrays does
# the target's verify forward receive, and does SGLang's production tree-verify kernel accept the
# same path as ours on a real cycle?

# %%
import torch
import workbench as wb
import ddtree_kernels as K

engine = wb.load()
s = engine.session("def read_config(path):\n    ", policy=wb.DDTree(budget=12), seed=0, max_new_tokens=64)
c = s.step()
while c.accepted < 2:       # a cycle where the target accepted a few drafted tokens
    c = s.step()
tok = engine.tokenizer
print(f"cycle {c.index}: {c.n_nodes} nodes, accepted {c.accepted} drafted tokens")

# %%
# NBVAL_IGNORE_OUTPUT

wb.views.draft_heatmap(c, tok)

# %% [markdown]
# **Best-first order.** A node is a prefix; its score is the sum of the drafter's log-probs along it.
# The tree is the `budget` best prefixes, listed in the order a best-first search pops them
# (score descending; ties by depth, then parent index, then token rank).

# %%
for i in range(1, c.tokens.shape[0]):
    print(f"node {i:2d}: score {float(c.score[i]):7.3f}  depth {int(c.depth[i])}  rank {int(c.rank[i])}  parent {int(c.parents[i]):2d}  {tok.decode([int(c.tokens[i])])!r}")

# %%
print("parents     ", c.parents.tolist())
print("depths      ", c.depth.tolist())
print("positions   ", c.position_ids.tolist(), " <- start + depth: siblings share a position")
print("next_token  ", c.retrieve_next_token.tolist())
print("next_sibling", c.retrieve_next_sibling.tolist())

# %%
# NBVAL_IGNORE_OUTPUT

wb.views.mask_figure(c, tok)

# %%
print(c.visibility.int())     # row i: the nodes node i may attend to (its ancestors and itself)

# %% [markdown]
# **SGLang's kernel on this cycle.** `verify_tree_greedy_triton` (from the `sglang` wheel) walks the
# same tree through the EAGLE retrieve arrays. On a CPU it runs under Triton's interpreter.

# %%
tree = K.Tree(c.tokens[None], c.parents[None], c.depth[None], c.rank[None], c.score[None])
depth = int(c.depth.max())
compiled = K.compile_tree(tree, c.start, depth)
ours = K.accept("torch", tree, compiled, c.target_choice[None], depth)
theirs = K.accept("sglang", tree, compiled, c.target_choice[None], depth)
print("ours  :", ours.index[0].tolist(), "bonus", int(ours.bonus[0]))
print("sglang:", theirs.index[0].tolist(), "bonus", int(theirs.bonus[0]))
print("same:", torch.equal(ours.index, theirs.index) and torch.equal(ours.bonus, theirs.bonus))

# %% [markdown]
# **What we learned.** The tree is fully determined by the per-slot log-probs and the budget; it is
# flattened so every parent precedes its children, positions follow depth, and the verify mask is
# the ancestor relation. SGLang's own greedy tree-verify kernel, fed our retrieve arrays, accepts the
# same path and bonus as our vectorized walk.
