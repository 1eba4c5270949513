"""``python -m workbench.train.cond_eval``: the learned conditioned head beside the successor table, on the held-out
evaluation prompts (``workbench.shipped.eval_prompts``, both splits), which neither head was trained or tuned on.

- **Next-slot top-1 by path state**: the target's greedy continuation of every prompt, a block rooted at every
  position of it (every place a cycle could start); for each slot a tree can reach, is the best candidate given
  the target's previous token the target's token? The drafter's marginal (its rank 0), the successor table at the
  calibration's beta (``pair_head``), the learned head (``cond_head``); by the path state above the slot (spine:
  every token above is the drafter's top-1; sibling: the token just above is not; off: an earlier one was not).
- **Tokens per target forward (tau)**: greedy decodes of every prompt with DDTree, PairTree and CondTree at the
  same node budgets, and with DFlash, PairChain and CondChain (a chain each, as deep as the block); tau pooled
  over the prompts (committed tokens / verify forwards). Every decode's output is checked equal to DFlash's.

    python -m workbench.train.cond_eval --target dense --json cond-eval-dense.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from workbench.shipped import eval_prompts
from workbench.train.cond_head import K, accuracy_table, describe_accuracy, examples, load_pair, shipped_table


def prompts(per_split: int | None) -> list[tuple[str, bool]]:
    """(text, is_short) of the shipped evaluation prompts, the first ``per_split`` of each split (None: all)."""
    long, short = eval_prompts("long")[:per_split], eval_prompts("short")[:per_split]
    return [(it["prompt"], False) for it in long] + [(it["prompt"], True) for it in short]


def accuracy(models, texts, new_tokens: int, head, table, beta) -> dict:
    """Next-slot top-1 by path state on blocks rooted at every position of the target's continuations."""
    from workbench.train.cond_data import blocks_of, continuations

    encoded = [ids for ids in (models.tokenizer(t, add_special_tokens=False)["input_ids"] for t, _ in texts) if ids]
    blocks = blocks_of(models, continuations(models, encoded, new_tokens, rows=1), K, None, 0)  # whole prompts
    return accuracy_table(examples(blocks), head, table, beta)


def policies(sizes: list[int], width: int) -> list:
    from workbench.engine.policies import CondChain, CondTree, DDTree, DFlash, PairChain, PairTree

    trees = [cls(n) for n in sizes for cls in (DDTree, PairTree, CondTree)]
    return trees + [DFlash(), PairChain(width), CondChain(width)]


def taus(engine, texts, new_tokens: int, pols) -> dict:
    """str(policy) -> {"tau", "cycles", "tokens", "same_as_dflash"}: greedy decodes of every prompt."""
    from workbench.engine.policies import DFlash

    ref, out = {}, {}
    for pol in [DFlash()] + [p for p in pols if p != DFlash()]:
        acc = cycles = 0
        same = True
        for i, (text, _) in enumerate(texts):
            s = engine.session(text, policy=pol, max_new_tokens=new_tokens)
            trace = s.run()
            acc += sum(trace.accept_lengths)
            cycles += len(trace.cycles)
            ref.setdefault(i, list(s.generated))
            same &= list(s.generated) == ref[i]
        out[str(pol)] = {"tau": acc / max(1, cycles), "cycles": cycles, "tokens": acc, "same_as_dflash": same}
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench.train.cond_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="dense", help="dense or hybrid (an embedded pair with a shipped head)")
    p.add_argument("--prompts", type=int, default=None, help="evaluation prompts per split (default: all)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per decode (default 64)")
    p.add_argument("--sizes", default="8,16,32", help="tree node budgets (default 8,16,32)")
    p.add_argument("--width", type=int, default=8, help="the chains' width (default 8)")
    p.add_argument("--skip-tau", action="store_true", help="only the next-slot accuracy")
    p.add_argument("--json", default=None, metavar="FILE", help="write the figures as JSON")
    p.add_argument("--threads", type=int, default=1)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.target not in ("dense", "hybrid"):
        print(f"cond_eval: --target {args.target} must be dense or hybrid", file=sys.stderr)
        return 2
    from workbench.engine.core import load
    from workbench.engine.policies.cond_head import shipped_for
    from workbench.models.identity import pair_identity

    torch.set_num_threads(args.threads)
    engine = load() if args.target == "dense" else load("hybrid")
    models = engine.models
    pair = pair_identity(models)
    head, (table, beta) = shipped_for(pair), shipped_table(pair)
    if head is None:
        print(f"cond_eval: no shipped conditioned head for the {args.target} pair", file=sys.stderr)
        return 2
    texts = prompts(args.prompts)
    t0 = time.perf_counter()
    result = {"pair": args.target, "prompts": len(texts), "new_tokens": args.new_tokens, "table_beta": beta,
              "head": head.path, "head_made": head.meta.get("made"),
              "top1": accuracy(models, texts, args.new_tokens, head, table, beta)}
    print(f"next-slot top-1 ({args.target}, {len(texts)} evaluation prompts): {describe_accuracy(result['top1'])}")
    if not args.skip_tau:
        sizes = [int(s) for s in args.sizes.split(",")]
        result["tau"] = taus(engine, texts, args.new_tokens, policies(sizes, args.width))
        for name, v in result["tau"].items():
            differs = "" if v["same_as_dflash"] else "  OUTPUT DIFFERS"
            print(f"{name:16s} tau {v['tau']:.3f} ({v['cycles']} forwards){differs}")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
