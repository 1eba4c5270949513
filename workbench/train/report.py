"""The training report's figures: held-out losses, per evaluation split the taus of linear DFlash and DDTree
(the reference decoder and the engine; for the hybrid also simulated through transformers alone), the text's
shares, the engine-convention table; and the drafters a ``--stage draft`` run replaces, kept for comparison.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from workbench.train.progress import log
from workbench.train.recipe import DRAFTER_FIELDS, Recipe
from workbench.train.text_quality import (continuation_shares, held_out_loss, known_word_share, mean,
                                         spread_windows)


@torch.no_grad()
def split_figures(target, draft, engine, tokenizer, prompts, new_tokens: int, tree_budget: int, known) -> dict:
    """Linear DFlash (dflash_generate, the reference) and DDTree(budget) (the engine) on one split."""
    import dflash.model as dm

    from workbench.bench.policy_bench import run_one
    from workbench.engine.policies import DDTree

    # dflash_generate's stats path calls torch.cuda.synchronize(); on CPU a plain clock is right.
    if not torch.cuda.is_available():
        dm._cuda_time = time.perf_counter
    taus, distinct, words, accepted, cycles, tree_accepted, tree_cycles = [], [], [], 0, 0, 0, 0
    eos = tokenizer.eos_token_id
    for i, item in enumerate(prompts):
        if i % 10 == 0:
            log(f"evaluating {item.get('split', '')} prompt {i}/{len(prompts)}")
        x = tokenizer(item["prompt"], return_tensors="pt", add_special_tokens=False)["input_ids"]
        r = dm.dflash_generate(draft, target, x, new_tokens, [eos], return_stats=True)
        share, known_share = continuation_shares(r.output_ids[0, x.shape[1]:].tolist(), eos, tokenizer, known)
        distinct.append(share)
        words.append(known_share)
        if r.acceptance_lengths:  # none when the target's first token is EOS
            taus.append(sum(r.acceptance_lengths) / len(r.acceptance_lengths))
        accepted += sum(r.acceptance_lengths)
        cycles += len(r.acceptance_lengths)
        t = run_one(engine, DDTree(tree_budget), item["prompt"], new_tokens)
        tree_accepted += sum(t.accept_lengths)
        tree_cycles += len(t.accept_lengths)
    dflash_tau = accepted / cycles
    tree_tau = tree_accepted / max(1, tree_cycles)
    return {
        # Pooled = all accepted tokens / all cycles (Spec-Bench, SGLang); the per-prompt mean is
        # inflated by prompts where the target loops and every draft is accepted.
        "dflash_tau": dflash_tau,
        "dflash_tau_mean_of_prompts": sum(taus) / max(1, len(taus)),
        f"ddtree{tree_budget}_tau": tree_tau,
        f"ddtree{tree_budget}_over_dflash": tree_tau / dflash_tau,
        "distinct_token_share": mean(distinct),
        "known_word_share": mean(words),
        "prompts": len(prompts),
    }


@torch.no_grad()
def report(target, draft, tokenizer, held_ids, splits: dict, recipe: Recipe, out: Path, known,
           new_tokens: int = 64, tree_budget: int = 32) -> dict:
    """Every figure, for each split of the evaluation prompts."""
    from workbench.engine.core import load

    # Same thread count as training: wb.load's default (up to 8) thrashes a shared 2-core machine.
    engine = load(target=out / "target", draft=out / "draft", threads=torch.get_num_threads())
    spread = spread_windows(held_ids, recipe.seq_len)
    return {
        # The first 64 windows of the held-out files (in path order, mostly argparse.py), as in every earlier report.
        "held_out_loss_nats": held_out_loss(target, held_ids, recipe.seq_len),
        # 64 windows spread evenly over all held-out files.
        "held_out_loss_spread_nats": held_out_loss(target, spread, recipe.seq_len),
        # The same windows as text: what real code scores on the known-word share.
        "known_word_share_of_held_out_code": mean(known_word_share(tokenizer.decode(w), known)
                                                  for w in spread.view(-1, recipe.seq_len).tolist()),
        "new_tokens": new_tokens,
        "splits": {split: split_figures(target, draft, engine, tokenizer, items, new_tokens, tree_budget, known)
                   for split, items in splits.items()},
    }


def weights_mb(out: Path) -> float:
    return sum(f.stat().st_size for f in out.glob("*/model.safetensors")) / 1e6


@torch.no_grad()
def dense_losses_beside(tokenizer, held_ids: torch.Tensor, seq_len: int) -> dict:
    """The shipped dense target's held-out losses on the same windows, when it shares the tokenizer
    (else nats per token would not compare)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.engine.loading import DEFAULT_TARGET

    if not (DEFAULT_TARGET / "config.json").is_file():
        return {"dense_target": f"not compared: no dense target in {DEFAULT_TARGET}"}
    if AutoTokenizer.from_pretrained(DEFAULT_TARGET).get_vocab() != tokenizer.get_vocab():
        return {"dense_target": "not compared: its tokenizer differs from this pair's"}
    dense = AutoModelForCausalLM.from_pretrained(DEFAULT_TARGET).eval()
    return {"dense_held_out_loss_nats": held_out_loss(dense, held_ids, seq_len),
            "dense_held_out_loss_spread_nats": held_out_loss(dense, spread_windows(held_ids, seq_len), seq_len)}


@torch.no_grad()
def hybrid_report(target, draft, tokenizer, held_ids, splits: dict, recipe: Recipe, out: Path, known,
                  new_tokens: int = 64, tree_budget: int = 32) -> dict:
    """The hybrid pair's figures: held-out loss (beside the dense target's on the same windows); per split
    the greedy continuations' shares and the simulated greedy tau of linear DFlash and DDTree(budget)
    with the drafter's per-slot top-1 agreement (greedy_sim, transformers alone); and the same taus
    measured through the engine (``engine``), so the two can be checked against each other."""
    from workbench.train import greedy_sim

    eos = tokenizer.eos_token_id
    spread = spread_windows(held_ids, recipe.seq_len)
    metrics = {
        "arch": "hybrid",
        "target_layer_types": list(target.config.layer_types),
        "held_out_loss_nats": held_out_loss(target, held_ids, recipe.seq_len),
        "held_out_loss_spread_nats": held_out_loss(target, spread, recipe.seq_len),
        **dense_losses_beside(tokenizer, held_ids, recipe.seq_len),
        "new_tokens": new_tokens,
        "weights_mb": weights_mb(out),
        "splits": {},
    }
    for split, items in splits.items():
        log(f"simulating {split} split ({len(items)} prompts)")
        sim, continuations = greedy_sim.figures(target, draft, tokenizer, items, new_tokens, tree_budget)
        shares = [continuation_shares(c, eos, tokenizer, known) for c in continuations]
        metrics["splits"][split] = {**sim, "distinct_token_share": mean(a for a, _ in shares),
                                    "known_word_share": mean(b for _, b in shares)}
    log("measuring through the engine")
    metrics["engine"] = engine_figures(out, splits, new_tokens, tree_budget)
    return metrics


@torch.no_grad()
def engine_figures(out: Path, splits: dict, new_tokens: int, tree_budget: int = 32) -> dict:
    """Greedy DFlash and DDTree(budget) tau through the engine, pooled per split (any pair in --out)."""
    from workbench.engine.core import load
    from workbench.bench.policy_bench import run_one
    from workbench.engine.policies import DDTree, DFlash

    engine = load(target=out / "target", draft=out / "draft", threads=torch.get_num_threads())
    figures = {}
    for split, items in splits.items():
        runs = {"dflash": [], f"ddtree{tree_budget}": []}
        for i, item in enumerate(items):
            if i % 10 == 0:
                log(f"engine: {split} prompt {i}/{len(items)}")
            for name, policy in (("dflash", DFlash()), (f"ddtree{tree_budget}", DDTree(tree_budget))):
                runs[name] += run_one(engine, policy, item["prompt"], new_tokens).accept_lengths
        taus = {f"{name}_tau": sum(v) / max(1, len(v)) for name, v in runs.items()}
        figures[split] = {**taus, "prompts": len(items)}
    return figures


def convention_figures(out: Path, splits: dict) -> dict:
    """The engine-convention table for the pair in ``out`` (``workbench.adapters.conventions``) on the first
    long evaluation prompt: the feature each engine's capture rule would hand the drafter."""
    from workbench.engine.core import load
    from workbench.adapters.conventions import conventions_report

    engine = load(target=out / "target", draft=out / "draft", threads=torch.get_num_threads())
    first = next(iter(splits.values()))[0]["prompt"]
    return conventions_report(engine.models, engine.encode(first).ids)


HISTORY_KEYS = ("recipe", "previous_drafters", "previous_drafter", "loops_phase", "engine_conventions")


def previous_drafters(earlier: dict) -> list[dict]:
    """The drafters a ``--stage draft`` run replaces, newest first, for comparison: the replaced one's
    drafter-side recipe and figures, then the history its report kept (``previous_drafter``: the single
    entry older reports had)."""
    recipe = earlier.get("recipe", {})
    replaced = {**{k: recipe[k] for k in DRAFTER_FIELDS if k in recipe},
                **{k: v for k, v in earlier.items() if k not in HISTORY_KEYS}}
    legacy = [earlier["previous_drafter"]] if "previous_drafter" in earlier else []
    return [replaced, *earlier.get("previous_drafters", []), *legacy]
