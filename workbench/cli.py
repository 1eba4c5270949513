"""The command line: ``python -m workbench {run,bench,report,kernels,serve}``.

Results go to stdout, progress and errors to stderr. Bad input (an unknown policy, a
malformed prompts file, CUDA or SGLang kernels that are not there, ...) is one line
on stderr and exit code 2; a failed lossless check is exit code 1.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from workbench.engine import validate
from workbench.engine.validate import as_arg

EXIT_FAILED = 1  # the command ran, but what it checks failed (the lossless check)
EXIT_USAGE = 2  # bad input
SERVED_MAX_NEW_TOKENS = 1024  # `serve --max-new-tokens`'s default: the limit of bench-serve's servers too


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (no usage block) and exit code 2."""

    def error(self, message):  # noqa: D401
        raise UsageError(f"{message} (see: {self.prog} --help)")


def _int_at_least(low: int, what: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what} integer")
        return v

    return parse


_positive_int = _int_at_least(1, "positive")
_non_negative_int = _int_at_least(0, "non-negative")
def _device(text: str) -> str:
    """cpu, cuda or cuda:N; anything else (tpu, meta, mps, ...) is refused before any model loads."""
    from workbench.engine.validate import device

    t = text.strip().lower()
    try:
        return device(t)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _check_output(path: str, option: str) -> Path:
    """Refuse an output path that cannot be written, before any model loads (the message names it;
    a missing folder is refused, never created)."""
    from workbench.engine.validate import output_path

    try:
        return output_path(path, option)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _finite_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return v


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", metavar="DIR", help="target model directory (default: the embedded pair), or "
                   "'hybrid' alone for the embedded hybrid pair")
    g.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (with --target)")
    g.add_argument("--device", type=_device, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    g.add_argument("--dtype", default="auto",
                   help="auto (default: the checkpoint's own dtype), float32, bfloat16, float16")
    g.add_argument("--device-map", default=None, metavar="MAP",
                   help="transformers' device_map for the target, e.g. auto (a target larger than one GPU)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="run a checkpoint's own Python code (e.g. Kimi-K2); refused without this flag")
    g.add_argument("--kernel-backend", default="torch", help="accept-walk kernels: torch (default), sglang (SGLang's CUDA JIT kernel "
                   "on CUDA, its Triton kernel on CPU) or sglang-triton")
    g.add_argument("--threads", type=as_arg(validate.threads), default=None, help="CPU threads (default: up to 8)")


def build_parser() -> argparse.ArgumentParser:
    from workbench.version import __version__
    from workbench.engine.core import DEFAULT_MAX_NEW_TOKENS
    from workbench.engine.policies import usages as policy_usages
    from workbench.interface.registry import engine_names

    parser = _Parser(prog="workbench", description="DFlash / DDTree speculative decoding workbench")
    parser.add_argument("--version", action="version", version=f"workbench {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="{run,bench,report,kernels,serve,bench-serve,pays-off,sweep,conform}", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("run", help="generate from one prompt and print the text and a summary")
    p.add_argument("--prompt", required=True, type=as_arg(validate.text), help="the prompt text")
    p.add_argument("--chat", action="store_true",
                   help="send --prompt as one user message through the target's chat template (non-thinking)")
    p.add_argument("--policy", default="ddtree:32",
                   help=f"one of {policy_usages()} (every registered policy), or a label the bench prints, "
                        "e.g. 'DDTree(16, width=1)' (default ddtree:32)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=DEFAULT_MAX_NEW_TOKENS,
                   help=f"new tokens in all, the first included (default {DEFAULT_MAX_NEW_TOKENS})")
    p.add_argument("--temperature", type=as_arg(validate.temperature), default=0.0,
                   help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-p", type=_finite_float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1)")
    p.add_argument("--top-k", type=_non_negative_int, default=0, help="sample from the k best tokens (0 = all)")
    p.add_argument("--seed", type=as_arg(validate.seed), default=0, help="sampling seed, 0 to 2**64-1 (default 0)")
    _add_model_args(p)
    p.add_argument("--trace", metavar="FILE", help="save the trace (JSON lines) to FILE")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    p = sub.add_parser("bench", help="policies side by side on a prompt set (Spec-Bench metrics)")
    p.add_argument("--policies", default="ar,dflash,ddtree:16,ddtree:32,ddtree:64",
                   help=f"comma-separated, each one of {policy_usages()} or a printed label, e.g. "
                        "ar,dflash,ddtree:32 (default ar,dflash,ddtree:16,ddtree:32,ddtree:64)")
    p.add_argument("--prompts", metavar="FILE", help="JSON lines with id and prompt, or one prompt per line "
                                                     "(default: the shipped evaluation prompts)")
    p.add_argument("--split", choices=["long", "short"], default="long",
                   help="which shipped evaluation prompts when --prompts is not given: long held-out excerpts "
                        "(default) or short openings of 1-7 lines")
    p.add_argument("--limit", type=_positive_int, default=None, help="use only the first N prompts")
    p.add_argument("--max-new-tokens", type=_positive_int, default=DEFAULT_MAX_NEW_TOKENS,
                   help=f"new tokens per prompt (default {DEFAULT_MAX_NEW_TOKENS})")
    p.add_argument("--repeats", type=_positive_int, default=3,
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
    p.add_argument("--batch-size", type=_positive_int, default=None,
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
    p.add_argument("--engine", choices=engine_names(), default="workbench",
                   help="vllm: the conformance report, the same pair and prompts on the workbench's engine and "
                        "on vLLM in this process (tokens, drafts, tau, per-position acceptance, tokens/s, and "
                        "where drafts first differ); --served URL: against a running server instead")
    p.add_argument("--workarounds", action="store_true",
                   help="with --engine vllm: apply workbench.adapters.vllm_workarounds (vLLM 0.32.0) first")
    p.add_argument("--served", metavar="URL", help="with --engine vllm: a running OpenAI-compatible server "
                                                   "(vllm serve) to compare against; acceptance from its /metrics")
    p.add_argument("--api-key", metavar="KEY", help="the served engine's API key (--served)")
    _add_model_args(p)

    p = sub.add_parser("report", help="a self-contained HTML page from a trace or a bench JSONL file")
    p.add_argument("file", metavar="TRACE_OR_BENCH_FILE", help="a trace (run --trace) or a bench --out file")
    p.add_argument("--out", metavar="FILE.html", default="report.html", help="the page to write (default report.html)")
    p.add_argument("--target", metavar="DIR", default=None,
                   help="model directory whose tokenizer shows token text (default: the trace's own target)")

    _add_serve_parser(sub)
    _add_bench_serve_parser(sub)
    from workbench.payoff.command import add_parser as add_pays_off_parser  # the command's code lives there

    add_pays_off_parser(sub)
    from workbench.bench.sweep import add_parser as add_sweep_parser  # the command's code lives there

    add_sweep_parser(sub)
    from workbench.conform.check import add_parser as add_conform_parser  # the command's code lives there

    add_conform_parser(sub)

    p = sub.add_parser("kernels", help="micro-benchmarks of the tree kernels against their oracles")
    p.add_argument("--budgets", default=None,
                   help="comma-separated tree budgets, each 1 to 4096 (default 16,32,...,1024)")
    p.add_argument("--repeats", type=_positive_int, default=10, help="timed calls per measurement (median)")
    p.add_argument("--device", type=_device, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=_positive_int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="progress on stderr (default: on; --no-progress or --quiet silences it)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


# ---------------------------------------------------------------------------------------------- commands
def _progress(args) -> bool:
    """Long work shows progress on stderr by default, a terminal or not (a log, a notebook's !cell)."""
    return bool(args.progress) and not args.quiet


def _load_engine(args):
    import workbench as wb

    from workbench.engine.loading import PAIRS, pair_name

    if bool(args.target) != bool(args.draft) and pair_name(args.target, args.draft) is None:
        raise UsageError("--target and --draft go together: give both model directories, or neither "
                         f"(or --target {' / '.join(PAIRS)} alone for an embedded pair)")
    from ddtree_kernels import check_backend
    from workbench.engine.loading import resolve_device, resolve_dtype

    # Check the cheap things before loading any weights.
    check_backend(args.kernel_backend)
    resolve_device(args.device)
    resolve_dtype(args.dtype)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr is for our own progress and errors
    return wb.load(target=args.target, draft=args.draft, device=args.device, dtype=args.dtype,
                   kernel_backend=args.kernel_backend, threads=args.threads, device_map=args.device_map,
                   trust_remote_code=args.trust_remote_code)


def cmd_run(args, out, err) -> int:
    import torch

    from workbench.bench.versions import versions
    from workbench.engine.policies import parse_policy

    policy = parse_policy(args.policy)
    if args.temperature < 0:
        raise UsageError(f"--temperature {args.temperature} must be >= 0")
    if not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p {args.top_p} must be in (0, 1]")
    if args.trace:
        _check_output(args.trace, "--trace")
    engine = _load_engine(args)
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
            "seconds": summ.seconds, "finish_reason": trace.finish_reason, "tokens": s.tokens,
            "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed,
            "max_new_tokens": args.max_new_tokens, "device": str(engine.device),
            "dtype": str(engine.models.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
            "kernel_backend": engine.kernel_backend, "versions": versions(),
        }
        if args.trace:
            obj["trace"] = str(args.trace)
        print(json.dumps(obj), file=out)
    else:
        print(s.text, file=out)
        print(f"-- {summ}", file=out)
    return 0


def cmd_bench(args, out, err) -> int:
    from workbench.bench.policy_bench import bench, percentile_table, summary_table
    from workbench.shipped import eval_prompts, load_prompts

    policies = validate.policy_list(args.policies, "--policies")
    prompts = load_prompts(args.prompts) if args.prompts else eval_prompts(args.split)
    if args.limit:
        prompts = prompts[: args.limit]
    if args.out:
        _check_output(args.out, "--out")  # fail now, not after the run, when the file cannot be written
    if args.profile:
        validate.output_dir(args.profile, "--profile")
    if args.api_key is not None and not args.served:
        raise UsageError("--api-key is the key of a --served engine and nothing else uses it: add --served URL, "
                         "or drop it")
    if args.engine != "workbench" or args.workarounds or args.served:
        return _bench_production(args, [p["prompt"] for p in prompts], out, err)
    _check_bench_options(args, policies)  # option combinations too, before the models load and the bench runs
    if args.check_lossless and args.temperature:
        raise UsageError(f"--check-lossless compares greedy outputs; --temperature {args.temperature:g} samples: "
                         "drop one of them")
    engine = _load_engine(args)
    if args.batch_size:
        return _bench_batch(args, engine, policies, prompts, out)
    res = bench(engine, policies, prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                check_lossless=args.check_lossless, progress=_progress(args), warmup=not args.no_warmup,
                temperature=args.temperature, seed=args.seed)
    if args.out:
        from workbench.records.files import write_text_atomic

        write_text_atomic(Path(args.out), "".join(json.dumps(row) + "\n" for row in res.rows))
    summary = None  # --json: one object, the reference comparison and op counts inside it
    if args.json:
        from workbench.bench.policy_bench import bench_json

        summary = bench_json(res)
    else:
        st = res.settings
        mode = "greedy" if not st["temperature"] else f"temperature {st['temperature']:g}, seed {st['seeds'][0]}"
        print(f"{st['prompts']} prompts, {st['max_new_tokens']} new tokens, {st['repeats']} repeat(s), {mode}, "
              f"{st['device']}, {st['threads']} threads", file=out)
        print(summary_table(res.summary), file=out)
        print(percentile_table(res.summary), file=out)
    if args.reference:
        from workbench.bench.plain_decoder import compare_reference, reference_table

        budgets = _ddtree_budgets(policies)
        if not budgets:
            raise ValueError(f"--reference compares DDTree budgets; --policies {args.policies!r} has none")
        ref = compare_reference(engine, prompts, budgets, args.max_new_tokens, args.repeats, _progress(args))
        if args.json:
            summary["reference"] = ref
        else:
            print("engine vs a plain reference decoder (x = engine / reference; tok/s > 1 and cycle < 1: "
                  "engine faster)", file=out)
            print(reference_table(ref), file=out)
    if args.reference or args.count_ops:
        ops = _bench_ops(args, engine, policies, prompts)
        if args.json:
            summary["ops_per_cycle"] = ops
        else:
            from workbench.bench.opcount import ops_table

            print(ops_table(ops), file=out)
    if summary is not None:
        print(json.dumps(summary), file=out)
    if args.profile:
        from workbench.bench.profiling import profile_generation

        for p in policies:
            dest = Path(args.profile) / f"{str(p).replace(' ', '').replace(',', '_')}.trace.json"
            table = profile_generation(engine, p, prompts[0]["prompt"], args.max_new_tokens, dest)
            print(f"profile of {p} on {prompts[0]['id']!r}: {dest}", file=err if args.json else out)
            if not args.json:
                print(table, file=out)
    if args.check_lossless and res.failures:
        print(f"workbench: {res.failures[0]}" + (f" ({len(res.failures)} outputs differ in all)"
                                                  if len(res.failures) > 1 else ""), file=err)
        return EXIT_FAILED
    return 0


def _ddtree_budgets(policies) -> list[int]:
    """The budgets of the plain DDTree policies listed (what the reference decoder and the op count run)."""
    from workbench.engine.policies import DDTree

    return [p.budget for p in policies if p.kind == DDTree.kind and p.width is None]


def _check_bench_options(args, policies) -> None:
    """Refuse option combinations that could only fail after the bench: one line, before any work."""
    for flag, on in (("--reference", args.reference), ("--count-ops", args.count_ops)):
        if on and not _ddtree_budgets(policies):
            raise UsageError(f"{flag} {'compares' if flag == '--reference' else 'counts'} DDTree budgets; "
                             f"--policies {args.policies!r} has none: add one, e.g. --policies {args.policies},ddtree:32")
    used = [f for f, on in (("--reference", args.reference), ("--count-ops", args.count_ops),
                            ("--profile", args.profile), ("--out", args.out), ("--check-lossless", args.check_lossless),
                            ("--temperature", args.temperature), ("--seed", args.seed)) if on]
    if args.batch_size and used:
        raise UsageError(f"--batch-size runs the batched bench only; {', '.join(used)} would be ignored: "
                         "drop them or drop --batch-size")


def _bench_production(args, prompts: list[str], out, err) -> int:
    """``bench --engine vllm``: the conformance report (``workbench.adapters``), checked before any load."""
    import json

    if args.engine != "vllm":
        raise UsageError(f"{'--workarounds' if args.workarounds else '--served'} compares against a production "
                         "engine: add --engine vllm")
    given = [f for f, on in (("--reference", args.reference), ("--count-ops", args.count_ops),
                             ("--batch-size", args.batch_size), ("--profile", args.profile),
                             ("--check-lossless", args.check_lossless), ("--temperature", args.temperature))
             if on]
    if given:
        raise UsageError(f"{given[0]} is a bench of the workbench's own engine; --engine vllm reports tokens "
                         "equality itself and runs greedy: drop it")
    if args.served and args.workarounds:
        raise UsageError("--workarounds patches vLLM in this process; a --served engine runs its own: drop one")
    defaults = build_parser().parse_args(["bench"])
    unused = [flag for flag, name in (("--policies", "policies"), ("--device", "device"), ("--dtype", "dtype"),
                                      ("--kernel-backend", "kernel_backend"), ("--threads", "threads"),
                                      ("--device-map", "device_map"), ("--trust-remote-code", "trust_remote_code"),
                                      *([("--repeats", "repeats")] if args.served else []))
              if getattr(args, name) != getattr(defaults, name)]
    if unused:
        why = ("the server runs its own pair, device and kernels, one request per prompt" if args.served else
               "the report runs AR and DFlash in float32 on the workbench's engine, and vLLM on its own device "
               "and kernels")
        raise UsageError(f"{unused[0]} is not used by --engine vllm{' --served' if args.served else ''} ({why}): "
                         "drop it")
    target, draft = getattr(args, "target", None), getattr(args, "draft", None)
    say = (lambda m: print(f"bench: {m}", file=err, flush=True)) if _progress(args) else None
    if args.served:
        from workbench.adapters.served import compare_served

        report = compare_served(args.served, prompts, api_key=args.api_key, target=target, draft=draft,
                                max_new_tokens=args.max_new_tokens)
        data = {"url": report.url, "model": report.model, "pair": report.pair, "drafts": report.drafts,
                "tau": report.tau, "reference_tau": report.reference_tau, "per_position": report.per_position(),
                "requests": [vars(r) | {"tau": r.tau} for r in report.requests]}
    else:
        from workbench.adapters.conformance import compare

        report = compare(target, draft, prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                         workarounds=args.workarounds, progress=say)
        data = report.to_dict()
    if args.out:
        from workbench.records.files import write_text_atomic

        write_text_atomic(args.out, json.dumps(data) + "\n")
    print(json.dumps(data) if args.json else str(report), file=out)
    return 0


def _bench_ops(args, engine, policies, prompts) -> dict:
    """Ops per cycle (``workbench.bench.opcount``) on the first 2 prompts, after the timed runs."""
    from workbench.bench.opcount import count_ops

    budgets = _ddtree_budgets(policies)
    if not budgets:
        raise ValueError(f"--count-ops counts DDTree budgets; --policies {args.policies!r} has none")
    return count_ops(engine, [p["prompt"] for p in prompts[:2]], budgets, min(args.max_new_tokens, 32))


def _bench_batch(args, engine, policies, prompts, out) -> int:
    from workbench.bench.batch_bench import batch_policies_bench, batch_policies_table

    res = batch_policies_bench(engine, policies, prompts, args.batch_size, args.max_new_tokens, max(args.repeats, 1),
                               warmup=not args.no_warmup, progress=_progress(args))
    print(json.dumps(res) if args.json else batch_policies_table(res), file=out)
    return 0


def cmd_kernels(args, out, err) -> int:
    import torch

    from workbench.bench.kernel_bench import KERNEL_BUDGETS, kernel_bench, kernel_table

    budgets = KERNEL_BUDGETS
    if args.budgets:
        try:
            budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
        except ValueError:
            raise UsageError(f"--budgets {args.budgets!r}: each budget must be a positive integer") from None
        if not budgets or min(budgets) < 1:
            raise UsageError(f"--budgets {args.budgets!r}: each budget must be a positive integer")
        twice = sorted({b for b in budgets if budgets.count(b) > 1})
        if twice:
            raise UsageError(f"--budgets {args.budgets!r}: budget {twice[0]} is given twice; give each budget once")
        from workbench.engine.policies import MAX_BUDGET

        if max(budgets) > MAX_BUDGET:
            raise UsageError(f"--budgets {args.budgets!r}: budget {max(budgets)} is absurdly large; "
                             f"the limit is {MAX_BUDGET} nodes, as for --policies")
    if args.threads:
        torch.set_num_threads(args.threads)
    res = kernel_bench(budgets, repeats=args.repeats, device=args.device, progress=_progress(args))
    print(json.dumps(res) if args.json else kernel_table(res), file=out)
    return 0


def _is_trace(path: Path) -> bool:
    from workbench.records.cycle import TRACE_FORMAT, TraceFileError

    with path.open("rb") as fh:
        raw = fh.readline()
    try:
        first = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceFileError(f"{path}:1: not UTF-8 text; expected a trace or a bench --out file") from None
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(head, dict) and head.get("format") == TRACE_FORMAT


def read_bench_rows(path: Path) -> list[dict]:
    """The JSON lines of ``bench --out``; ValueError with the line number when a line is not one."""
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}); expected a trace or a bench --out file") from None
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{no}: not valid JSON ({e.msg}); expected a trace or a bench --out file") from None
        if not isinstance(row, dict) or not {"policy", "accept_lengths", "stage_seconds"} <= row.keys():
            raise ValueError(f"{path}:{no}: not a bench row (needs policy, accept_lengths, stage_seconds); "
                             "expected a trace or a bench --out file")
        problem = _bench_row_problem(row)
        if problem:
            raise ValueError(f"{path}:{no}: damaged bench row: {problem}; expected a bench --out file")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} is empty; expected a trace or a bench --out file")
    return rows


def _bench_row_problem(row: dict) -> str | None:
    """What is wrong with one bench row's fields (the ones the page reads), in words, or None."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

    if not isinstance(row["policy"], str):
        return f"policy={row['policy']!r:.40} is not a label"
    al = row["accept_lengths"]
    if not isinstance(al, list) or not all(isinstance(a, int) and not isinstance(a, bool) and a >= 1 for a in al):
        return f"accept_lengths={al!r:.40} is not a list of positive integers"
    st = row["stage_seconds"]
    if not isinstance(st, dict) or not all(isinstance(k, str) and number(v) for k, v in st.items()):
        return f"stage_seconds={st!r:.40} is not an object of stage -> seconds"
    for key in ("new_tokens", "wall_time"):
        if key in row and not number(row[key]):
            return f"{key}={row[key]!r:.40} is not a number >= 0"
    return None


def cmd_report(args, out, err) -> int:
    path = Path(args.file)
    if path.is_dir():
        raise UsageError(f"report: '{path}' is a directory; give a trace or a bench --out file")
    if not path.is_file():
        raise UsageError(f"report: file '{path}' does not exist")
    dest = _check_output(args.out, "--out")
    if args.target and not Path(args.target).is_dir():
        raise UsageError(f"--target '{args.target}' is not a directory; give the model directory with the tokenizer")
    if _is_trace(path):
        from workbench.views.report import write_report

        tokenizer = None
        if args.target:
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(args.target)
            except Exception as e:  # noqa: BLE001 - any loader failure is the same bad input
                raise UsageError(f"--target '{args.target}': no tokenizer could be loaded "
                                 f"({' '.join(str(e).split())[:200]})") from None
        write_report(path, dest, tokenizer=tokenizer)
    else:
        from workbench.records.files import write_text_atomic

        from workbench.views.report import bench_page

        write_text_atomic(dest, bench_page(read_bench_rows(path), path.name))
    print(str(dest), file=out)
    return 0


def _add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve one loaded engine over HTTP; notebooks attach with wb.connect(url, token)")
    _add_model_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=as_arg(validate.port), default=8765, help="port (default 8765; 0 picks a free one)")
    g.add_argument("--token-file", metavar="FILE",
                   help="read the token from FILE; if FILE does not exist, write a new token there (mode 600)")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="server log verbosity (default info)")
    g = p.add_argument_group("limits")
    g.add_argument("--session-ttl", type=_finite_float, default=600.0, metavar="S",
                   help="drop a session idle for S seconds (default 600)")
    g.add_argument("--max-sessions", type=_positive_int, default=16, help="live sessions at once (default 16)")
    g.add_argument("--max-new-tokens", type=_positive_int, default=SERVED_MAX_NEW_TOKENS,
                   help=f"per session (default {SERVED_MAX_NEW_TOKENS})")
    g.add_argument("--max-budget", type=_positive_int, default=1024, help="largest DDTree budget (default 1024)")
    g.add_argument("--max-body-bytes", type=_positive_int, default=2**20, metavar="N",
                   help="largest request body; a larger one is answered 413 unread (default 1 MiB)")
    g.add_argument("--max-reply-bytes", type=_positive_int, default=4 * 2**20, metavar="N",
                   help="cycles per reply up to about N bytes; clients fetch the rest in pages (default 4 MiB)")
    g.add_argument("--max-connections", type=_positive_int, default=256, metavar="N",
                   help="open connections; a new one closes the longest-waiting idle one (default 256)")
    g.add_argument("--header-timeout", type=_finite_float, default=5.0, metavar="S",
                   help="close a connection whose request head is not in after S seconds (default 5)")
    g.add_argument("--body-timeout", type=_finite_float, default=10.0, metavar="S",
                   help="close a connection whose request body is not in S seconds after its head (default 10)")
    g.add_argument("--send-timeout", type=_finite_float, default=30.0, metavar="S",
                   help="close a connection that leaves a reply's bytes untaken for S seconds (default 30)")
    g.add_argument("--max-stream-cycles", type=_positive_int, default=1024, metavar="N",
                   help="cycles one /run stream carries; the client then asks again (default 1024)")
    g.add_argument("--max-stream-bytes", type=_positive_int, default=64 * 2**20, metavar="N",
                   help="about N bytes per /run stream; the client then asks again (default 64 MiB)")
    g.add_argument("--max-stream-seconds", type=_finite_float, default=600.0, metavar="S",
                   help="how long one /run stream may run; the client then asks again (default 600)")
    g = p.add_argument_group("batching (the sessions' steps run as rows of shared cycles: workbench.engine.scheduler)")
    g.add_argument("--no-batching", dest="batching", action="store_false",
                   help="drive every session apart, one cycle at a time under one lock (the pre-batching server)")
    g.add_argument("--max-batch-rows", type=_positive_int, default=16, metavar="N",
                   help="sessions per batched cycle (default 16)")
    g.add_argument("--max-batch-nodes", type=_positive_int, default=4096, metavar="N",
                   help="rows x padded tree nodes per batched verify (default 4096)")


def _add_bench_serve_parser(sub) -> None:
    p = sub.add_parser("bench-serve", help="the served engine under load beside the same engine in process: N "
                       "clients at once, what the server adds per step and where it goes")
    p.add_argument("--clients", default="1,4,8,16", help="comma-separated client counts (default 1,4,8,16)")
    p.add_argument("--modes", default="inproc,run,step,serial",
                   help="comma-separated, interleaved: inproc (one batch in this process), run (each client one "
                        "streamed request), step (one request per cycle), serial (run, one client after another), "
                        "unbatched (run on a --no-batching server) (default inproc,run,step,serial)")
    p.add_argument("--policy", default="ddtree:16", help="every client's policy (default ddtree:16)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=48, help="per session (default 48)")
    p.add_argument("--repeats", type=_positive_int, default=1, help="rounds per (mode, clients), order alternating (default 1)")
    p.add_argument("--split", choices=["long", "short"], default="long", help="which held-out prompts (default long)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    _add_model_args(p)


def cmd_bench_serve(args, out, err) -> int:
    import importlib.util

    for name in ("fastapi", "uvicorn"):  # its servers would fail to start, one by one: said before any starts
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)  # main() names the extra
    if args.max_new_tokens > SERVED_MAX_NEW_TOKENS:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens}: bench-serve's servers allow "
                         f"{SERVED_MAX_NEW_TOKENS} new tokens per session (serve's default limit); give "
                         f"{SERVED_MAX_NEW_TOKENS} or fewer")
    from workbench.shipped import eval_prompts
    from workbench.bench.serve_load import bench_serve, table
    from workbench.engine.policies import parse_policy
    from workbench.serve import wire

    try:
        clients = [int(x) for x in args.clients.split(",")]
    except ValueError:
        raise UsageError(f"--clients {args.clients!r} must be comma-separated whole numbers, e.g. 1,4,8,16") from None
    if any(n < 1 for n in clients) or len(set(clients)) != len(clients):
        raise UsageError(f"--clients {args.clients!r}: each count must be 1 or more, and each only once")
    from workbench.bench.serve_load import MODES

    modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes or len(set(modes)) != len(modes):
        raise UsageError(f"--modes {args.modes!r}: give each of {', '.join(MODES)} at most once, comma-separated"
                         + (f" ({unknown[0]!r} is none of them)" if unknown else ""))
    try:
        policy = wire.policy_to_wire(parse_policy(args.policy))
    except ValueError as e:
        raise UsageError(f"--policy {args.policy!r}: {e}") from None
    dest = _check_output(args.json, "--json") if args.json else None
    model_args = [a for k, v in (("--target", args.target), ("--draft", args.draft), ("--device", args.device),
                                 ("--dtype", args.dtype), ("--kernel-backend", args.kernel_backend))
                  if v is not None for a in (k, str(v))]
    prompts = [p["prompt"] for p in eval_prompts(args.split)]
    res = bench_serve(model_args, lambda: _load_engine(args), prompts, clients, policy, args.max_new_tokens,
                      args.repeats, args.threads, modes,
                      progress=lambda msg: print(f"bench-serve: {msg}", file=err, flush=True))
    print(table(res), file=out)
    if dest is not None:
        from workbench.records.files import write_text_atomic

        write_text_atomic(dest, json.dumps(res, indent=2) + "\n")
    return 0


def cmd_sweep(args, out, err) -> int:
    from workbench.bench.sweep import run_command

    return run_command(args, out, err)


def cmd_pays_off(args, out, err) -> int:
    from workbench.payoff.command import run

    return run(args, out, err)


def cmd_conform(args, out, err) -> int:
    from workbench.conform.check import cmd_conform as run

    return run(args, out, err)


def cmd_serve(args, out, err) -> int:
    from workbench.serve.main import serve_main

    return serve_main(args, out, err, _load_engine, UsageError)


COMMANDS = {"run": cmd_run, "bench": cmd_bench, "report": cmd_report, "kernels": cmd_kernels, "serve": cmd_serve,
            "bench-serve": cmd_bench_serve, "pays-off": cmd_pays_off, "sweep": cmd_sweep,
            "conform": cmd_conform}


def main(argv=None) -> int:
    """Entry point; returns the exit code (0 ok, 1 lossless check failed, 2 bad input)."""
    out, err = sys.stdout, sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, out, err)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        print("workbench: interrupted", file=err)
        return 130
    except ImportError as e:  # an optional extra (or dflash) not installed: the pip command, in one line
        from workbench.extras import missing_package

        if os.environ.get("WORKBENCH_DEBUG") or (e.name or "").split(".")[0] in ("workbench", "ddtree_kernels"):
            raise  # our own module missing is a bug: its traceback
        print(f"workbench: error: {missing_package(e, f'`workbench {args.command}`')}", file=err)
        return EXIT_USAGE
    except (UsageError, ValueError, RuntimeError, OSError) as e:
        if os.environ.get("WORKBENCH_DEBUG"):  # the full traceback, for bug reports
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"workbench: error: {msg}", file=err)
        return EXIT_USAGE
