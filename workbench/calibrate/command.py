"""The calibration command: decode calibration prompts on a pair, fit, choose, write one JSON file.

    python -m workbench.calibrate --target dense --out workbench/assets/calibration.json --replace
    python -m workbench.calibrate --target hybrid --out workbench/assets/hybrid/calibration.json --replace
    python -m workbench.calibrate --target /models/t --draft /models/d --costs payoff.json --out my.json

Bad input is one line on stderr and exit code 2, before any model loads where it can be (a count that is not
positive or cannot give the cycles the estimate needs, a flag that does not apply to the target, a path that
does not exist, an --out that cannot be written or exists without --replace, a cost source or head that cannot
be read) and before anything is written otherwise (too few hits per path state). The file is written
atomically. ``add_parser`` and
``run`` let ``python -m workbench calibrate`` offer the same command.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

PAIRS = ("dense", "hybrid")
HELP = "a calibration file for the calibrated tree policies (path, costed, cut) on one pair"


def add_arguments(p) -> None:
    p.add_argument("--target", default="dense",
                   help="dense (default) or hybrid: an embedded pair; or a target model directory with --draft")
    p.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (with a --target directory)")
    p.add_argument("--out", required=True, metavar="FILE", help="where to write the calibration (JSON)")
    p.add_argument("--replace", action="store_true", help="write over an existing --out file (refused otherwise)")
    p.add_argument("--prompts", type=int, default=120, help="calibration prompts to decode (default 120)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    p.add_argument("--width", type=int, default=16, help="drafter candidates recorded per slot (default 16)")
    p.add_argument("--costs", default=None, metavar="FILE",
                   help="the pair's step cost: a pays-off --json result or a cost table (default: the shipped "
                        "table for an embedded pair; none for another pair: CostTree and the chosen CutTree "
                        "thresholds then need one)")
    p.add_argument("--head", default=None, metavar="FILE",
                   help="the previous-token-conditioned head to choose beta for (python -m workbench.train.pair_head; "
                        "default: the shipped workbench/assets/pair_head.npz when its tokenizer is the pair's; 'none': "
                        "no head, PairTree and PairChain then refuse the file)")
    p.add_argument("--seed", type=int, default=0, help="which calibration prompts (default 0)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def add_parser(sub) -> None:
    """The ``calibrate`` subcommand of ``python -m workbench``."""
    add_arguments(sub.add_parser("calibrate", help=HELP))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench.calibrate", description=HELP)
    add_arguments(p)
    return p


def check_args(args) -> None:
    """Everything that can be refused before a model loads (ValueError, one line naming the flag and value)."""
    from workbench.engine.policies.calibration import MIN_CYCLES
    from workbench.records.files import output_path

    for name in ("prompts", "max_new_tokens", "width"):
        v = getattr(args, name)
        if v < 1:
            raise ValueError(f"--{name.replace('_', '-')} {v}: must be 1 or more")
    if args.max_new_tokens < 8:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: a calibration needs cycles, give 8 or more")
    most = args.prompts * (args.max_new_tokens - 1)  # a cycle adds a token at least; the prefill gives the first
    if most < MIN_CYCLES:
        raise ValueError(f"--prompts {args.prompts} x --max-new-tokens {args.max_new_tokens} give at most {most} "
                         f"drafted cycles; the estimate needs at least {MIN_CYCLES}: give more --prompts or "
                         "--max-new-tokens")
    check_pair_args(args)
    out = output_path(args.out, "--out")
    if out.exists() and not args.replace:
        raise ValueError(f"--out {out} exists; give --replace to write over it, or another path")


def check_pair_args(args) -> None:
    """--target and --draft: an embedded pair alone, or two model directories that exist."""
    if args.target in PAIRS:
        if args.draft is not None:
            raise ValueError(f"--draft {args.draft}: --target {args.target} is an embedded pair with its own drafter; "
                             "drop --draft, or give --target DIR with it")
        return
    if not Path(args.target).is_dir():
        raise ValueError(f"--target {args.target}: neither {' nor '.join(PAIRS)} (an embedded pair) nor a model "
                         "directory")
    if not args.draft:
        raise ValueError(f"--target {args.target}: a model directory needs --draft DIR (or use {' or '.join(PAIRS)})")
    if not Path(args.draft).is_dir():
        raise ValueError(f"--draft {args.draft}: not a directory (the DFlash drafter's model folder)")


def compact_json(d: dict) -> str:
    """Indented JSON with every list of numbers on one line (a calibration stays a small, readable file)."""
    text = json.dumps(d, indent=1)
    return re.sub(r"\[\s*([-0-9.eE+,\s]+?)\s*\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]",
                  text) + "\n"


def command_line() -> str:
    """How this run was started, for the file (``python -m workbench calibrate`` or ``python -m workbench.calibrate``)."""
    argv = sys.argv[1:]
    if argv[:1] == ["calibrate"]:
        return "python -m workbench " + " ".join(argv)
    return "python -m workbench.calibrate " + " ".join(argv)


class Refused(Exception):
    """A one-line refusal of the run: ``calibrate: <why>`` on stderr and exit code 2."""


def run(args, out, err) -> int:
    try:
        return make_calibration(args, out, err)
    except Refused as e:
        print(f"calibrate: {e}", file=err)
        return 2


def make_calibration(args, out, err) -> int:
    """Read the inputs, decode, fit and choose, write the file and say what it holds."""
    from workbench.calibrate.choose import choose_thresholds
    from workbench.calibrate.collect import collect
    from workbench.engine.policies.calibration import FORMAT, VERSION
    from workbench.records.files import write_text_atomic

    t0 = time.perf_counter()
    cost, items, kept_apart, head_path, head = read_inputs(args)
    engine, pair, head = load_pair(args, head)

    def progress(i, n):
        if not args.quiet:
            print(f"\rcalibrate: decoded {i}/{n} prompts", end="" if i < n else "\n", file=err, flush=True)

    cycles = collect(engine, [it["prompt"] for it in items], args.max_new_tokens, args.width, progress)
    model, figures = fit_enough(args, cycles)
    thresholds, replay = choose_thresholds(cycles, model, cost) if cost is not None else ({}, None)
    pair_head = head_figures(args, cycles, head, head_path) if head is not None else None
    doc = {
        "format": FORMAT, "version": VERSION, "pair": pair,
        "made": made(args, engine, items, kept_apart, cycles),
        "acceptance": {**model.to_dict(), "width": args.width, **figures},
        "cost": cost.to_dict() if cost is not None else None,
        "thresholds": thresholds,
        "pair_head": pair_head,
        "replay": replay,
    }
    doc["made"]["seconds"] = round(time.perf_counter() - t0, 1)
    write_text_atomic(args.out, compact_json(doc))  # a temporary file beside it, then renamed over it
    print_summary(doc, len(items), cycles, out, args.out)
    return 0


def read_inputs(args) -> tuple:
    """(cost table or None, prompt items, what was kept apart, head path or None, head or None): everything
    read before a model loads; a bad one is refused in one line."""
    from workbench.calibrate.costs import CostInputError, read_costs
    from workbench.calibrate.prompts import calibration_prompts
    from workbench.engine.policies.calibration import ASSETS
    from workbench.engine.policies.pair_head import load_head

    try:
        check_args(args)
        source = args.costs or (args.target if args.target in PAIRS else None)
        cost = read_costs(source) if source else None
        head_path = None if args.head == "none" else Path(args.head or ASSETS / "pair_head.npz")
        head = load_head(head_path) if head_path is not None and (args.head or head_path.is_file()) else None
        items, kept_apart = calibration_prompts(args.prompts, args.seed)
    except (ValueError, CostInputError) as e:
        raise Refused(str(e)) from None
    return cost, items, kept_apart, head_path, head


def load_pair(args, head) -> tuple:
    """(the engine, its pair's identity, the head or None): the head checked against the pair; one asked for
    that does not fit is refused, the shipped one for another tokenizer left out (the summary says so)."""
    from workbench.engine.core import load
    from workbench.engine.policies.pair_head import PairHeadError
    from workbench.models.identity import pair_identity

    target, draft = (None, None) if args.target == "dense" else ((args.target, None) if args.target in PAIRS
                                                                 else (args.target, args.draft))
    engine = load(target, draft, device=args.device, threads=args.threads)
    pair = pair_identity(engine.models)
    if head is not None:
        try:
            head.check_pair(pair)
        except PairHeadError as e:
            if args.head:
                raise Refused(str(e)) from None
            head = None
    return engine, pair, head


def fit_enough(args, cycles) -> tuple:
    """(acceptance model, its figures), refused when the decodes gave too few cycles or hits per path state."""
    from workbench.calibrate.fit import fit
    from workbench.engine.policies.calibration import MIN_CYCLES, MIN_HITS

    C = cycles.topv.shape[0]
    if C < MIN_CYCLES:
        raise Refused(f"{args.prompts} prompts gave {C} drafted cycles; the estimate needs at least {MIN_CYCLES}: "
                      f"give more --prompts or --max-new-tokens")
    model, figures = fit(cycles)
    thin = [s for s, h in figures["hits"].items() if h < MIN_HITS]
    if thin:
        raise Refused(f"the target took a candidate in the {', '.join(thin)} state only "
                      f"{', '.join(str(figures['hits'][s]) for s in thin)} time(s); the estimate needs {MIN_HITS}: "
                      "give more --prompts")
    return model, figures


def head_figures(args, cycles, head, head_path: Path) -> dict:
    """The pair head's entry: its file (relative to the calibration's folder) and hash, the beta chosen and
    the figures that chose it."""
    from workbench.calibrate.choose import choose_beta
    from workbench.engine.policies.calibration import file_sha256

    beta, pair_figures = choose_beta(cycles, head)
    return {"file": os.path.relpath(head_path.resolve(), Path(args.out).resolve().parent),
            "sha256": file_sha256(head_path), "beta": beta, "head_made": head.meta.get("made"), **pair_figures}


def made(args, engine, items: list[dict], kept_apart: dict, cycles) -> dict:
    """How the file was made: date, command, the decodes and prompts, the cycles (``seconds`` set last)."""
    from workbench.calibrate.collect import POLICIES

    texts = "\n\0".join(it["prompt"] for it in items)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "command": command_line(),
        "python": platform.python_version(), "device": str(engine.device),
        "decodes": {"policies": [str(p) for p in POLICIES], "greedy": True, "max_new_tokens": args.max_new_tokens,
                    "recorded_candidates_per_slot": args.width},
        "prompts": {"count": len(items), "sha256": hashlib.sha256(texts.encode()).hexdigest(), **kept_apart,
                    "items": [{k: it[k] for k in ("id", "kind", "source")} for it in items]},
        "cycles": int(cycles.topv.shape[0]), "tokens": int(cycles.tokens), "decode_seconds": round(cycles.seconds, 1),
        "seconds": None,
    }


def print_summary(doc: dict, n_items: int, cycles, out, path) -> None:
    """What the file holds, on stdout: the cycles, hits per state and held-out log-loss, the pair head's gain,
    the thresholds (or why there are none)."""
    from workbench.calibrate.choose import summary

    figures = doc["acceptance"]
    h = figures["held_out"]
    print(f"calibrate: {cycles.topv.shape[0]} cycles from {n_items} prompts ({cycles.tokens} tokens) in "
          f"{doc['made']['seconds']} s -> {path}", file=out)
    print("calibrate: hits per state " + ", ".join(f"{s} {figures['hits'][s]}/{figures['slots'][s]}" for s in figures["hits"])
          + "; held-out log-loss model vs drafter marginal: "
          + ", ".join(f"{s} {v['log_loss_model']:.4f} vs {v['log_loss_drafter_marginal']:.4f}" for s, v in h.items()),
          file=out)
    pair_head = doc["pair_head"]
    if pair_head is not None:
        w, b = pair_head["top1_without_head"], pair_head["top1_with_head"]
        t0_, tb = pair_head["by_beta"]["0.0"], pair_head["by_beta"][str(pair_head["beta"])]
        print(f"calibrate: pair head beta {pair_head['beta']}: next-token top-1 " + ", ".join(
            f"{s} {w[s]['top1']:.3f} -> {b[s]['top1']:.3f}" for s in w if w[s]["top1"] is not None)
            + f"; replayed tau PairTree(16) {t0_['PairTree(16) tau']:.2f} -> {tb['PairTree(16) tau']:.2f}, PairChain(8) "
            f"{t0_['PairChain(8) tau']:.2f} -> {tb['PairChain(8) tau']:.2f}", file=out)
    else:
        print("calibrate: no pair head (--head): PairTree and PairChain refuse this file", file=out)
    if doc["replay"] is not None:
        print(summary(doc["replay"]), file=out)
        print("calibrate: thresholds " + json.dumps(doc["thresholds"]), file=out)
    else:
        print("calibrate: no cost table (--costs): CostTree refuses this file and CutTree needs a threshold", file=out)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run(args, sys.stdout, sys.stderr)
