# %% [markdown]
# # 06 · Real checkpoints: the same workbench on a GPU host
#
# **Question.** What does a GPU-host user type to run a real target and its DFlash drafter (for
# example Qwen3-8B and z-lab's Qwen3-8B-DFlash-b16)? The same functions load the embedded default and
# published checkpoints. Where your checkpoints are not on this machine, a tiny random pair written in
# the very same on-disk layout stands in (z-lab's drafter config, a mask id the tokenizer has no
# string for), so every cell below runs here too; cells that need CUDA say so and print why they skip.

# %%
import os, pathlib, sys, tempfile, torch
import workbench as wb

TARGET = os.environ.get("WB_TARGET", "/models/Qwen3-8B")              # your target: a local HF directory
DRAFT = os.environ.get("WB_DRAFT", "/models/Qwen3-8B-DFlash-b16")     # its DFlash drafter
has_cuda = torch.cuda.is_available()
if not (os.path.isdir(TARGET) and os.path.isdir(DRAFT)):
    from workbench.models.stand_ins import write_draft, write_qwen3     # tiny random models in published layouts
    stand_in = pathlib.Path(tempfile.mkdtemp())
    TARGET, DRAFT = write_qwen3(stand_in / "target"), write_draft(stand_in / "draft", "zlab")
    print("stand-in: a tiny random Qwen3 target and DFlash drafter in the published layout")
print("CUDA available:", has_cuda)

# %% [markdown]
# Loading: `dtype="auto"` (the default) keeps the checkpoint's own dtype (bfloat16 for Qwen3-8B; the
# embedded pair is float32), weights go straight onto the device, and a target larger than one GPU
# takes `device_map="auto"`. A checkpoint that needs its own Python code (Kimi-K2) loads only with
# `trust_remote_code=True`; hybrid targets load for the families whose tree verify is built (Qwen3-Next,
# Qwen3.5 / 3.6: notebook 08) and are refused, with the reason, for others. The
# notes say what the loader noticed, here that the drafter's mask id has no string in the tokenizer
# (as in z-lab's Qwen3 drafters: only its embedding is used).

# %%
engine = wb.load(target=TARGET, draft=DRAFT, device="cuda" if has_cuda else "cpu",
                 kernel_backend="sglang" if has_cuda else "torch")
engine

# %% [markdown]
# Bad pairs are refused before any weights load, with messages that name both values:

# %%
try:
    wb.load(target="/models/does-not-exist")
except wb.ModelPairError as e:
    print("ModelPairError:", e)

# %% [markdown]
# z-lab's drafters were trained on chat-formatted, non-thinking prompts, so give the session
# `messages=`: the target tokenizer's chat template is applied (with `enable_thinking=False` where the
# template has that switch). Raw text goes in as `prompt=` (with the BOS the tokenizer would add, as
# Llama 3's does) and exact ids as `prompt_ids=`; the trace records which was used.

# %%
chat = [{"role": "user", "content": "Write a Python function that parses an HTTP header line."}]
s = engine.session(messages=chat, policy=wb.DDTree(64), max_new_tokens=64)
meta = s.trace.meta
print(meta["prompt_format"], meta["chat_template_kwargs"], "|", len(s.prompt_ids), "prompt tokens:")
print(s.prompt)

# %%
# NBVAL_IGNORE_OUTPUT

print(s.run().summary())

# %%
ar = engine.session(messages=chat, policy=wb.AR(), max_new_tokens=64)
ar.run()
d = wb.first_divergence(s, ar, tokenizer=engine.tokenizer)
print("DDTree(64) == AR token for token:", s.tokens == ar.tokens, "|", "identical" if d is None else d)

# %% [markdown]
# ## Lossless, precisely: float32 vs bfloat16
#
# Greedy speculative decoding is **token-for-token lossless in float32** and **lossless up to
# near-ties in reduced precision**. A tree-verify forward and a one-token decode (or a CPU and a CUDA
# kernel) round differently; where the target's two best tokens are within rounding of each other
# (bfloat16 keeps 8 bits of mantissa) the argmax can flip, and the outputs go their own ways from
# there. Every `Cycle` keeps the target's top-2 tokens and logits at each verified node, so
# `wb.first_divergence` shows where two runs part and whether a near-tie explains it. In float32 the
# same engine's DDTree and AR outputs are identical:

# %%
from workbench.shipped import eval_prompts
cpu32 = wb.load()
p = eval_prompts()[0]["prompt"]
fp32_ar, fp32_tree = (cpu32.session(p, policy=pol, max_new_tokens=64) for pol in (wb.AR(), wb.DDTree(32)))
fp32_ar.run(); fp32_tree.run()
print("float32 DDTree(32) == AR:", fp32_tree.tokens == fp32_ar.tokens, "| first divergence:", wb.first_divergence(fp32_tree, fp32_ar))

# %% [markdown]
# A real divergence on this CPU: bfloat16 DDTree(32) against float32 AR on the evaluation prompts,
# stopping at the first prompt whose outputs differ (its output is not compared by the tests: bfloat16
# rounding on a CPU depends on its instruction set; the cell still fails if a divergence is not a near-tie).

# %%
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

# %% [markdown]
# On a GPU host the same comparison runs on CUDA, with the accept walk in SGLang's CUDA JIT kernel
# (`kernel_backend="sglang"`): the kernel in use, a bfloat16 run beside a float32 run, and the
# divergence explanation. `tests/gpu/check_cuda.py` runs this (and more) as a check.

# %%
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

# %% [markdown]
# The GPU check: float32 on CUDA against the CPU, bfloat16 divergences explained as near-ties, the
# accept kernels against each other, and per-stage timings, in one JSON report (a few minutes).

# %%
# Needs CUDA: skipped with a reason otherwise.
import subprocess
check = [sys.executable, str(pathlib.Path(wb.__file__).parents[1] / "tests/gpu/check_cuda.py"),
         "--target", str(TARGET), "--draft", str(DRAFT)]
if has_cuda:
    subprocess.run(check, check=True)
else:
    print("skipped: no CUDA device here; on the GPU host: python tests/gpu/check_cuda.py --target $WB_TARGET --draft $WB_DRAFT")

# %% [markdown]
# Planning a deployment needs no GPU and no weights: shapes from the config alone.

# %%
import pathlib
configs = pathlib.Path(wb.__file__).parent / "configs"
wb.shapes.plan(configs / "qwen3-8b.json", batch=1, prompt_len=1024, budget=128,
               draft_config=configs / "qwen3-8b-dflash-b16.json")   # with the drafter's block forward

# %% [markdown]
# ## An engine that outlives the notebook
#
# Loading an 8B target and its drafter takes minutes; a kernel restart should not throw that away,
# and two notebooks should be able to share one loaded engine. On the GPU host the engine runs in
# its own process, and notebooks attach to it:
#
# ```
# python -m workbench serve --target DIR --draft DIR --device cuda --token-file ~/.wb-token
# ```
#
# It binds 127.0.0.1 (reach it through an SSH tunnel) and needs its token on every request. Here we
# serve the embedded default from a subprocess on loopback, the same way.

# %%
# NBVAL_IGNORE_OUTPUT

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

# %% [markdown]
# `wb.connect` returns an object with the local engine's API; the client needs only the standard library.

# %%
remote = wb.connect(url, token_file=token_file)
info = remote.info
print(info["models"]["target_layers"], "target layers on", info["device"], info["dtype"], "| wire version", info["wire_version"])
print("limits:", info["limits"])

# %%
s = remote.session("def parse_header(line):\n    ", policy=wb.DDTree(budget=16), max_new_tokens=48)
c = s.step()                       # one cycle on the server -> a wb.Cycle, as a local session returns
# (what the views read came with it; the drafter's top-k, top-2 logits and forward records come when first read)
print("a wb.Cycle:", isinstance(c, wb.Cycle), "| cycle", c.index, "|", c.n_nodes, "nodes,", c.accepted, "accepted |",
      repr(s.text))

# %%
# NBVAL_IGNORE_OUTPUT

wb.views.tree_figure(c, remote.tokenizer)   # the views read the Cycle; the tokenizer comes from the server

# %% [markdown]
# The records are the very ones a local engine makes (timings aside):

# %%
local = wb.load().session("def parse_header(line):\n    ", policy=wb.DDTree(budget=16), max_new_tokens=48)
lc = local.step()
same = {k: v for k, v in lc.to_dict().items() if k != "stage_seconds"} == {k: v for k, v in c.to_dict().items() if k != "stage_seconds"}
print("remote cycle == local cycle:", same)

# %% [markdown]
# **Surviving a kernel restart.** The session lives on the server; keep its id (here a variable,
# in practice a file or the notebook itself) and re-attach after the restart: the whole trace comes back.

# %%
session_id = s.id
del remote, s, c                   # all a kernel restart loses
remote = wb.connect(url, token_file=token_file)
s = remote.session_by_id(session_id)
print(len(s.cycles), "cycle(s) back |", repr(s.text))
t = s.run()                        # carry on where it stopped
print(f"{len(t.cycles)} cycles, tau {t.tau:.2f}, {t.new_tokens} new tokens, finished: {t.finish_reason}")

# %%
wb.shapes.check_contracts(s)       # shapes tables and contract checks take a remote session as they take a local one

# %% [markdown]
# Stopping the server (Ctrl-C, SIGINT or SIGTERM) finishes the running cycle, drops the live sessions with a log line, and exits cleanly.

# %%
server.send_signal(signal.SIGINT)
print("server exit code:", server.wait(timeout=120))
server_log.close()
print(next(l for l in (work / "server.log").read_text().splitlines() if "stopped" in l).split(";")[0])

# %% [markdown]
# **What we learned.** Nothing in the workbench is specific to the embedded models: `wb.load` takes
# local directories in every published DFlash layout, keeps the checkpoint's dtype, validates the pair,
# and never downloads; chat prompts go through the target's own template. With CUDA the
# accept walk runs through SGLang's own CUDA JIT kernel. Greedy speculative decoding is lossless token
# for token in float32 and up to near-ties in reduced precision, and `wb.first_divergence` tells the
# two apart from the recorded top-2 logits. And the engine need not live in the notebook:
# `python -m workbench serve` keeps it loaded, and `wb.connect` attaches any notebook to it with the same API.
