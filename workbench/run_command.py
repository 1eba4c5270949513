"""``python -m workbench run``: generate from one prompt on any registered engine and print the text and a
summary (or one JSON object). Read through the engine interface only (``BaseEngine.session``, the session's
``run``, ``generated``, ``text``, ``kernel_backend`` and its trace), so ``--engine NAME`` runs a third-party
engine as it runs the workbench's own.

Why a room of its own and not in ``workbench/engine/``: it is the public API's one generation
(``wb.load(...).session(...).run()``) on whichever engine is named, and the command helpers it needs
(``workbench.cli_args``) sit a floor above the engine. Like ``report``, it is its own room on the top floor
(``tools/import_graph.py``), above the bench whose ``versions()`` its JSON records."""
from __future__ import annotations

import json

from workbench.engine import validate
from workbench.cli_args.engine_options import add_model_args, engine_policy, load_engine
from workbench.cli_args.values import UsageError, check_output, finite_float, non_negative_int, positive_int
from workbench.engine.validate import as_arg


def add_parser(sub) -> None:
    from workbench.engine.core import DEFAULT_MAX_NEW_TOKENS
    from workbench.engine.policies import usages as policy_usages

    p = sub.add_parser("run", help="generate from one prompt and print the text and a summary")
    p.add_argument("--prompt", required=True, type=as_arg(validate.text), help="the prompt text")
    p.add_argument("--chat", action="store_true",
                   help="send --prompt as one user message through the target's chat template (non-thinking)")
    p.add_argument("--policy", default=None,
                   help=f"one of {policy_usages()} (every registered policy), or a label the bench prints, "
                        "e.g. 'DDTree(16, width=1)' (default: the engine's own, ddtree:32 on the workbench's, "
                        "dflash on vLLM's)")
    p.add_argument("--max-new-tokens", type=positive_int, default=DEFAULT_MAX_NEW_TOKENS,
                   help=f"new tokens in all, the first included (default {DEFAULT_MAX_NEW_TOKENS})")
    p.add_argument("--temperature", type=as_arg(validate.temperature), default=0.0,
                   help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-p", type=finite_float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1)")
    p.add_argument("--top-k", type=non_negative_int, default=0, help="sample from the k best tokens (0 = all)")
    p.add_argument("--seed", type=as_arg(validate.seed), default=0, help="sampling seed, 0 to 2**64-1 (default 0)")
    add_model_args(p)
    p.add_argument("--trace", metavar="FILE", help="save the trace (JSON lines) to FILE")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args, out, err) -> int:
    import torch

    from workbench.bench.versions import versions

    policy = engine_policy(args.engine, args.policy)
    if args.temperature < 0:
        raise UsageError(f"--temperature {args.temperature} must be >= 0")
    if not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p {args.top_p} must be in (0, 1]")
    if args.trace:
        check_output(args.trace, "--trace")
    engine = load_engine(args)
    text = dict(messages=[{"role": "user", "content": args.prompt}]) if args.chat else dict(prompt=args.prompt)
    s = engine.session(**text, policy=policy, temperature=args.temperature, top_p=args.top_p,
                       top_k=args.top_k, seed=args.seed, max_new_tokens=args.max_new_tokens)
    trace = s.run()
    if args.trace:
        trace.save(args.trace)
    summ = trace.summary()
    if args.json:
        obj = {
            "policy": summ.policy, "text": s.text, "new_tokens": trace.new_tokens, "cycles": summ.cycles,
            "tau": summ.tau, "accept_lengths": trace.accept_lengths, "tokens_per_s": summ.tokens_per_s,
            "decode_tokens_per_s": summ.decode_tokens_per_s,
            "stage_seconds": summ.stage_seconds, "prefill_seconds": trace.prefill_seconds,
            "seconds": summ.seconds, "finish_reason": trace.finish_reason, "tokens": list(s.generated),
            "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed,
            "max_new_tokens": args.max_new_tokens, "device": str(engine.device),
            # as the session's trace records them: every engine's trace names its dtype
            "dtype": trace.meta.get("dtype"), "threads": torch.get_num_threads(),
            "kernel_backend": s.kernel_backend, "engine": args.engine, "versions": versions(),
        }
        if args.trace:
            obj["trace"] = str(args.trace)
        print(json.dumps(obj), file=out)
    else:
        print(s.text, file=out)
        print(f"-- {summ}", file=out)
    return 0
