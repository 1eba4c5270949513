"""``python -m workbench pays-off``: the verdict from the command line (``workbench.payoff``).

Every bad input is one line on stderr and exit code 2, before any model loads where it can be (too few
distinct prompts, a --limit past them, a .txt file of JSON lines, a batch list, policy list or token count
that cannot be used: ``workbench.payoff.inputs.check_inputs``) and before any decode otherwise (a batch the
memory cannot hold, a budget the drafter's block cannot fill, a calibrated policy named whose calibration was
made on another pair: ``fit_to_engine``)."""
from __future__ import annotations

import json

PAIRS = ("dense", "hybrid")


def add_parser(sub) -> None:
    from workbench.interface.registry import engine_names
    from workbench.payoff.inputs import MEASURED_NEW_TOKENS

    p = sub.add_parser("pays-off", help="does DDTree pay off on this pair and batch (at B > 1 in a static and a "
                                        "refilled batch), what decides (acceptance, cost per step, predicted and "
                                        "measured speedup), the fastest policy (AR included), and each calibrated "
                                        "policy against the best DDTree budget")
    p.add_argument("--engine", choices=engine_names(), default="workbench",
                   help="the engine that decodes: workbench (default) or one built on it, by its registry name "
                        "(an installed package's engines too)")
    p.add_argument("--target", default="dense",
                   help="dense (default) or hybrid: an embedded pair; or a target model directory with --draft")
    p.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (with a --target directory)")
    p.add_argument("--prompts", default="long",
                   help="long (default) or short: the shipped evaluation split; or a prompts file (JSON lines "
                        "with id and prompt, or one prompt per line); at least 10 prompts")
    p.add_argument("--limit", type=int, default=None,
                   help="use only the first N prompts (N >= 10, at most the prompts there are)")
    p.add_argument("--batch", default="1,8",
                   help="comma-separated batch sizes, each at most the number of distinct prompts (default 1,8); "
                        "at B > 1 a static batch (windows of B prompts) and a refilled one (B slots served from "
                        "the prompt queue, as serving engines batch), whose verdict is that batch size's")
    p.add_argument("--policies", default=None,
                   help="comma-separated shapes in any spelling the policy registry takes, e.g. "
                        "dflash,ddtree:16,ddtree:8:2,spine:2,eagle:4:5:16,path:32,'DDTree(16, width=1)' (default: "
                        "AR, DFlash, the chain cut to 4 and 8, Spine(1,2,4), DDTree(4..64) and one size of each "
                        "calibrated policy per batch size (path, costed, cut, pairtree, condtree: the size with the "
                        "most replayed tokens per predicted ms on calibration prompts, never the measured ones; "
                        "pairchain:8, condchain:8), to keep the run's cost down (other sizes: name them here); a "
                        "calibrated policy runs only on a pair its calibration (condtree, condchain: its learned "
                        "head) was made on: left out of the default set otherwise, with a note, refused when named; "
                        "AR and DFlash are always added)")
    p.add_argument("--max-new-tokens", type=int, default=MEASURED_NEW_TOKENS,
                   help=f"new tokens per prompt, >= 3 (default {MEASURED_NEW_TOKENS})")
    p.add_argument("--repeats", type=int, default=1, help="timed decodes per unit and shape, medians kept (default 1)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="> 0: after the greedy tables, a second set sampled at this temperature")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: up to 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def read_prompts(args) -> list[dict]:
    """The split or the file (a .txt file of JSON lines is refused by ``load_prompts``), cut to --limit; a
    --limit past the prompts there are is refused."""
    from workbench.analysis.paired import MIN_PAIRS
    from workbench.shipped import SPLITS, eval_prompts, load_prompts
    from workbench.payoff.inputs import PaysOffInputError

    if args.prompts in SPLITS:
        items, source = eval_prompts(args.prompts), f"the {args.prompts} split"
    else:
        items, source = load_prompts(args.prompts), f"'{args.prompts}'"
    if args.limit is not None:
        if args.limit < MIN_PAIRS:
            raise PaysOffInputError(f"--limit {args.limit}: a paired test needs at least {MIN_PAIRS} prompts; use "
                                    f"--limit {MIN_PAIRS} or more")
        if args.limit > len(items):
            raise PaysOffInputError(f"--limit {args.limit} but {source} holds {len(items)} prompts: use --limit "
                                    f"{len(items)} or less (or leave --limit out for all {len(items)})")
        items = items[: args.limit]
    return items


def run(args, out, err) -> int:
    from workbench.engine import validate
    from workbench.cli_args.engine_options import require_own_engine
    from workbench.engine.core import load
    from workbench.payoff import pays_off
    from workbench.payoff.inputs import PaysOffInputError, check_inputs

    # every check that needs no model first: nothing loads before they pass (pays_off repeats them: cheap)
    prompts = read_prompts(args)
    check_inputs(prompts, args.batch, args.policies, args.max_new_tokens, args.temperature, args.seed, args.repeats)
    validate.threads(args.threads), validate.device(args.device)
    if args.target in PAIRS and args.draft:
        raise PaysOffInputError(f"--target {args.target} is an embedded pair with its own drafter: drop --draft")
    if args.target not in PAIRS and not args.draft:
        raise PaysOffInputError(f"--target {args.target!r}: use dense or hybrid, or give a target directory with "
                                "--draft DIR")
    require_own_engine(args.engine, "pays-off")  # it decodes batches of the engine's own rows
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    target = None if args.target == "dense" else args.target
    engine = load(target=target, draft=args.draft, device=args.device, threads=args.threads, engine=args.engine)
    temps = [0.0] + ([args.temperature] if args.temperature > 0 else [])
    results = [pays_off(engine, prompts, batch=args.batch, policies=args.policies,
                        max_new_tokens=args.max_new_tokens, temperature=t, seed=args.seed, repeats=args.repeats,
                        progress=not args.quiet) for t in temps]
    if args.json:  # strict JSON: to_dict writes null (with a note) for NaN, and allow_nan=False proves it
        print(json.dumps({"greedy": results[0].to_dict(),
                          "sampled": results[1].to_dict() if len(results) > 1 else None}, allow_nan=False), file=out)
    else:
        print("\n\n".join(str(r) for r in results), file=out)
    return 0
