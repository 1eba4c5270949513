"""``python -m workbench bench``: policies side by side on a prompt set (``workbench.bench.policy_bench``), the
batched bench (``--batch-size``), the plain decoder beside the engine (``--reference``), op counts and profiles;
or, for vLLM, the comparison report (``wb.compare``, ``--served``).

``--engine NAME`` runs the policy bench on any registered engine, an installed package's included: the bench
reads only what the engine interface declares. What drives the workbench engine's own model states
(``--reference``, ``--count-ops``, ``--profile``) takes that engine or one built on it, and ``--batch-size`` an
engine that offers batched sessions; both are said before any model loads. Every other bad option is one line
(exit 2) before the models load too.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.engine import validate
from workbench.cli_args.engine_options import DEFAULT_ENGINE, add_model_args, load_engine, require_own_engine
from workbench.cli_args.values import EXIT_FAILED, UsageError, check_output, positive_int, progress
from workbench.engine.validate import as_arg

# Engines whose bench is the comparison report instead of the policy bench: vLLM runs its own DFlash method
# (not the listed policies), and the report holds its drafts against the reference drafter's.
REPORTED = ("vllm",)


def add_parser(sub) -> None:
    from workbench.engine.core import DEFAULT_MAX_NEW_TOKENS
    from workbench.engine.policies import usages as policy_usages

    p = sub.add_parser("bench", help="policies side by side on a prompt set (Spec-Bench metrics)")
    p.add_argument("--policies", default="ar,dflash,ddtree:16,ddtree:32,ddtree:64",
                   help=f"comma-separated, each one of {policy_usages()} or a printed label, e.g. "
                        "ar,dflash,ddtree:32 (default ar,dflash,ddtree:16,ddtree:32,ddtree:64)")
    p.add_argument("--prompts", metavar="FILE", help="JSON lines with id and prompt, or one prompt per line "
                                                     "(default: the shipped evaluation prompts)")
    p.add_argument("--split", choices=["long", "short"], default="long",
                   help="which shipped evaluation prompts when --prompts is not given: long held-out excerpts "
                        "(default) or short openings of 1-7 lines")
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N prompts")
    p.add_argument("--max-new-tokens", type=positive_int, default=DEFAULT_MAX_NEW_TOKENS,
                   help=f"new tokens per prompt (default {DEFAULT_MAX_NEW_TOKENS})")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="runs per prompt and policy: medians are kept and the tok/s range over repeats is "
                        "shown (default 3; 1 shows no spread)")
    p.add_argument("--out", metavar="FILE.jsonl", help="write one JSON line per prompt and policy")
    p.add_argument("--temperature", type=as_arg(validate.temperature), default=0.0,
                   help="0 = greedy (default); > 0 samples (every run from --seed)")
    p.add_argument("--seed", type=as_arg(validate.seed), default=0, help="sampling seed, 0 to 2**64-1 (default 0)")
    p.add_argument("--check-lossless", action="store_true",
                   help="exit 1 if any greedy output differs from AR's (AR is added when missing)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation per policy")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="batched DDTree: a batch of N requests against the same N run one after another")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="progress on stderr (default: on; --no-progress or --quiet silences it)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--reference", action="store_true",
                   help="also run each DDTree budget through a plain reference decoder, interleaved, and "
                        "compare speed per stage (checks both decode the same trees)")
    p.add_argument("--count-ops", action="store_true",
                   help="aten ops per cycle of each DDTree budget, engine (solo and per request in a batch of 2) "
                        "vs the plain reference decoder, in a separate untimed pass (always on with --reference)")
    p.add_argument("--profile", metavar="DIR", help="after the bench, profile one generation per policy with "
                                                    "the torch profiler; write DIR/<policy>.trace.json")
    p.add_argument("--workarounds", action="store_true",
                   help="with --engine vllm: apply workbench.adapters.vllm_workarounds (vLLM 0.32.0) first")
    p.add_argument("--served", metavar="URL", help="with --engine vllm: a running OpenAI-compatible server "
                                                   "(vllm serve) to compare against; acceptance from its /metrics")
    p.add_argument("--api-key", metavar="KEY", help="the served engine's API key (--served)")
    add_model_args(p, engine_help="the engine the policies run on, by its registry name (default workbench; an "
                                  "installed package's engines too); vllm: the comparison report, the same pair "
                                  "and prompts on the workbench's engine and on vLLM in this process (tokens, "
                                  "drafts, tau, per-position acceptance, tokens/s, and where drafts first "
                                  "differ); --served URL: against a running server instead")


def defaults() -> argparse.Namespace:
    """Every option at its default (what a flag left out reads as)."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["bench"])


def run(args, out, err) -> int:
    from workbench.shipped import eval_prompts, load_prompts

    from workbench.engine.policies.calibration import check_named

    policies = validate.policy_list(args.policies, "--policies")
    check_named(policies)  # the calibration files they name, read before any model loads
    prompts = load_prompts(args.prompts) if args.prompts else eval_prompts(args.split)
    if args.limit:
        prompts = prompts[: args.limit]
    if args.out:
        check_output(args.out, "--out")  # fail now, not after the run, when the file cannot be written
    if args.profile:
        validate.output_dir(args.profile, "--profile")
    if args.api_key is not None and not args.served:
        raise UsageError("--api-key is the key of a --served engine and nothing else uses it: add --served URL, "
                         "or drop it")
    if args.engine in REPORTED or args.workarounds or args.served:
        return production_report(args, [p["prompt"] for p in prompts], out, err)
    check_options(args, policies)  # option combinations too, before the models load and the bench runs
    if args.check_lossless and args.temperature:
        raise UsageError(f"--check-lossless compares greedy outputs; --temperature {args.temperature:g} samples: "
                         "drop one of them")
    engine = load_engine(args)
    policies = bound_to_pair(engine, policies)
    if args.batch_size:
        return batch(args, engine, policies, prompts, out)
    return side_by_side(args, engine, policies, prompts, out, err)


def bound_to_pair(engine, policies: list) -> list:
    """Every policy bound to the loaded pair before any of them decodes (``validate.policy_fits``, as pays-off
    binds its shapes first): a calibration made on another pair is refused now, not at its policy's turn. An
    engine without the workbench's model states binds its policies itself, per session."""
    from workbench.models.identity import pair_identity

    models = getattr(engine, "models", None)
    if models is None or not hasattr(models, "block_size"):
        return policies
    pair = pair_identity(models)
    return [validate.policy_fits(p, models.block_size - 1, pair) for p in policies]


def side_by_side(args, engine, policies, prompts, out, err) -> int:
    """The policy bench on the loaded engine, then what the options add: the reference decoder, op counts,
    profiles; exit 1 when the lossless check asked for fails."""
    from workbench.bench.policy_bench import bench_json, compare_policies

    res = compare_policies(engine, policies, prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                           check_lossless=args.check_lossless, progress=progress(args), warmup=not args.no_warmup,
                           temperature=args.temperature, seed=args.seed)
    if args.out:
        from workbench.records.files import write_text_atomic

        write_text_atomic(Path(args.out), "".join(json.dumps(row) + "\n" for row in res.rows))
    summary = bench_json(res) if args.json else None  # --json: one object, the reference and op counts inside it
    if not args.json:
        print_tables(res, out)
    if args.reference:
        ref = reference_comparison(args, engine, policies, prompts)
        if args.json:
            summary["reference"] = ref
        else:
            from workbench.bench.plain_decoder import reference_table

            print("engine vs a plain reference decoder (x = engine / reference; tok/s > 1 and cycle < 1: "
                  "engine faster)", file=out)
            print(reference_table(ref), file=out)
    if args.reference or args.count_ops:
        ops = count_ddtree_ops(args, engine, policies, prompts)
        if args.json:
            summary["ops_per_cycle"] = ops
        else:
            from workbench.bench.opcount import ops_table

            print(ops_table(ops), file=out)
    if summary is not None:
        print(json.dumps(summary), file=out)
    if args.profile:
        write_profiles(args, engine, policies, prompts, out, err)
    if args.check_lossless and res.failures:
        print(f"workbench: {res.failures[0]}" + (f" ({len(res.failures)} outputs differ in all)"
                                                  if len(res.failures) > 1 else ""), file=err)
        return EXIT_FAILED
    return 0


def print_tables(res, out) -> None:
    """The run's settings in one line, the summary table and the per-stage percentiles."""
    from workbench.bench.policy_bench import percentile_table, summary_table

    st = res.settings
    mode = "greedy" if not st["temperature"] else f"temperature {st['temperature']:g}, seed {st['seeds'][0]}"
    print(f"{st['prompts']} prompts, {st['max_new_tokens']} new tokens, {st['repeats']} repeat(s), {mode}, "
          f"{st['device']}, {st['threads']} threads", file=out)
    print(summary_table(res.summary), file=out)
    print(percentile_table(res.summary), file=out)


def reference_comparison(args, engine, policies, prompts) -> dict:
    """``--reference``: each DDTree budget through the plain reference decoder beside the engine."""
    from workbench.bench.plain_decoder import compare_reference

    budgets = ddtree_budgets(policies)
    if not budgets:
        raise ValueError(f"--reference compares DDTree budgets; --policies {args.policies!r} has none")
    return compare_reference(engine, prompts, budgets, args.max_new_tokens, args.repeats, progress(args))


def write_profiles(args, engine, policies, prompts, out, err) -> None:
    """``--profile DIR``: one generation per policy under the torch profiler, DIR/<policy>.trace.json each."""
    from workbench.bench.profiling import profile_generation

    for p in policies:
        dest = Path(args.profile) / f"{str(p).replace(' ', '').replace(',', '_')}.trace.json"
        table = profile_generation(engine, p, prompts[0]["prompt"], args.max_new_tokens, dest)
        print(f"profile of {p} on {prompts[0]['id']!r}: {dest}", file=err if args.json else out)
        if not args.json:
            print(table, file=out)


def ddtree_budgets(policies) -> list[int]:
    """The budgets of the plain DDTree policies listed (what the reference decoder and the op count run)."""
    from workbench.engine.policies import DDTree

    return [p.budget for p in policies if p.kind == DDTree.kind and p.width is None]


def check_options(args, policies) -> None:
    """Refuse option combinations that could only fail after the bench: one line, before any work."""
    for flag, on in (("--reference", args.reference), ("--count-ops", args.count_ops)):
        if on and not ddtree_budgets(policies):
            raise UsageError(f"{flag} {'compares' if flag == '--reference' else 'counts'} DDTree budgets; "
                             f"--policies {args.policies!r} has none: add one, e.g. --policies {args.policies},ddtree:32")
    used = [f for f, on in (("--reference", args.reference), ("--count-ops", args.count_ops),
                            ("--profile", args.profile), ("--out", args.out), ("--check-lossless", args.check_lossless),
                            ("--temperature", args.temperature), ("--seed", args.seed)) if on]
    if args.batch_size and used:
        raise UsageError(f"--batch-size runs the batched bench only; {', '.join(used)} would be ignored: "
                         "drop them or drop --batch-size")
    if args.engine != DEFAULT_ENGINE:
        check_engine(args)


def check_engine(args) -> None:
    """What another engine than the workbench's cannot run, said before it loads."""
    for flag, on in (("--reference", args.reference), ("--count-ops", args.count_ops), ("--profile", args.profile)):
        if on:
            require_own_engine(args.engine, flag)
    if args.batch_size:
        from workbench.interface.base import BaseEngine
        from workbench.interface.registry import engine_class

        cls = engine_class(args.engine)
        if cls.batch_session is BaseEngine.batch_session:  # the interface's default: it lacks batched sessions
            hint = cls.instead.get("batch_session", "use --engine workbench")
            raise UsageError(f"--batch-size runs batched sessions; the {args.engine} engine has none: {hint}")


def production_report(args, prompts: list[str], out, err) -> int:
    """``bench --engine vllm``: the comparison report (``workbench.adapters``), checked before any load."""
    if args.engine not in REPORTED:
        raise UsageError(f"{'--workarounds' if args.workarounds else '--served'} compares against a production "
                         f"engine: add --engine {REPORTED[0]}")
    given = [f for f, on in (("--reference", args.reference), ("--count-ops", args.count_ops),
                             ("--batch-size", args.batch_size), ("--profile", args.profile),
                             ("--check-lossless", args.check_lossless), ("--temperature", args.temperature))
             if on]
    if given:
        raise UsageError(f"{given[0]} is a bench of the workbench's own engine; --engine {args.engine} reports "
                         "tokens equality itself and runs greedy: drop it")
    if args.served and args.workarounds:
        raise UsageError("--workarounds patches vLLM in this process; a --served engine runs its own: drop one")
    base = defaults()
    unused = [flag for flag, name in (("--policies", "policies"), ("--device", "device"), ("--dtype", "dtype"),
                                      ("--kernel-backend", "kernel_backend"), ("--threads", "threads"),
                                      ("--device-map", "device_map"), ("--trust-remote-code", "trust_remote_code"),
                                      *([("--repeats", "repeats")] if args.served else []))
              if getattr(args, name) != getattr(base, name)]
    if unused:
        why = ("the server runs its own pair, device and kernels, one request per prompt" if args.served else
               "the report runs AR and DFlash in float32 on the workbench's engine, and vLLM on its own device "
               "and kernels")
        raise UsageError(f"{unused[0]} is not used by --engine {args.engine}{' --served' if args.served else ''} "
                         f"({why}): drop it")
    target, draft = getattr(args, "target", None), getattr(args, "draft", None)
    say = (lambda m: print(f"bench: {m}", file=err, flush=True)) if progress(args) else None
    if args.served:
        from workbench.adapters.served import compare_served

        report = compare_served(args.served, prompts, api_key=args.api_key, target=target, draft=draft,
                                max_new_tokens=args.max_new_tokens)
        data = {"url": report.url, "model": report.model, "pair": report.pair, "drafts": report.drafts,
                "tau": report.tau, "reference_tau": report.reference_tau, "per_position": report.per_position(),
                "requests": [vars(r) | {"tau": r.tau} for r in report.requests]}
    else:
        from workbench.adapters.compare import compare

        report = compare(target, draft, prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                         workarounds=args.workarounds, engine=args.engine, progress=say)
        data = report.to_dict()
    if args.out:
        from workbench.records.files import write_text_atomic

        write_text_atomic(args.out, json.dumps(data) + "\n")
    print(json.dumps(data) if args.json else str(report), file=out)
    return 0


def count_ddtree_ops(args, engine, policies, prompts) -> dict:
    """Ops per cycle (``workbench.bench.opcount``) on the first 2 prompts, after the timed runs."""
    from workbench.bench.opcount import count_ops

    budgets = ddtree_budgets(policies)
    if not budgets:
        raise ValueError(f"--count-ops counts DDTree budgets; --policies {args.policies!r} has none")
    return count_ops(engine, [p["prompt"] for p in prompts[:2]], budgets, min(args.max_new_tokens, 32))


def batch(args, engine, policies, prompts, out) -> int:
    from workbench.bench.batch_bench import batch_policies_table, compare_policies_batched

    res = compare_policies_batched(engine, policies, prompts, args.batch_size, args.max_new_tokens,
                                   max(args.repeats, 1), warmup=not args.no_warmup, progress=progress(args))
    print(json.dumps(res) if args.json else batch_policies_table(res), file=out)
    return 0
