"""Train the embedded default: a byte-level BPE, a small Qwen3 target and a DFlash drafter.

    python -m workbench.train --out workbench/assets            # the shipped models (~47 min, 2 cores)
    python -m workbench.train --out /tmp/smoke --smoke          # seconds, used by the tests
    python -m workbench.train --arch hybrid --out workbench/assets/hybrid   # the hybrid pair

Stages (each writes to ``--out`` and can be re-run alone with ``--stage``):
tokenizer -> target (next-token training, then the loops phase) -> distill (the target's greedy
continuations) -> draft -> report.

``--arch hybrid`` trains a Qwen3.5-architecture target instead (GatedDeltaNet linear-attention
layers between gated full-attention layers) with the same drafter layout. Its report holds both the
greedy acceptance simulated through transformers alone (``workbench.train.greedy_sim``) and the engine's
own tau; ``--stage eval`` re-measures the engine's figures for any pair.

The run is data: ``STAGES`` lists every stage in order with the ``--stage`` values it runs in, and ``main``
walks it; a stage reads what earlier ones left in the ``Run`` and leaves its own there. Each job is its own
module: ``recipe``, ``options``, ``tokenizer``, ``target``, ``loops``, ``distill``, ``drafter``,
``eval_prompts``, ``text_quality``, ``report``.
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import torch

from workbench.records.files import write_text_atomic
from workbench.train.distill import distill
from workbench.train.drafter import train_draft
from workbench.train.eval_prompts import first_prompts, read_eval_prompts, write_eval_prompts
from workbench.train.loops import train_fewer_loops
from workbench.train.options import RUNS, parse
from workbench.train.progress import log
from workbench.train.recipe import DRAFTER_FIELDS, Recipe, is_hybrid
from workbench.train.report import convention_figures, engine_figures, hybrid_report, previous_drafters, report
from workbench.train.target import train_target
from workbench.train.text_quality import corpus_words, target_figures
from workbench.train.tokenizer import encode_files, load_corpus, train_tokenizer


@dataclass
class Run:
    """What the stages share: the options, the recipe, and what the stages before made or loaded."""

    args: argparse.Namespace
    recipe: Recipe
    files: tuple = ()  # train, held-out, train test, held-out test files (load_corpus)
    tokenizer: object = None
    train_ids: torch.Tensor | None = None  # only the stages that train the target read them
    held_ids: torch.Tensor | None = None
    target: object = None
    draft: object = None
    prompts: dict = field(default_factory=dict)  # split -> evaluation prompts (the first --eval-prompts)

    @property
    def out(self) -> Path:
        return self.args.out

    @cached_property
    def known(self) -> frozenset[str]:
        """The words the target could have learned (the known-word share reads them), made once when needed."""
        return corpus_words(self.files[0])


def write_json(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")  # a cut-short run never leaves half a report


# ---------------------------------------------------------------- the stages, in the order they run
def read_corpus(run: Run) -> None:
    run.files = load_corpus(run.recipe)
    train, held, train_tests, held_tests = run.files
    log(f"corpus: {len(train)} train files, {len(held)} held-out files "
        f"(+{len(train_tests)}/{len(held_tests)} test files, prompts only)")


def add_engine_figures(run: Run) -> None:
    """--stage eval: the engine's figures, added to the report already in --out."""
    path = run.out / "training_report.json"
    metrics = json.loads(path.read_text()) if path.exists() else {}
    metrics["engine"] = engine_figures(run.out, first_prompts(read_eval_prompts(run.out), run.args.eval_prompts),
                                       run.recipe.eval_new_tokens)
    metrics["engine_conventions"] = convention_figures(run.out, read_eval_prompts(run.out))
    write_json(path, metrics)
    print(json.dumps(metrics["engine"]))


def make_target(run: Run) -> None:
    """A new tokenizer and target (the drafter reads the target's layers, so both are made together)."""
    train, held = run.files[:2]
    run.tokenizer = train_tokenizer(train, run.recipe, run.out)
    run.train_ids, run.held_ids = encode_files(run.tokenizer, train), encode_files(run.tokenizer, held)
    run.target = train_target(run.recipe, run.tokenizer, run.train_ids, run.held_ids, run.out, run.args.seed)


def load_target(run: Run) -> None:
    """The tokenizer and target already in --out (a later stage rerun on its own)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train, held = run.files[:2]
    run.tokenizer = AutoTokenizer.from_pretrained(run.out / "target")
    run.held_ids = encode_files(run.tokenizer, held)
    run.target = AutoModelForCausalLM.from_pretrained(run.out / "target").eval()
    run.train_ids = encode_files(run.tokenizer, train) if run.args.stage == "loops" else None


def make_eval_prompts(run: Run) -> None:
    _, held, _, held_tests = run.files
    run.prompts = first_prompts(write_eval_prompts(held, held_tests, run.recipe, run.out, run.args.seed),
                                run.args.eval_prompts)


def reuse_eval_prompts(run: Run) -> None:
    """Later stages evaluate on the prompts the first stage wrote, whatever their seed."""
    run.prompts = first_prompts(read_eval_prompts(run.out), run.args.eval_prompts)


def loops_phase(run: Run) -> None:
    """The target's loops phase and its before/after figures; without it (0 rounds) a new target keeps no
    stale before/after (``--stage loops`` with 0 rounds is refused by the options)."""
    if not run.recipe.ul_rounds:
        (run.out / "loops_phase.json").unlink(missing_ok=True)
        return
    train, _, train_tests, _ = run.files

    def figures() -> dict:
        return target_figures(run.target, run.tokenizer, run.held_ids, run.prompts, run.recipe, run.known)

    before = figures()
    run.target = train_fewer_loops(run.recipe, run.target, run.tokenizer, run.train_ids, train, train_tests,
                                   run.args.seed)
    run.target.save_pretrained(run.out / "target")
    phase = {"before": before, "after": figures()}
    log(f"loops phase: {json.dumps(phase)}")
    write_json(run.out / "loops_phase.json", phase)


def make_drafter(run: Run) -> None:
    """Distil the target's continuations, train the drafter on them, then drop the distilled file."""
    train, _, train_tests, _ = run.files
    seqs = distill(run.recipe, run.target, run.tokenizer, train, train_tests, run.out, run.args.seed)
    run.draft = train_draft(run.recipe, run.target, run.tokenizer, seqs, run.out, run.args.seed,
                            resume=run.args.resume_draft)
    (run.out / "distill.pt").unlink(missing_ok=True)


def load_drafter(run: Run) -> None:
    from dflash.model import DFlashDraftModel

    run.draft = DFlashDraftModel.from_pretrained(run.out / "draft").eval()


def with_history(metrics: dict, earlier: dict, run: Run) -> None:
    """A report rerun (--stage report / draft) keeps the recipe that trained the target; a new drafter's side
    of the recipe is this run's, and the drafters it replaces are kept for comparison."""
    metrics.update({k: v for k, v in earlier.items() if k in ("recipe", "draft_phase2", "draft_finetune")})
    if run.args.stage == "draft":
        metrics["previous_drafters"] = previous_drafters(earlier)
        metrics["recipe"] = dict(metrics.get("recipe", {}))
        metrics["recipe"].update({k: v for k, v in asdict(run.recipe).items() if k in DRAFTER_FIELDS})
        metrics["draft_finetune"] = {
            "resume_draft": run.args.resume_draft, "seed": run.args.seed,
            **{k: getattr(run.recipe, k) for k in ("draft_layers", "draft_steps", "draft_lr", "distill_prompts",
                                                   "short_share")},
            "note": "drafter (re)trained on the target above with --stage draft",
        }


def write_report(run: Run) -> None:
    make = hybrid_report if is_hybrid(run.recipe) else report
    metrics = make(run.target, run.draft, run.tokenizer, run.held_ids, run.prompts, run.recipe, run.out, run.known,
                   new_tokens=run.recipe.eval_new_tokens)
    metrics["engine_conventions"] = convention_figures(run.out, run.prompts)
    if (run.out / "loops_phase.json").exists():  # what the target's loops phase did, written by that stage
        metrics["loops_phase"] = json.loads((run.out / "loops_phase.json").read_text())
    path = run.out / "training_report.json"
    if run.args.stage in ("report", "draft") and path.exists():
        with_history(metrics, json.loads(path.read_text()), run)
    else:
        metrics["recipe"] = asdict(run.recipe)
    write_json(path, metrics)
    log(f"report: {json.dumps({k: v for k, v in metrics.items() if k != 'recipe'})}")
    print(json.dumps({k: v for k, v in metrics.items() if k != "recipe"}))


@dataclass(frozen=True)
class Stage:
    name: str
    runs_in: tuple[str, ...]  # the --stage values that run it
    step: Callable[[Run], None]


STAGES = (
    Stage("corpus", RUNS, read_corpus),
    Stage("engine figures", ("eval",), add_engine_figures),
    Stage("tokenizer and target", ("all", "target"), make_target),
    Stage("the target in --out", ("loops", "draft", "report"), load_target),
    Stage("evaluation prompts", ("all", "target", "prompts"), make_eval_prompts),
    Stage("the evaluation prompts in --out", ("loops", "draft", "report"), reuse_eval_prompts),
    Stage("loops phase", ("all", "target", "loops"), loops_phase),
    Stage("distillation and drafter", ("all", "draft"), make_drafter),
    Stage("the drafter in --out", ("report",), load_drafter),
    Stage("report", ("all", "draft", "report"), write_report),
)


def main(argv: list[str] | None = None) -> int:
    args, recipe = parse(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    run = Run(args, recipe)
    for stage in STAGES:
        if args.stage in stage.runs_in:
            stage.step(run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
