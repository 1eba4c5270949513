# %% [markdown]
# # 02 · Step through cycles: what happens inside one draft/verify cycle?
#
# **Question.** In one DDTree cycle, what did the drafter propose at each depth, which tree was
# built from it, what did the target choose at every node, and why did the accept walk stop where it
# did? First with the interactive stepper, then by hand on the same data.

# %%
import workbench as wb

engine = wb.load()
session = engine.session("class LineReader:\n    def __init__(self, path):\n        ", policy=wb.DDTree(budget=16), seed=0, max_new_tokens=96)

# %%
# NBVAL_IGNORE_OUTPUT

stepper = wb.Stepper(session)      # Step, Run N, Reset; a slider over past cycles; budget/width/temperature for the next cycle
stepper

# %% [markdown]
# The widget needs a live kernel (its state is not stored in this file). Driven from Python, it
# follows the session: a policy set in code is what the next Step uses, and the controls show it.
# A static picture of the cycle it shows:

# %%
# NBVAL_IGNORE_OUTPUT

stepper.run(3)
session.policy = wb.DDTree(budget=16, width=2)   # set in code: the stepper keeps it
stepper.step()
print(session.cycles[-1].policy, "| dropdown:", stepper.policy_kind.value, stepper.budget.value)
wb.views.tree_figure(session.cycles[-1], engine.tokenizer)

# %% [markdown]
# By hand: a fresh session, one `step()`, and a look inside the `Cycle` it returns.

# %%
s = engine.session("class LineReader:\n    def __init__(self, path):\n        ", policy=wb.DDTree(budget=16), seed=0, max_new_tokens=96)
c = s.step()
tok = engine.tokenizer
show = lambda t: repr(tok.decode([int(t)]))
print(f"cycle {c.index}: root (previous bonus) {show(c.root_token)} at position {c.start}, {c.n_nodes} drafted nodes")

# %%
# The drafter's top-3 tokens per slot (slot d predicts depth d+1), with probabilities
import math
for d in range(5):
    row = ", ".join(f"{show(t)} {math.exp(lp):.2f}" for t, lp in zip(c.draft_topk_tokens[d, :3], c.draft_topk_logprobs[d, :3]))
    print(f"slot {d + 1}: {row}")

# %%
# The tree, flattened best-first: parent index, depth, token, target's choice at that node
for i in range(c.tokens.shape[0]):
    p = int(c.parents[i])
    agreed = "root" if p < 0 else ("agreed" if int(c.tokens[i]) == int(c.target_choice[p]) else "")
    print(f"{i:2d} parent {p:2d} depth {int(c.depth[i])}  {show(c.tokens[i]):14s} target -> {show(c.target_choice[i]):14s} {agreed}")

# %% [markdown]
# **The accept walk on this cycle.** Start at the root. The target's choice at the current node is a
# token; if one of the node's children carries that token, move to it and repeat. When no child
# matches, stop: the target's choice at the last accepted node is the new bonus token. Nodes the
# target agreed with but whose parent was rejected are never reached.

# %%
path = c.accepted_nodes.tolist()
print("accepted nodes:", path)
print("accepted text :", repr(tok.decode(c.accepted_tokens.tolist()[1:])), "+ bonus", show(c.bonus))
print("accept length (incl. bonus):", c.accept_length)

# %%
c2 = s.step()
print(f"next cycle starts at position {c2.start} = {c.start} + {c.accept_length}; accepted {c2.accepted} drafted tokens")

# %% [markdown]
# **What we learned.** A cycle is one drafter forward (all slots at once), one tree, one target
# forward over every node, and a walk that keeps the longest path the target agrees with, plus the
# target's own next token. The next cycle starts exactly `accept_length` positions later.
