"""GPU check of the workbench on one CUDA device, in 5-8 minutes; prints a one-screen JSON report.

    python tests/gpu/check_cuda.py [--out REPORT.json] [--target DIR --draft DIR] [--sections a,b]

(5-8 minutes is an estimate: cuda_graphs, cost_sweep and payoff_calibrated have not run on a GPU yet; the
last alone is about 2.5 minutes by the engine's eager step on a GPU, 274 decodes of 8 tokens per mode.)

Sections (each catches its own failure and reports it; the others still run):
  fp32_cuda_vs_cpu   float32 DDTree(32) on CUDA == float32 AR on the CPU, token for token
  bf16_vs_ar         bfloat16 DDTree(32) vs the same engine's AR (SGLang's CUDA JIT kernel accepting);
                     every divergence must be a near-tie (wb.first_divergence)
  accept_backends    torch, sglang (CUDA JIT) and sglang-triton agree on random batches
  sync_free_build    build_tree + compile_tree under torch.cuda.set_sync_debug_mode("error")
  stages             per-stage p50 / p90 (ms) per DDTree budget, bf16, and tau
  cuda_graphs        wb.load(cuda_graphs=True): graph replay == eager static shapes (and == dynamic) token
                     for token per budget; ms per cycle (p50/p90, per stage) eager dynamic / eager static /
                     graphs, AR ms per token, captures and replays (written without a GPU: not yet run)
  cost_sweep         random-weight Qwen3-8B-sized target + drafter (bf16, no checkpoint): the verify forward over
                     nodes 1..64 x rows 1/4/16 and the draft forward, eager and graphed (workbench.bench.sweep),
                     beside the cost model's prediction: per-point error, median and max (written without a
                     GPU: its CPU path runs in tests/bench/test_sweep.py on a tiny config; not yet run on a GPU)
  payoff_calibrated  pays-off's measurement (wb.pays_off) of AR, DFlash, DDTree(8, 16) and the calibrated policies
                     (PathTree(16), CostTree(64), CutTree(16), PairTree(16), PairChain(8), and the learned head's
                     CondTree(16), CondChain(8)) at batch 1 and 8 (static and refilled) on the random-weight
                     Qwen3-8B layout, eager and with cuda_graphs=True, 10 prompts x 8 tokens; prints pays-off's
                     tables. A random pair cannot be calibrated (no path state gets the target hits an estimate
                     needs), so it runs under a stand-in calibration: the embedded dense pair's acceptance model,
                     cost table and thresholds, a successor table and a learned head of the real ones' shapes
                     (random), under this pair's identity. Per-step costs are real (the learned head's scoring
                     and the conditioned build included); acceptance on random weights is not
                     (written without a GPU: its CPU path runs in tests/gpu/test_cuda.py on a tiny config; not
                     yet run on a GPU)
Run some sections only with --sections a,b. The report goes to --out, else $OUT/check_cuda.json when $OUT is set
(and always to stdout).
Exit 0 when every section passed, 1 otherwise; without CUDA it prints why and exits 0.
Needs only torch, transformers, tokenizers, safetensors, dflash, numpy (+ sglang's kernels and
apache-tvm-ffi + nvcc for the JIT kernel); not collected by pytest (CI has no GPU).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run from anywhere: the checkout's workbench, not another install
    sys.path.insert(0, str(ROOT))


def _kernels_importable() -> None:
    """A bare checkout (no `pip install -e .`, no ddtree_kernels symlink): import kernels/ by that name."""
    import importlib.util

    if importlib.util.find_spec("ddtree_kernels") is not None:
        return
    spec = importlib.util.spec_from_file_location("ddtree_kernels", ROOT / "kernels" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "kernels")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ddtree_kernels"] = mod
    spec.loader.exec_module(mod)


BUDGETS = (16, 64, 256)


def random_batch(seed: int, bs: int, budget: int, device, depth: int = 8, vocab: int = 64, p_follow: float = 0.85):
    """A random DDTree batch and target choices that follow some child with probability ``p_follow``.
    -> (tree, compiled, choice [bs, n], depth), all on ``device``."""
    from ddtree_kernels import build_tree, compile_tree

    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(bs, depth, vocab, generator=g) * 3, dim=-1)  # [bs, D, V]
    roots = torch.randint(0, vocab, (bs,), generator=g)
    tree = build_tree(lp.to(device), roots.to(device), budget)
    tokens, parents = tree.tokens.cpu(), tree.parents.cpu()  # [bs, n]
    child = torch.full_like(tokens, -1)
    child.scatter_(1, parents[:, 1:], tokens[:, 1:])  # a child's token at its parent (any child)
    follow = (torch.rand(tokens.shape, generator=g) < p_follow) & (child >= 0)
    choice = torch.where(follow, child, torch.randint(0, vocab, tokens.shape, generator=g))
    return tree, compile_tree(tree, 0, depth), choice.to(device), depth


def accept_backends(n_batches: int = 40, device: str = "cuda") -> dict:
    """torch, sglang (on CUDA: the JIT kernel) and sglang-triton on the same random batches."""
    from ddtree_kernels import accept
    from ddtree_kernels.sglang_backend import kernel_name, load_jit, uses_jit

    t0 = time.perf_counter()
    if uses_jit("sglang", device):
        load_jit()  # compiles on first use (about 20 s), then loads from the cache
    compile_s = time.perf_counter() - t0
    agree, bad = 0, []
    budgets = (8, 16, 32, 64, 128)
    for i in range(n_batches):
        bs, budget = 1 + i % 4, budgets[i % len(budgets)]
        tree, ct, choice, depth = random_batch(i, bs, budget, device)
        res = {b: accept(b, tree, ct, choice, depth) for b in ("torch", "sglang", "sglang-triton")}
        ref = res["torch"]
        same = all(torch.equal(r.index, ref.index) and torch.equal(r.length, ref.length)
                   and torch.equal(r.bonus, ref.bonus) for r in res.values())
        agree += same
        if not same and len(bad) < 3:
            bad.append({"seed": i, "bs": bs, "budget": budget,
                        **{b: r.length.tolist() for b, r in res.items()}})
    return {"ok": agree == n_batches, "agree": f"{agree}/{n_batches}", "jit_load_s": round(compile_s, 1),
            "kernel": kernel_name("sglang", device), **({"mismatches": bad} if bad else {})}


def sync_free_build() -> dict:
    """build_tree + compile_tree as the engine calls them, with any host sync raising an error."""
    from ddtree_kernels import build_tree, compile_tree

    out = {}
    for budget in BUDGETS:
        lp = torch.log_softmax(torch.randn(1, 15, 4096, device="cuda"), dim=-1)  # [1, D, V]
        roots = torch.tensor([1], device="cuda")
        compile_tree(build_tree(lp, roots, budget), 100, 15)  # warm: lazy CUDA init may sync once
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            compile_tree(build_tree(lp, roots, budget), 100, 15)
            out[str(budget)] = "sync-free"
        except RuntimeError as e:
            out[str(budget)] = "syncs: " + " ".join(str(e).split())[:160]
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return {"ok": all(v == "sync-free" for v in out.values()), **out}


def run_session(engine, prompt, policy, n):
    s = engine.session(prompt, policy=policy, max_new_tokens=n)
    s.run()
    return s


def fp32_cuda_vs_cpu(wb, models, prompts, n, device: str = "cuda") -> dict:
    cpu = wb.load(*models, dtype="float32")  # the reference: float32 whatever the checkpoint holds
    gpu = wb.load(*models, device=device, dtype="float32")
    equal, diverged = 0, []
    for p in prompts:
        ref, got = run_session(cpu, p, wb.AR(), n), run_session(gpu, p, wb.DDTree(32), n)
        if ref.tokens == got.tokens:
            equal += 1
        else:
            d = wb.first_divergence(got, ref)
            diverged.append({"token": d.position, "kind": d.kind, "cause": d.cause[:160]})
    return {"ok": equal == len(prompts), "equal": f"{equal}/{len(prompts)}",
            **({"diverged": diverged} if diverged else {})}


def own_forwards(wb, models, prompts, device: str = "cuda") -> dict:
    """The engine's own target forward (workbench/models/dense_forward.py) against transformers' on the
    device: bit for bit on a CPU; here the fused RMSNorm may round differently, so report the largest
    difference (float32 and bfloat16)."""
    from transformers import DynamicCache

    from workbench.models import dense_forward

    out = {"ok": True}
    for dtype in ("float32", "bfloat16"):
        engine = wb.load(*models, device=device, dtype=dtype)
        m = engine.models
        ids = torch.tensor([engine.encode(prompts[0]).ids[:64]], device=device)
        pos = torch.arange(ids.shape[1], device=device)[None]
        with torch.inference_mode():
            own = dense_forward.forward(m.target, ids, pos, DynamicCache(config=m.target.config), None, [1])
            if own is None:
                out[dtype] = "the target takes the model's own forward (dense_forward.plan is None)"
                continue
            theirs = m.target(input_ids=ids, position_ids=pos, past_key_values=DynamicCache(config=m.target.config),
                              use_cache=True)
        diff = float((own[0].float() - theirs.logits.float()).abs().max())
        scale = float(theirs.logits.float().abs().max())
        out[dtype] = {"max_abs_logit_diff": diff, "relative": diff / scale}
        out["ok"] &= diff / scale < (1e-5 if dtype == "float32" else 2e-2)
    return out


def load_bf16(wb, models, device: str, backend: str):
    """-> (engine, backend used, note): falls back to the torch walk when SGLang's kernel cannot load, so
    the section still checks what it can (the failure itself is reported by accept_backends)."""
    try:
        return wb.load(*models, device=device, dtype="bfloat16", kernel_backend=backend), backend, None
    except RuntimeError as e:
        note = f"kernel_backend={backend!r} unavailable, used 'torch': {' '.join(str(e).split())[:160]}"
        return wb.load(*models, device=device, dtype="bfloat16"), "torch", note


def bf16_vs_ar(wb, models, prompts, n, device: str = "cuda", backend: str = "sglang") -> dict:
    eng, backend, note = load_bf16(wb, models, device, backend)
    equal, kinds, first = 0, {}, None
    for p in prompts:
        ar, dd = run_session(eng, p, wb.AR(), n), run_session(eng, p, wb.DDTree(32), n)
        if ar.tokens == dd.tokens:
            equal += 1
            continue
        d = wb.first_divergence(dd, ar, tokenizer=eng.tokenizer)
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
        if first is None or not d.near_tie:
            first = repr(d)[:400]
    unexplained = sum(v for k, v in kinds.items() if not k.startswith("near-tie"))
    return {"ok": unexplained == 0, "kernel_backend": backend, "equal_own_ar": f"{equal}/{len(prompts)}",
            "divergences": kinds, **({"example": first} if first else {}), **({"note": note} if note else {})}


def pct(xs, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def stages(wb, models, prompts, n, device: str = "cuda", budgets=BUDGETS, backend: str = "sglang") -> dict:
    eng, backend, _ = load_bf16(wb, models, device, backend)
    run_session(eng, prompts[0], wb.DDTree(budgets[0]), 16)  # warm-up: kernels, allocator
    out = {}
    for budget in budgets:
        traces = [eng.generate(p, wb.DDTree(budget), max_new_tokens=n) for p in prompts]
        cyc = [c for t in traces for c in t]
        row = {s: [round(1e3 * pct([c.stage_seconds[s] for c in cyc], q), 3) for q in (0.5, 0.9)]
               for s in cyc[0].stage_seconds}
        row["tau"] = round(statistics.mean(t.tau for t in traces), 2)
        out[f"ddtree{budget}"] = row
    return {"ok": True, "unit": "ms [p50, p90] per cycle", "kernel_backend": backend, **out}


def cuda_graphs(wb, models, prompts, n, device: str = "cuda", budgets=(16, 64)) -> dict:
    """Static shapes replayed from CUDA graphs against the same engine eager (static and dynamic shapes):
    the same tokens, and how much a cycle's launches cost."""
    eager = wb.load(*models, device=device, dtype="bfloat16")
    graphed = wb.load(*models, device=device, dtype="bfloat16", cuda_graphs=True)

    def cycle_ms(traces):
        cyc = [c for t in traces for c in t.cycles[1:]]  # the first cycle drafts the prompt's context
        tot = [1e3 * sum(c.stage_seconds.values()) for c in cyc]
        stages = {st: [round(1e3 * pct([c.stage_seconds[st] for c in cyc], q), 3) for q in (0.5, 0.9)]
                  for st in cyc[0].stage_seconds}
        return {"cycle": [round(pct(tot, 0.5), 3), round(pct(tot, 0.9), 3)], **stages}

    out, ok = {}, True
    ar = [run_session(eager, p, wb.AR(), n) for p in prompts]
    ar_ms = statistics.median(1e3 * sum(sum(c.stage_seconds.values()) for c in s.cycles) / len(s.cycles) for s in ar)
    out["ar_ms_per_token"] = round(ar_ms, 3)
    for budget in budgets:
        pol = wb.DDTree(budget)
        run_session(graphed, prompts[0], pol, 16)  # captures (draft, verify) for this bucket
        run_session(eager, prompts[0], pol, 16)
        runs = {"dynamic": [], "static": [], "graphs": []}
        for p in prompts:  # interleaved: the three see the same GPU
            runs["dynamic"].append(run_session(eager, p, pol, n))
            s = eager.session(p, policy=pol, max_new_tokens=n, static_shapes=True)
            s.run()
            runs["static"].append(s)
            runs["graphs"].append(run_session(graphed, p, pol, n))
        same_static = sum(a.tokens == b.tokens for a, b in zip(runs["graphs"], runs["static"]))
        same_dynamic = sum(a.tokens == b.tokens for a, b in zip(runs["graphs"], runs["dynamic"]))
        ok &= same_static == len(prompts)
        times = {k: cycle_ms([s.trace for s in v]) for k, v in runs.items()}
        tau = statistics.mean(s.trace.tau for s in runs["graphs"])
        out[f"ddtree{budget}"] = {
            "graphs_eq_static": f"{same_static}/{len(prompts)}", "graphs_eq_dynamic": f"{same_dynamic}/{len(prompts)}",
            "tau": round(tau, 2), "ms_per_cycle": times,
            "graphs_vs_eager_cycle": round(times["graphs"]["cycle"][0] / times["dynamic"]["cycle"][0], 3),
            "speedup_vs_ar": round(tau * ar_ms / times["graphs"]["cycle"][0], 3),
        }
    out["captures"], out["replays"] = graphed.graphs.captures, graphed.graphs.replays
    return {"ok": ok, "unit": "ms [p50, p90]", **out}


SWEEP_NODES = (1, 2, 4, 8, 16, 32, 64)
SWEEP_ROWS = (1, 4, 16)


def cost_sweep(device: str = "cuda", config="qwen3-8b", draft_config="qwen3-8b-dflash-b16", layers=None,
               draft_layers=None, nodes=SWEEP_NODES, rows=SWEEP_ROWS, context: int = 512, repeats: int = 5,
               warmup: int = 2, dtype: str = "bfloat16") -> dict:
    """The measured verify/draft sweep on a random-weight layout and the cost model's error against it.
    On a GPU: Qwen3-8B whole in bf16, eager and graphed; on a CPU (the test): a tiny config, eager only."""
    from workbench.bench.random_models import random_models
    from workbench.bench.sweep import sweep
    from workbench.shapes.measured import sweep_error

    t0 = time.perf_counter()
    models = random_models(config, draft_config, device, dtype, layers, draft_layers, rows=max(rows),
                           nodes=max(nodes), context=context)
    build_s = time.perf_counter() - t0
    graphs = torch.device(device).type == "cuda"
    s = sweep(models, nodes, rows, context, repeats, warmup, graphs=graphs)
    err = sweep_error(s)
    del models
    if graphs:
        torch.cuda.empty_cache()
    ms = {f"{p.kind}/{p.mode} rows={p.rows} nodes={p.nodes}": [round(p.median * 1e3, 3),
                                                               [round(q * 1e3, 3) for q in p.quartiles]]
          for p in s.points}
    by = {f"{k}/{m}": {"median": round(v["median_rel_error"], 3), "max": round(v["max_rel_error"], 3)}
          for (k, m), v in err.by_kind().items()}
    dev = s.device
    return {"ok": all(math.isfinite(r["rel_error"]) for r in err.rows), "model": s.settings["model"],
            "dtype": s.settings["dtype"], "context": context, "repeats": repeats, "build_s": round(build_s, 1),
            "device_roofline": {"tflops": round(dev.flops / 1e12, 1), "tb_s": round(dev.bandwidth / 1e12, 2),
                                "us_per_op": round(dev.op_seconds * 1e6, 2)},
            "median_rel_error": round(err.median_rel_error, 3), "max_rel_error": round(err.max_rel_error, 3),
            "error_by_kind": by, "ms [median, [p25, p75]]": ms,
            "predicted_ms": {f"{r['kind']}/{r['mode']} rows={r['rows']} nodes={r['nodes']}": round(r["predicted_s"] * 1e3, 3)
                             for r in err.rows}}


PAYOFF_BATCHES = (1, 8)
EMBEDDED_CALIBRATION = "dense"  # the stand-in's acceptance model, cost table and thresholds


def stand_in_calibration(models, folder: Path, embedded: str = EMBEDDED_CALIBRATION, seed: int = 0) -> Path:
    """A calibration file the calibrated policies accept on ``models``, a random-weight pair that no calibration
    can be made on (a random drafter's candidates are almost never the random target's token, so no path state
    gets the hits an estimate needs): the embedded pair's acceptance model, cost table and thresholds under this
    pair's identity, and a pair head of the shipped head's shape (successors per token) over this pair's
    vocabulary, built by the head's own builder from random token pairs. The policies then run their whole
    machinery at full size (path estimates, head lookups, cuts), which is what their per-step cost needs; their
    acceptance on random weights means nothing. -> the file's path."""
    import numpy as np

    from workbench.engine.policies.calibration import FORMAT as CAL_FORMAT, SHIPPED, VERSION as CAL_VERSION, file_sha256
    from workbench.engine.policies.pair_head import FORMAT as HEAD_FORMAT, VERSION as HEAD_VERSION, load_head
    from workbench.models.identity import pair_identity
    from workbench.train.pair_head import build

    pair = pair_identity(models)
    source = json.loads(SHIPPED[embedded].read_text())
    shipped_head = load_head(SHIPPED[embedded].parent / source["pair_head"]["file"])
    vocab = pair["vocab"]
    rng = np.random.default_rng(seed)
    arrays = build([rng.integers(0, vocab, 200_000)], vocab, successors=shipped_head.succ_ids.shape[1])
    meta = {"format": HEAD_FORMAT, "version": HEAD_VERSION, "vocab": vocab, "tokenizer": pair["tokenizer"],
            "made": {"by": "tests/gpu/check_cuda.py stand_in_calibration: random token pairs (timing only)"}}
    head = folder / "stand_in_head.npz"
    np.savez_compressed(head, meta=np.array(json.dumps(meta)), succ_ids=arrays["succ_ids"],
                        succ_logp=arrays["succ_logp"], backoff_logp=arrays["backoff_logp"])
    doc = {"format": CAL_FORMAT, "version": CAL_VERSION, "pair": pair,
           "made": {**source["made"], "stand_in": f"the {embedded} pair's calibration under a random-weight pair's "
                                                  "identity (tests/gpu/check_cuda.py): per-step cost only"},
           "acceptance": source["acceptance"], "cost": source["cost"], "thresholds": source["thresholds"],
           "pair_head": {"file": head.name, "sha256": file_sha256(head), "beta": source["pair_head"]["beta"]}}
    path = folder / "stand_in_calibration.json"
    path.write_text(json.dumps(doc))
    return path


def stand_in_cond_head(models, folder: Path, embedded: str = EMBEDDED_CALIBRATION, seed: int = 0) -> Path:
    """A learned conditioned head CondTree and CondChain accept on ``models``, a random-weight pair no head can be
    trained on (its target's tokens are noise): the shipped head's K and rank, random arrays at the shipped ones'
    spread over this pair's vocabulary and hidden size, under this pair's identity. Its scoring and the
    conditioned build then run at full size (a [V, rank] gather per candidate, the k x k increments), which is
    what their per-step cost needs; their acceptance on random weights means nothing. -> the file's path."""
    import numpy as np

    from workbench.engine.policies.cond_head import FORMAT, VERSION, load_head
    from workbench.models.identity import pair_identity

    pair = pair_identity(models)
    shipped = load_head(embedded)
    V, H = pair["vocab"], int(models.target.lm_head.weight.shape[1])  # the drafter's states feed the target's LM head
    r = int(shipped.meta["rank"])
    rng = np.random.default_rng(seed)
    shapes = {"P": (r, H), "p0": (r,), "E": (V, r), "R": (5, r), "U": (V, r), "u_out": (r,)}
    arrays = {k: (rng.standard_normal(shape) * float(shipped.arrays[k].astype(np.float32).std())).astype(
        shipped.arrays[k].dtype) for k, shape in shapes.items()}
    arrays["scalars"] = shipped.arrays["scalars"]
    meta = {"format": FORMAT, "version": VERSION, "K": shipped.K, "rank": r,
            "pair": {k: pair[k] for k in ("vocab", "tokenizer", "block_size", "drafter", "target")},
            "made": {"by": "tests/gpu/check_cuda.py stand_in_cond_head: random arrays (timing only)"}}
    path = folder / "stand_in_cond_head.npz"
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    return path


def short_label(label: str) -> str:
    """'PathTree(16, calibration=/tmp/x/c.json)' -> 'PathTree(16)', 'CondTree(16, head=/tmp/x/h.npz)' ->
    'CondTree(16)': the report's keys name the policy, not the stand-in file every calibrated label carries."""
    import re

    return re.sub(r", (calibration|head)=[^,)]*", "", label)


def payoff_summary(res) -> dict:
    """Per batch size (static, and refilled where measured: 'B refilled'): tokens per forward and the median step
    (ms) per shape, the fastest line, each calibrated policy against the best DDTree budget and what decides, and
    how many greedy outputs differ from AR's."""
    out = {}
    batches = [(str(b), v) for b, v in res.batches.items()] + [(f"{b} refilled", v) for b, v in res.refilled.items()]
    for b, v in batches:
        out[b] = {
            "tok/fwd": {short_label(r.label): round(r.tokens_per_forward, 3) for r in v.rows},
            "step_ms": {short_label(r.label): round(r.step_ms["total"], 3) for r in v.rows},
            "best_budget": v.best_budget, "fastest": short_label(v.fastest),
            "versus_best": [short_label(c.line) + (f"; {c.decision.factor} decides" if c.decision else "")
                            for c in v.versus_best],
            "outputs_differing_from_ar": len(v.lossless)}
    return out


def payoff_calibrated(device: str = "cuda", config="qwen3-8b", draft_config="qwen3-8b-dflash-b16", layers=None,
                      draft_layers=None, prompts: int = 10, max_new_tokens: int = 8, batches=PAYOFF_BATCHES,
                      dtype: str = "bfloat16", graphs: bool | None = None, say=print) -> dict:
    """pays-off's measurement of the calibrated policies beside AR, DFlash and DDTree(8, 16) on a random-weight
    layout (``workbench.bench.random_models``), under a stand-in calibration (``stand_in_calibration``), eager
    and, on CUDA, with cuda_graphs=True; prints pays-off's tables through ``say``. ``ok``: every mode measured
    every calibrated policy against the best DDTree budget at every batch size. Greedy outputs that differ
    from AR's are counted, not failed: random bf16 logits are full of near-ties (bf16_vs_ar checks losslessness)."""
    import dataclasses
    import tempfile

    import workbench as wb
    from workbench.bench.random_models import random_models
    from workbench.engine.core import Engine
    from workbench.payoff import pays_off
    from workbench.shipped import eval_prompts

    t0 = time.perf_counter()
    graphs = torch.device(device).type == "cuda" if graphs is None else graphs
    models = random_models(config, draft_config, device, dtype, layers, draft_layers, rows=max(batches), nodes=65,
                           context=256)
    # the embedded pair's tokenizer: a random layout ships none, and its ids fit any larger vocabulary
    models = dataclasses.replace(models, tokenizer=wb.load().models.tokenizer)
    build_s = time.perf_counter() - t0
    folder = Path(tempfile.mkdtemp(prefix="check_cuda_"))
    cal, head = str(stand_in_calibration(models, folder)), str(stand_in_cond_head(models, folder))
    policies = [wb.DDTree(8), wb.DDTree(16), wb.PathTree(16, calibration=cal), wb.CostTree(64, calibration=cal),
                wb.CutTree(16, calibration=cal), wb.PairTree(16, calibration=cal), wb.PairChain(8, calibration=cal),
                wb.CondTree(16, head=head), wb.CondChain(8, head=head)]
    texts = eval_prompts("short")[:prompts]
    report = {"model": models.notes[0] if models.notes else config, "dtype": dtype, "prompts": len(texts),
              "max_new_tokens": max_new_tokens, "build_s": round(build_s, 1),
              "calibration": f"stand-in ({EMBEDDED_CALIBRATION} pair's model, costs and thresholds; random successor "
                             "table and learned head): per-step cost is real, acceptance on random weights is not"}
    modes = [("eager", False)] + ([("graphs", True)] if graphs else [])
    for mode, cuda_graphs in modes:
        t1 = time.perf_counter()
        engine = Engine(models, cuda_graphs=cuda_graphs)
        res = pays_off(engine, texts, batch=batches, policies=policies, max_new_tokens=max_new_tokens,
                       progress=False)
        say(f"== payoff_calibrated, {mode} ==\n{short_label(str(res))}")
        report[mode] = {**payoff_summary(res), "seconds": round(time.perf_counter() - t1, 1)}
        if cuda_graphs:
            report[mode]["captures"] = engine.graphs.captures
        del engine
    calibrated = len(policies) - 2  # all but the DDTree budgets
    report["ok"] = all(len(report[m][str(b)]["versus_best"]) == calibrated for m, _ in modes for b in batches)
    del models
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return report


def one_screen(report: dict) -> str:
    """JSON with one line per top-level key and per section entry: fits a screen, still valid JSON."""
    def block(v):
        if not isinstance(v, dict):
            return json.dumps(v)
        return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(x)}" for k, x in v.items()) + "}"
    return "{\n" + ",\n".join(f"{json.dumps(k)}: {block(v)}" for k, v in report.items()) + "\n}"


def run_section(report: dict, name: str, fn, *args) -> None:
    t0 = time.perf_counter()
    try:
        report[name] = fn(*args)
    except Exception as e:  # noqa: BLE001  (report it; the other sections still run)
        report[name] = {"ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                        "where": traceback.extract_tb(e.__traceback__)[-1].name}
    report[name]["seconds"] = round(time.perf_counter() - t0, 1)


SECTIONS = ("accept_backends", "sync_free_build", "own_forwards", "fp32_cuda_vs_cpu", "bf16_vs_ar", "stages",
            "cuda_graphs", "cost_sweep", "payoff_calibrated")


def sections_arg(text: str) -> tuple[str, ...]:
    """'a,b' -> the sections to run, in the check's own order; an unknown name is refused in one line."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in SECTIONS]
    if unknown or not names:
        what = "unknown section " + ", ".join(unknown) if unknown else "no section"
        raise argparse.ArgumentTypeError(f"{text!r}: {what}; give some of {','.join(SECTIONS)}")
    return tuple(x for x in SECTIONS if x in names)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON report here (default: $OUT/check_cuda.json when $OUT is set)")
    ap.add_argument("--target", help="target model directory (default: the embedded pair)")
    ap.add_argument("--draft", help="DFlash drafter directory (with --target)")
    ap.add_argument("--prompts", type=int, default=8, help="evaluation prompts per section (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--sections", type=sections_arg, default=SECTIONS,
                    help=f"comma-separated sections to run (default: all, {','.join(SECTIONS)})")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA device on this machine (torch.cuda.is_available() is False); "
              "run this on a GPU host")
        return 0
    t0 = time.perf_counter()
    _kernels_importable()
    import workbench as wb
    from workbench.shipped import eval_prompts

    models = (args.target, args.draft)
    prompts = [p["prompt"] for p in eval_prompts()[: args.prompts]]
    n = args.max_new_tokens
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cuda": torch.version.cuda, "prompts": len(prompts), "max_new_tokens": n}
    for mod in ("transformers", "triton", "tokenizers", "tvm_ffi"):
        try:
            report[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            report[mod] = None
    calls = {"accept_backends": (accept_backends,), "sync_free_build": (sync_free_build,),
             "own_forwards": (own_forwards, wb, models, prompts),
             "fp32_cuda_vs_cpu": (fp32_cuda_vs_cpu, wb, models, prompts, n),
             "bf16_vs_ar": (bf16_vs_ar, wb, models, prompts, n), "stages": (stages, wb, models, prompts, 2 * n),
             "cuda_graphs": (cuda_graphs, wb, models, prompts, 2 * n), "cost_sweep": (cost_sweep,),
             "payoff_calibrated": (payoff_calibrated,)}  # its own 10 prompts x 8 tokens: pays-off needs 10
    for name in args.sections:
        run_section(report, name, *calls[name])
    sections = [k for k, v in report.items() if isinstance(v, dict) and "ok" in v]
    report["passed"] = [k for k in sections if report[k]["ok"]]
    report["failed"] = [k for k in sections if not report[k]["ok"]]
    report["seconds"] = round(time.perf_counter() - t0, 1)
    text = one_screen(report)
    print(text)
    dest = args.out or (os.path.join(os.environ["OUT"], "check_cuda.json") if os.environ.get("OUT") else None)
    if dest:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{dest}.tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, dest)  # atomically
    return 0 if not report["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
