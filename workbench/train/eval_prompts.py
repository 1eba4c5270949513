"""The held-out evaluation prompts in two splits (long excerpts, short openings), written beside the pair and
read back by later stages, so every stage evaluates on the prompts the first one wrote.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from workbench.records.files import write_text_atomic
from workbench.train import corpus
from workbench.train.recipe import Recipe


SPLITS = ("long", "short")


def eval_prompts_path(out: Path, split: str) -> Path:
    return out / ("eval_prompts.jsonl" if split == "long" else f"eval_prompts_{split}.jsonl")


def long_eval_prompts(held_files, recipe: Recipe, seed: int) -> list[dict]:
    """Long split: ~10-line excerpts of held-out files (def/class openings and mid-file stops)."""
    rng = random.Random(seed + 4)
    items = []
    files = sorted(held_files, key=lambda f: f.relpath)
    i = 0
    while len(items) < recipe.eval_prompts and i < 50 * recipe.eval_prompts:
        f = files[i % len(files)]
        kind = "opening" if i % 2 == 0 else "midfile"
        got = (corpus.opening_prompts if kind == "opening" else corpus.midfile_prompts)(f.text, rng, 1)
        if got and len(got[0]) <= 600:
            items.append({"id": f"eval-{len(items):03d}", "kind": kind, "source": f.relpath, "prompt": got[0]})
        i += 1
    return items


def short_eval_prompts(held_files, held_tests, recipe: Recipe, seed: int) -> list[dict]:
    """Short split: 1-7 lines in each of corpus.SHORT_SHAPES, in turn, from held-out files only.

    Files are visited round-robin (sorted by path) so no one file dominates a shape.
    """
    rng = random.Random(seed + 5)
    files = sorted(held_files, key=lambda f: f.relpath)
    tests = sorted(held_tests, key=lambda f: f.relpath) or files
    items, seen = [], set()
    cursor = {shape: 0 for shape in corpus.SHORT_SHAPES}
    stalled = 0
    while len(items) < recipe.eval_short_prompts and stalled < len(corpus.SHORT_SHAPES):
        stalled = 0
        for shape in corpus.SHORT_SHAPES:
            if len(items) >= recipe.eval_short_prompts:
                break
            src = tests if shape == "test_opening" else files
            for _ in range(len(src)):  # next file (round-robin) that has this shape
                f = src[cursor[shape] % len(src)]
                cursor[shape] += 1
                got = [p for p in corpus.short_prompts(f.text, rng, 4, shape) if p not in seen]
                if got:
                    seen.add(got[0])
                    items.append({"id": f"short-{len(items):03d}", "split": "short", "kind": shape,
                                  "source": f.relpath, "prompt": got[0]})
                    break
            else:
                stalled += 1
    return items


def write_eval_prompts(held_files, held_tests, recipe: Recipe, out: Path, seed: int) -> dict[str, list[dict]]:
    splits = {"long": [{**it, "split": "long"} for it in long_eval_prompts(held_files, recipe, seed)],
              "short": short_eval_prompts(held_files, held_tests, recipe, seed)}
    for split, items in splits.items():
        write_text_atomic(eval_prompts_path(out, split), "".join(json.dumps(it) + "\n" for it in items))
    return splits


def first_prompts(splits: dict[str, list[dict]], n: int | None) -> dict[str, list[dict]]:
    """The first ``n`` prompts of each split (None: all)."""
    return splits if n is None else {split: items[:n] for split, items in splits.items()}


def read_eval_prompts(out: Path) -> dict[str, list[dict]]:
    return {split: [json.loads(line) for line in eval_prompts_path(out, split).read_text().splitlines()]
            for split in SPLITS}
