"""Calibration prompts: training-corpus text, kept apart from every evaluation prompt.

The evaluation prompts (``workbench.shipped.eval_prompts``, both splits, both pairs) come from files the
pairs never trained on (``workbench.train.corpus.is_held_out``). Calibration prompts are cut the same ways
(def/class openings and mid-file stops for long prompts, the short shapes people type) but only from the
*training* files, never a held-out one, never a file an evaluation prompt was cut from, and never a text equal
to, inside, or holding an evaluation prompt; ``calibration_prompts`` checks all three and says so in what it
returns, so the calibration file can record it. They are like what the drafters were distilled on, so a
calibration may be a little optimistic about acceptance on unseen text; the policies' speed is measured on
the evaluation prompts (``pays-off``), which none of them saw.
"""
from __future__ import annotations

import random

from workbench.shipped import SPLITS, eval_prompts
from workbench.train import corpus

MAX_CHARS = 600  # as the long evaluation split caps its prompts
SHORT_SHARE = 0.5  # the evaluation prompts are half long, half short


def evaluation_texts() -> tuple[set[str], set[str]]:
    """(prompt texts, source files) of every shipped evaluation prompt (the embedded pairs share one set)."""
    items = [it for split in SPLITS for it in eval_prompts(split)]
    return {it["prompt"] for it in items}, {it.get("source", "") for it in items}


def overlaps(text: str, held: set[str]) -> bool:
    """``text`` equals, lies inside, or holds an evaluation prompt."""
    return any(text == h or text in h or h in text for h in held)


def calibration_prompts(n: int, seed: int = 0) -> tuple[list[dict], dict]:
    """``n`` prompts [{id, kind, source, prompt}] from training files, and how they were kept apart."""
    held_texts, held_sources = evaluation_texts()
    files = [f for f in corpus.thin_generated_tables(corpus.list_sources(), 10)
             if not f.held_out and f.relpath not in held_sources]
    tests = [f for f in corpus.list_sources(tests=True) if not f.held_out and f.relpath not in held_sources]
    if not files:
        raise ValueError("no training files of the Python standard library were found to cut calibration prompts "
                         "from (workbench.train.corpus.list_sources)")
    rng = random.Random(1000 + seed)  # its own stream: the drafters' distillation prompts used other seeds
    items, seen, rejected = [], set(), 0
    for _ in range(200 * n):
        if len(items) >= n:
            break
        if rng.random() < SHORT_SHARE:
            kind = rng.choice(corpus.SHORT_SHAPES)
            f = rng.choice(tests if kind == "test_opening" and tests else files)
            got = corpus.short_prompts(f.text, rng, 1, kind)
        else:
            kind = rng.choice(("opening", "midfile"))
            f = rng.choice(files)
            got = (corpus.opening_prompts if kind == "opening" else corpus.midfile_prompts)(f.text, rng, 1)
        if not got or len(got[0]) > MAX_CHARS or not got[0].strip() or got[0] in seen:
            continue
        if overlaps(got[0], held_texts):
            rejected += 1
            continue
        seen.add(got[0])
        items.append({"id": f"calib-{len(items):03d}", "kind": kind, "source": f.relpath, "prompt": got[0]})
    if len(items) < n:
        raise ValueError(f"only {len(items)} calibration prompts could be cut from the training files; ask for fewer")
    kept_apart = {
        "from": "training files of this interpreter's standard library (workbench.train.corpus: not held out)",
        "never": "a held-out file, a file any evaluation prompt was cut from, or a text equal to, inside or holding "
                 "an evaluation prompt (workbench.shipped.eval_prompts, long and short)",
        "evaluation_prompts_checked": len(held_texts), "rejected_for_overlap": rejected, "seed": seed,
        "kinds": {k: sum(it["kind"] == k for it in items) for k in sorted({it["kind"] for it in items})},
    }
    return items, kept_apart
