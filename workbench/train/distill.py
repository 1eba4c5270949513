"""Distillation data: training prompts in the shapes people type, the target's greedy continuations of them
(batched by length, no padding), and those sequences grouped by length; the drafter trains on them.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from workbench.train import corpus
from workbench.train.progress import log
from workbench.train.recipe import Recipe


def make_prompts(files, test_files, rng: random.Random, n: int, short_share: float) -> list[tuple[str, bool]]:
    """-> [(prompt, is_short)]: ``short_share`` in the short shapes people type (corpus.SHORT_SHAPES,
    test openings from ``test_files``), the rest long: half def/class openings, half mid-file stops."""
    prompts: list[tuple[str, bool]] = []
    files = list(files)
    for _ in range(50 * n):
        if len(prompts) >= n or not files:
            break
        if short_share and rng.random() < short_share:  # no draw at 0: the long-only prompts, draw for draw
            shape = rng.choice(corpus.SHORT_SHAPES)
            src = test_files if shape == "test_opening" and test_files else files
            prompts += [(p, True) for p in corpus.short_prompts(rng.choice(src).text, rng, 1, shape)]
        else:
            f = rng.choice(files)
            make = corpus.opening_prompts if rng.random() < 0.5 else corpus.midfile_prompts
            prompts += [(p, False) for p in make(f.text, rng, 1)]
    return prompts[:n]


@torch.no_grad()
def greedy_continue(model, prompt_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of a batch of equal-length prompts. -> [bs, new_tokens]"""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1)
    toks = [nxt]
    for _ in range(new_tokens - 1):
        out = model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1)
        toks.append(nxt)
    return torch.stack(toks, dim=1)


def encode_prompts(tokenizer, prompts: list[tuple[str, bool]], max_tokens: int) -> list[list[int]]:
    """Token ids of (prompt, is_short) pairs: long prompts keep their last ``max_tokens`` tokens;
    short ones are kept whole (they are the point). Too-short prompts are dropped."""
    encoded = [(tokenizer(t, add_special_tokens=False)["input_ids"], short) for t, short in prompts]
    return [e[-max_tokens:] for e, short in encoded if len(e) >= (4 if short else max_tokens // 2)]


def continue_prompts(model, encoded: list[list[int]], new_tokens: int, what: str, bs: int = 64) -> list:
    """The model's greedy continuations. -> [(prompt + continuation ids, prompt length)]

    Equal lengths per batch without padding: prompts are grouped by length and cut to the
    group's shortest.
    """
    encoded = sorted(encoded, key=len)
    seqs = []
    t0 = time.time()
    for i in range(0, len(encoded), bs):
        group = encoded[i : i + bs]
        m = min(len(e) for e in group)
        x = torch.tensor([e[-m:] for e in group])
        full = torch.cat([x, greedy_continue(model, x, new_tokens)], dim=1)
        seqs += [(row.tolist(), m) for row in full]
        if i // bs % 8 == 0:
            log(f"{what} {i + len(group)}/{len(encoded)} ({time.time() - t0:.0f}s)")
    return seqs


def distill(recipe: Recipe, model, tokenizer, train_files, train_tests, out: Path, seed: int) -> list:
    """The target's greedy continuations of training prompts. -> [(token ids, prompt length)]"""
    rng = random.Random(seed + 1)
    prompts = make_prompts(train_files, train_tests, rng, recipe.distill_prompts, recipe.short_share)
    encoded = encode_prompts(tokenizer, prompts, recipe.distill_prompt_tokens)
    seqs = continue_prompts(model, encoded, recipe.distill_new_tokens, "distill")
    torch.save(seqs, out / "distill.pt")
    return seqs


def length_buckets(seqs) -> list[list[int]]:
    """Indices of sequences grouped by length (distillation makes equal-length groups)."""
    by_len: dict[int, list[int]] = {}
    for i, (ids, _) in enumerate(seqs):
        by_len.setdefault(len(ids), []).append(i)
    return list(by_len.values())
