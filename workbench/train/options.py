"""``python -m workbench.train``'s options, and the recipe they make: every option checked (one line and exit 2
via argparse) before anything is read or trained, and the recipe's fields the options override applied."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from workbench.train.recipe import V1, HybridRecipe, Recipe, hybrid_smoke_recipe, smoke_recipe

DESCRIPTION = "Train the embedded default: a byte-level BPE, a small Qwen3 target and a DFlash drafter."
# The --stage values: 'all' runs every stage; the others run a part (workbench.train.pipeline: STAGES).
RUNS = ("all", "target", "loops", "draft", "report", "eval", "prompts")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m workbench.train", description=DESCRIPTION)
    ap.add_argument("--out", type=Path, required=True, help="directory for target/, draft/, eval_prompts.jsonl")
    ap.add_argument("--smoke", action="store_true", help="tiny models and a few steps (seconds; v2 recipe)")
    ap.add_argument("--arch", default="dense", choices=["dense", "hybrid"],
                    help="dense: a Qwen3 target (the embedded default); hybrid: a Qwen3.5-text target "
                         "(GatedDeltaNet + gated attention), e.g. --out workbench/assets/hybrid")
    ap.add_argument("--recipe", default="v2", choices=["v1", "v2"],
                    help="v2: the shipped pair (default); v1: the first shipped pair's recipe (long prompts only)")
    ap.add_argument("--loops", type=int, metavar="ROUNDS",
                    help="the target's loops phase: unlikelihood rounds after its training (default 0: off)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage", default="all", choices=list(RUNS),
                    help="'target' trains the target and runs its loops phase; 'loops' runs only that phase "
                         "on the target in --out; 'draft' and 'report' reuse the target (and tokenizer) in --out; "
                         "'eval' adds the engine's DFlash/DDTree tau to the report in --out; "
                         "'prompts' only writes the evaluation prompts (both splits)")
    ap.add_argument("--target-steps", type=int)
    ap.add_argument("--draft-steps", type=int)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--resume-draft", action="store_true", help="with --stage draft: continue the drafter in --out")
    ap.add_argument("--draft-lr", type=float)
    ap.add_argument("--draft-layers", type=int, metavar="N", help="drafter layers (default: the recipe's, 2)")
    ap.add_argument("--distill-prompts", type=int)
    ap.add_argument("--short-share", type=float, help="share of short-shape distillation prompts (0-1)")
    ap.add_argument("--checkpoint-every", type=int, help="save the target and drafter every N steps (0: only at the end)")
    ap.add_argument("--eval-prompts", type=int, metavar="N",
                    help="figures on the first N evaluation prompts of each split (default: all)")
    return ap


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, Recipe]:
    """The options and the recipe they make; a value no run can use is refused by ``ap.error``."""
    ap = parser()
    args = ap.parse_args(argv)
    if args.loops is not None and args.loops < 0:
        ap.error(f"--loops {args.loops} must be 0 or more")
    if args.short_share is not None and not 0.0 <= args.short_share <= 1.0:
        ap.error(f"--short-share {args.short_share} must be between 0 and 1")
    if args.eval_prompts is not None and args.eval_prompts < 1:
        ap.error(f"--eval-prompts {args.eval_prompts} must be 1 or more")

    hybrid = args.arch == "hybrid"
    if hybrid and args.recipe != "v2":
        ap.error(f"--recipe {args.recipe} is a dense recipe; --arch hybrid has one recipe (drop --recipe)")
    if args.stage not in ("all", "target", "prompts") and (args.out / "target" / "config.json").is_file():
        found = json.loads((args.out / "target" / "config.json").read_text()).get("model_type", "")
        if found.startswith("qwen3_5") != hybrid:
            ap.error(f"the target in {args.out / 'target'} is {found!r}: pass --arch "
                     f"{'hybrid' if found.startswith('qwen3_5') else 'dense'}")

    if hybrid:
        recipe = hybrid_smoke_recipe() if args.smoke else HybridRecipe()
    else:
        recipe = smoke_recipe() if args.smoke else Recipe(**(V1 if args.recipe == "v1" else {}))
    if args.loops is not None:
        recipe.ul_rounds = args.loops
    if args.stage == "loops" and not recipe.ul_rounds:
        ap.error("--stage loops with 0 rounds does nothing: add --loops N")
    if args.target_steps is not None:
        recipe.target_steps = args.target_steps
    if args.draft_steps is not None:
        recipe.draft_steps = args.draft_steps
    if args.draft_layers is not None and args.draft_layers < 1:
        ap.error(f"--draft-layers {args.draft_layers} must be 1 or more")
    for name in ("draft_lr", "draft_layers", "distill_prompts", "short_share", "checkpoint_every"):
        if getattr(args, name) is not None:
            setattr(recipe, name, getattr(args, name))
    return args, recipe
