"""A plain single-request DDTree decoder: the speed baseline the engine is measured against.

Written the straightforward way a researcher would write it from the paper: Hugging Face's
``DynamicCache``, the top-k per slot copied to the host once and a Python best-first heap
(``ddtree_kernels.oracles.heap_tree_lists``), ancestry built row by row, verify inputs and
an additive mask written into preallocated buffers, a Python accept walk, and the cache
compacted by ``index_select`` + ``cat``. Greedy only. It shares the models with an engine,
so ``compare_reference`` can run both on the same prompts, interleaved, and
check that they decode the same trees.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import DynamicCache

from ddtree_kernels.oracles import accept_walk_python, heap_tree_lists
from workbench.models.config_facts import draft_value

STAGES = ("draft", "tree_build", "tree_compile", "verify", "accept_commit")


@dataclass
class ReferenceRun:
    tokens: list[int]  # generated tokens, the prefill's first token included
    accept_lengths: list[int]
    wall_time: float  # prefill + every cycle
    cycle_seconds: list[dict] = field(default_factory=list)  # per cycle: stage -> seconds


def _now(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


@torch.inference_mode()
def reference_generate(models, prompt: str, budget: int, max_new_tokens: int) -> ReferenceRun:
    """Greedy DDTree(budget) on one prompt with ``models`` (a ``workbench.engine.loading.Models``)."""
    from dflash.model import extract_context_feature

    dev, target, draft = models.device, models.target, models.draft
    B, layer_ids = models.block_size, models.target_layer_ids
    t0 = _now(dev)
    from workbench.engine.prompting import encode_prompt

    ids = encode_prompt(models.tokenizer, prompt).ids  # as a session encodes it (BOS where the tokenizer adds one)
    P = len(ids)
    cache, dcache = DynamicCache(config=target.config), DynamicCache(config=draft.config)
    out = target(input_ids=torch.tensor([ids], device=dev), position_ids=torch.arange(P, device=dev)[None],
                 past_key_values=cache, use_cache=True, output_hidden_states=True)
    context = extract_context_feature(out.hidden_states, layer_ids)
    generated = [int(out.logits[0, -1].argmax())]
    emb, scale = target.get_input_embeddings(), float(draft_value(draft.config, "input_embedding_scale", 1.0))

    # Preallocated verify inputs: token ids, positions and an additive mask (0 visible, -inf hidden).
    n_max = budget + 1
    ids_buf = torch.zeros(1, n_max, dtype=torch.long, device=dev)
    pos_buf = torch.zeros(1, n_max, dtype=torch.long, device=dev)
    mask_buf = torch.zeros(1, 1, n_max, models.max_positions, dtype=models.dtype, device=dev)
    block = torch.full((1, B), models.mask_token_id, dtype=torch.long, device=dev)
    run = ReferenceRun([], [], 0.0)
    eos = models.eos_token_ids
    while len(generated) < max_new_tokens and generated[-1] not in eos:
        start = P + len(generated) - 1
        depth = min(B - 1, max_new_tokens - len(generated) - 1, models.max_positions - 1 - start)
        times = {}
        t = _now(dev)
        tokens, parents, depths = [generated[-1]], [-1], [0]  # one token left: the bonus alone, as the engine
        if depth >= 1:
            block[0, 0] = generated[-1]
            m = context.shape[1]
            hidden = draft(position_ids=torch.arange(start - m, start + B, device=dev)[None],
                           noise_embedding=emb(block) * scale, target_hidden=context, past_key_values=dcache,
                           use_cache=True)
            logits = draft.compute_logits(hidden[:, 1:], target.lm_head)
            dcache.crop(start - dcache.get_seq_length())  # drop the block (a negative count)
            context = context[:, :0]
            logprobs = torch.log_softmax(logits[0, :depth].float(), dim=-1)
        times["draft"] = (t1 := _now(dev)) - t

        if depth >= 1:
            top = torch.topk(logprobs, min(budget, logprobs.shape[-1]), dim=-1)
            tokens, parents, depths, _, _ = heap_tree_lists(top.values.cpu().tolist(), top.indices.cpu().tolist(),
                                                            generated[-1], budget)
        n = len(tokens)
        times["tree_build"] = (t2 := _now(dev)) - t1

        ids_buf[0, :n] = torch.tensor(tokens)
        pos_buf[0, :n] = torch.tensor(depths) + start
        mask = _tree_mask(mask_buf, parents, start)
        times["tree_compile"] = (t3 := _now(dev)) - t2

        out = target(input_ids=ids_buf[:, :n], position_ids=pos_buf[:, :n], attention_mask=mask,
                     past_key_values=cache, use_cache=True, output_hidden_states=True)
        choice = out.logits[0].argmax(-1).tolist()
        times["verify"] = (t4 := _now(dev)) - t3

        path, bonus = accept_walk_python(tokens, parents, choice)
        rows = torch.tensor(path, device=dev)
        _keep_rows(cache, rows, start)
        context = torch.cat([context, extract_context_feature(out.hidden_states, layer_ids)[:, rows]], dim=1)
        _append(generated, [tokens[i] for i in path[1:]] + [bonus], max_new_tokens, eos)
        run.accept_lengths.append(len(path))
        times["accept_commit"] = _now(dev) - t4
        run.cycle_seconds.append(times)
    run.wall_time = _now(dev) - t0
    run.tokens = generated
    return run


def _tree_mask(mask_buf: Tensor, parents: list[int], start: int) -> Tensor:
    """The verify's additive mask [1, 1, n, start + n] in ``mask_buf``: the prefix and each node's ancestors."""
    n = len(parents)
    vis = torch.zeros(n, n, dtype=torch.bool)
    vis[0, 0] = True
    for i in range(1, n):  # row by row: a node sees what its parent sees, and itself
        vis[i] = vis[parents[i]]
        vis[i, i] = True
    mask = mask_buf[:, :, :n, : start + n]
    mask[..., :start] = 0
    mask[0, 0, :, start:] = torch.zeros(n, n, dtype=mask_buf.dtype).masked_fill_(~vis, float("-inf"))
    return mask


def _keep_rows(cache, rows: Tensor, start: int) -> None:
    """Keep the accepted nodes' K/V after the prefix: ``index_select`` + ``cat``, layer by layer."""
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys[:, :, :start], layer.keys.index_select(2, rows + start)], dim=2)
        layer.values = torch.cat([layer.values[:, :, :start], layer.values.index_select(2, rows + start)], dim=2)


def _append(generated: list[int], new: list[int], max_new_tokens: int, eos) -> None:
    """The accepted tokens and the bonus, up to the limit and the first end-of-sequence token."""
    for tok in new:
        if len(generated) >= max_new_tokens:
            break
        generated.append(tok)
        if tok in eos:
            break


def compare_reference(engine, prompts: list[dict], budgets=(16, 32, 64), max_new_tokens: int = 96,
                      repeats: int = 1, progress=None) -> dict:
    """The engine's DDTree(budget) against ``reference_generate`` on the same prompts, side by side.

    Interleaved prompt by prompt (engine, reference, engine, ...) after one warm-up of each, so both
    see the same machine. Per budget: whether they decoded the same tokens and accept lengths, the
    ratio of whole-generation tokens/s (engine / reference; > 1 = engine faster), the median of the
    per-prompt ratios of time per cycle, and both sides' per-stage p50/p90/max per cycle.
    """
    from tqdm.auto import tqdm

    from workbench.bench.policy_bench import run_one
    from workbench.records.cycle import percentiles
    from workbench.engine.policies import DDTree

    out = {}
    bar = tqdm(total=len(budgets) * len(prompts) * repeats, desc="reference", leave=False,
               disable=(None if progress is None else not progress))
    for budget in budgets:
        policy = DDTree(budget)
        run_one(engine, policy, prompts[0]["prompt"], 16)
        reference_generate(engine.models, prompts[0]["prompt"], budget, 16)
        same, walls, ours_cycles, ref_cycles, ratios = True, [[], []], [], [], []
        tokens = [0, 0]
        for item in prompts:
            for _ in range(repeats):
                ours = run_one(engine, policy, item["prompt"], max_new_tokens)
                ref = reference_generate(engine.models, item["prompt"], budget, max_new_tokens)
                same &= ours.tokens == ref.tokens and ours.accept_lengths == ref.accept_lengths
                walls[0].append(ours.wall_time)
                walls[1].append(ref.wall_time)
                tokens[0] += len(ours.tokens)
                tokens[1] += len(ref.tokens)
                oc = [sum(c.values()) for c in ours.cycle_seconds[1:]]
                rc = [sum(c.values()) for c in ref.cycle_seconds[1:]]
                ours_cycles += ours.cycle_seconds[1:]
                ref_cycles += ref.cycle_seconds[1:]
                if oc and rc:
                    ratios.append((sum(oc) / len(oc)) / (sum(rc) / len(rc)))
                bar.update(1)
        merged = [_merge_reference_stages(c) for c in ours_cycles]
        out[str(policy)] = {
            "same_trees": same,
            "tokens_per_s_ratio": (tokens[0] / sum(walls[0])) / (tokens[1] / sum(walls[1])),
            "cycle_time_ratio": percentiles(ratios),  # engine / reference, per prompt
            "engine": {st: percentiles([c[st] for c in merged]) for st in (*STAGES, "rest", "cycle")},
            "reference": {st: percentiles([c.get(st, 0.0) for c in ref_cycles] if st != "cycle" else
                                          [sum(c.values()) for c in ref_cycles]) for st in (*STAGES, "rest", "cycle")},
        }
    bar.close()
    return out


def _merge_reference_stages(stage_seconds: dict) -> dict:
    """An engine cycle's stage times in the reference's buckets (accept and commit together; the
    record and other bookkeeping, which the reference does not keep, as "rest")."""
    c = dict(stage_seconds)
    out = {st: c.pop(st, 0.0) for st in ("draft", "tree_build", "tree_compile", "verify")}
    out["accept_commit"] = c.pop("accept", 0.0) + c.pop("commit", 0.0)
    out["rest"] = sum(c.values())
    out["cycle"] = sum(out.values())
    return out


def reference_table(res: dict) -> str:
    """One line per budget: same trees, speed ratios, and p50 ms per stage for engine | reference."""
    cols = (*STAGES, "rest", "cycle")
    lines = [f"{'policy':<12}{'same':>6}{'tok/s x':>9}{'cycle x p50/p90/max':>22}   p50 ms engine | reference: "
             + " ".join(cols)]
    for label, r in res.items():
        ct = r["cycle_time_ratio"]
        eng = " ".join(f"{1e3 * r['engine'][c]['p50']:.2f}" for c in cols)
        ref = " ".join(f"{1e3 * r['reference'][c]['p50']:.2f}" for c in cols)
        lines.append(f"{label:<12}{'yes' if r['same_trees'] else 'NO':>6}{r['tokens_per_s_ratio']:>9.2f}"
                     f"{ct['p50']:>10.2f}/{ct['p90']:.2f}/{ct['max']:.2f}   {eng} | {ref}")
    return "\n".join(lines)
