# %% [markdown]
# # 01 · Quickstart: is speculative decoding lossless here, and what does it buy?
#
# **Question.** With the embedded target and its DFlash drafter, do plain autoregressive decoding
# (AR), linear DFlash and a DDTree draft tree produce the *same* text under greedy decoding, and how
# do they differ in tokens accepted per target forward (tau) and in speed? Everything here runs on a
# laptop CPU in seconds; on a GPU host the same cells run with `wb.load(target=..., draft=..., device="cuda")`.

# %%
import workbench as wb

engine = wb.load()          # the embedded Qwen3-architecture target + DFlash drafter (trained in this repo)
engine

# %%
prompt = "def parse_header(line):\n    "
runs = {}
for policy in [wb.AR(), wb.DFlash(), wb.DDTree(budget=32)]:
    s = engine.session(prompt, policy=policy, temperature=0.0, seed=0, max_new_tokens=64)
    s.run()
    runs[str(policy)] = s
print(runs["AR"].text)

# %%
texts = {name: s.text for name, s in runs.items()}
print("identical greedy text:", len(set(texts.values())) == 1)
for name, s in runs.items():
    print(f"{name:12s} tau = {s.trace.tau:.2f}   cycles = {len(s.cycles)}   new tokens = {len(s.tokens)}")

# %%
# NBVAL_IGNORE_OUTPUT

for name, s in runs.items():
    print(s.trace.summary())          # tokens/s are timings: they vary from run to run

# %% [markdown]
# **About the speed above.** On this CPU, DFlash and DDTree can come out *slower* than AR although
# they commit several tokens per target forward. The embedded target is tiny (6 layers, hidden 256):
# its forward costs about as much as the drafter's forward plus the tree bookkeeping, so saving
# target forwards saves little time, and one 64-token run is too short and too noisy (the machine
# is shared; AR alone has varied 78-146 tok/s across runs) to rank policies. Speculative decoding
# pays when the target forward dominates the cycle: a large target on a GPU, where a forward over
# 33 tree nodes costs about what a one-token forward costs. `05_budget_sweep` measures where each
# cycle's time goes, over many prompts with repeats.

# %% [markdown]
# One DDTree cycle: the tree the drafter proposed (the root is the previous bonus token), coloured by
# what the target did. The bold path is what it accepted; the last node is the new bonus token.

# %%
# NBVAL_IGNORE_OUTPUT

cycle = runs["DDTree(32)"].cycles[1]
wb.views.tree_figure(cycle, engine.tokenizer)

# %% [markdown]
# **What we learned.** Greedy speculative decoding is lossless: the three policies print the same
# text token for token. They differ in how many tokens each target forward commits: linear DFlash
# commits several per cycle, and the DDTree, which verifies many alternative continuations in one
# forward, commits more. Whether that is faster depends on what a wider verify costs; see
# `05_budget_sweep`.
