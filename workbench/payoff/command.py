"""``python -m workbench pays-off``: the verdict from the command line (``workbench.payoff``).

Every bad input is one line on stderr and exit code 2, before any model loads where it can be (prompts too
few, a batch list or budget that cannot be used) and before any decode otherwise (a batch the memory cannot
hold, a budget the drafter's block cannot fill)."""
from __future__ import annotations

import json

PAIRS = ("dense", "hybrid")


def add_parser(sub) -> None:
    p = sub.add_parser("pays-off", help="does DDTree pay off on this pair and batch, and what decides "
                                        "(acceptance, cost per step, predicted and measured speedup)")
    p.add_argument("--target", default="dense",
                   help="dense (default) or hybrid: an embedded pair; or a target model directory with --draft")
    p.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (with a --target directory)")
    p.add_argument("--prompts", default="long",
                   help="long (default) or short: the shipped evaluation split; or a prompts file (JSON lines "
                        "with id and prompt, or one prompt per line); at least 10 prompts")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts (N >= 10)")
    p.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8)")
    p.add_argument("--policies", default=None,
                   help="comma-separated shapes, e.g. dflash,ddtree:16,spine:2 (default: AR, DFlash, the chain cut "
                        "to 4 and 8, Spine(1,2,4), DDTree(4..64); AR and DFlash are always added)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    p.add_argument("--repeats", type=int, default=1, help="timed decodes per unit and shape, medians kept (default 1)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="> 0: after the greedy tables, a second set sampled at this temperature")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: up to 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _prompts(args) -> list[dict]:
    from workbench.analysis.paired import MIN_PAIRS
    from workbench.bench.prompts import SPLITS, eval_prompts, load_prompts

    items = eval_prompts(args.prompts) if args.prompts in SPLITS else load_prompts(args.prompts)
    if args.limit is not None:
        if args.limit < MIN_PAIRS:
            raise ValueError(f"--limit {args.limit}: a paired test needs at least {MIN_PAIRS} prompts; use "
                             f"--limit {MIN_PAIRS} or more")
        items = items[: args.limit]
    return items


def run(args, out, err) -> int:
    from workbench.engine.core import load
    from workbench.bench.runs import parse_policies
    from workbench.engine import validate
    from workbench.payoff import pays_off
    from workbench.payoff.shapes import check_prompts, parse_batches

    # the cheap checks first: nothing loads before they pass
    prompts = _prompts(args)
    check_prompts(len(prompts))
    parse_batches(args.batch)
    policies = parse_policies(args.policies) if args.policies else None
    validate.temperature(args.temperature), validate.seed(args.seed), validate.threads(args.threads)
    for name, v in (("--max-new-tokens", args.max_new_tokens), ("--repeats", args.repeats)):
        if v < 1:
            raise ValueError(f"{name} {v} must be a positive integer")
    if args.target in PAIRS and args.draft:
        raise ValueError(f"--target {args.target} is an embedded pair with its own drafter: drop --draft")
    if args.target not in PAIRS and not args.draft:
        raise ValueError(f"--target {args.target!r}: use dense or hybrid, or give a target directory with --draft DIR")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    target = None if args.target == "dense" else args.target
    engine = load(target=target, draft=args.draft, device=args.device, threads=args.threads)
    temps = [0.0] + ([args.temperature] if args.temperature > 0 else [])
    results = [pays_off(engine, prompts, batch=args.batch, policies=policies, max_new_tokens=args.max_new_tokens,
                        temperature=t, seed=args.seed, repeats=args.repeats, progress=not args.quiet) for t in temps]
    if args.json:
        print(json.dumps({"greedy": results[0].to_dict(),
                          "sampled": results[1].to_dict() if len(results) > 1 else None}), file=out)
    else:
        print("\n\n".join(str(r) for r in results), file=out)
    return 0
