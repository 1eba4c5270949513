"""The command line: ``python -m workbench {run,bench,report,kernels}``.

Results go to stdout, progress and errors to stderr. Bad input (an unknown policy, a
malformed prompts file, CUDA or SGLang kernels that are not there, ...) is one line
on stderr and exit code 2; a failed lossless check is exit code 1.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import os
import sys
from pathlib import Path

EXIT_FAILED = 1  # the command ran, but what it checks failed (the lossless check)
EXIT_USAGE = 2  # bad input


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
    g.add_argument("--target", metavar="DIR", help="target model directory (default: the embedded pair)")
    g.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (with --target)")
    g.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    g.add_argument("--dtype", default=None, help="float32 (default), bfloat16, float16")
    g.add_argument("--kernel-backend", default="torch", help="accept-walk kernels: torch (default), sglang (SGLang's CUDA JIT kernel "
                   "on CUDA, its Triton kernel on CPU) or sglang-triton")
    g.add_argument("--threads", type=_positive_int, default=None, help="CPU threads (default: up to 8)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="workbench", description="DFlash / DDTree speculative decoding workbench")
    sub = parser.add_subparsers(dest="command", metavar="{run,bench,report,kernels}", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("run", help="generate from one prompt and print the text and a summary")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--policy", default="ddtree:32", help="ar, dflash or ddtree:N (default ddtree:32)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=128)
    p.add_argument("--temperature", type=_finite_float, default=0.0)
    p.add_argument("--top-p", type=_finite_float, default=1.0)
    p.add_argument("--top-k", type=_non_negative_int, default=0)
    p.add_argument("--seed", type=int, default=0)
    _add_model_args(p)
    p.add_argument("--trace", metavar="FILE", help="save the trace (JSON lines) to FILE")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    p = sub.add_parser("bench", help="policies side by side on a prompt set (Spec-Bench metrics)")
    p.add_argument("--policies", default="ar,dflash,ddtree:16,ddtree:32,ddtree:64",
                   help="comma-separated, e.g. ar,dflash,ddtree:32 (default ar,dflash,ddtree:16,ddtree:32,ddtree:64)")
    p.add_argument("--prompts", metavar="FILE", help="JSON lines with id and prompt, or one prompt per line "
                                                     "(default: the shipped evaluation prompts)")
    p.add_argument("--limit", type=_positive_int, default=None, help="use only the first N prompts")
    p.add_argument("--max-new-tokens", type=_positive_int, default=128)
    p.add_argument("--repeats", type=_positive_int, default=1, help="runs per prompt and policy; medians are kept")
    p.add_argument("--out", metavar="FILE.jsonl", help="write one JSON line per prompt and policy")
    p.add_argument("--check-lossless", action="store_true",
                   help="exit 1 if any greedy output differs from AR's (AR is added when missing)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation per policy")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    _add_model_args(p)

    p = sub.add_parser("report", help="a self-contained HTML page from a trace or a bench JSONL file")
    p.add_argument("file", metavar="TRACE_OR_BENCH_FILE")
    p.add_argument("--out", metavar="FILE.html", default="report.html")

    p = sub.add_parser("kernels", help="micro-benchmarks of the tree kernels against their oracles")
    p.add_argument("--budgets", default=None, help="comma-separated tree budgets (default 16,32,...,1024)")
    p.add_argument("--repeats", type=_positive_int, default=10, help="timed calls per measurement (median)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=_positive_int, default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    return parser


# ---------------------------------------------------------------------------------------------- commands
def _load_engine(args):
    import workbench as wb

    if bool(args.target) != bool(args.draft):
        raise UsageError("--target and --draft go together: give both model directories, or neither")
    from ddtree_kernels import check_backend
    from workbench.loading import resolve_device, resolve_dtype

    # Check the cheap things before loading any weights.
    check_backend(args.kernel_backend)
    resolve_device(args.device)
    resolve_dtype(args.dtype)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr is for our own progress and errors
    return wb.load(target=args.target, draft=args.draft, device=args.device, dtype=args.dtype,
                   kernel_backend=args.kernel_backend, threads=args.threads)


def cmd_run(args, out, err) -> int:
    from workbench.policies import parse_policy

    policy = parse_policy(args.policy)
    if args.temperature < 0:
        raise UsageError(f"--temperature {args.temperature} must be >= 0")
    if not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p {args.top_p} must be in (0, 1]")
    engine = _load_engine(args)
    s = engine.session(args.prompt, policy=policy, temperature=args.temperature, top_p=args.top_p,
                       top_k=args.top_k, seed=args.seed, max_new_tokens=args.max_new_tokens)
    trace = s.run()
    if args.trace:
        trace.save(args.trace)
    summ = trace.summary()
    if args.json:
        obj = {
            "policy": summ.policy, "text": s.text, "new_tokens": trace.new_tokens, "cycles": summ.cycles,
            "tau": summ.tau, "accept_lengths": trace.accept_lengths, "tokens_per_s": summ.tokens_per_s,
            "stage_seconds": summ.stage_seconds, "prefill_seconds": trace.prefill_seconds,
            "seconds": summ.seconds, "finish_reason": trace.finish_reason, "tokens": s.tokens,
            "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed,
        }
        if args.trace:
            obj["trace"] = str(args.trace)
        print(json.dumps(obj), file=out)
    else:
        print(s.text, file=out)
        print(f"-- {summ}", file=out)
    return 0


def cmd_bench(args, out, err) -> int:
    from workbench.bench import bench, parse_policies, summary_table
    from workbench.prompts import eval_prompts, load_prompts

    policies = parse_policies(args.policies)
    prompts = load_prompts(args.prompts) if args.prompts else eval_prompts()
    if args.limit:
        prompts = prompts[: args.limit]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).open("a").close()  # fail now, not after the run, when the file cannot be written
    engine = _load_engine(args)
    res = bench(engine, policies, prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                check_lossless=args.check_lossless, progress=args.progress, warmup=not args.no_warmup)
    if args.out:
        with open(args.out, "w") as fh:
            for row in res.rows:
                fh.write(json.dumps(row) + "\n")
    if args.json:
        print(json.dumps(res.summary), file=out)
    else:
        st = res.settings
        print(f"{st['prompts']} prompts, {st['max_new_tokens']} new tokens, {st['repeats']} repeat(s), greedy, "
              f"{st['device']}, {st['threads']} threads", file=out)
        print(summary_table(res.summary), file=out)
    if args.check_lossless and res.failures:
        print(f"workbench: {res.failures[0]}" + (f" ({len(res.failures)} outputs differ in all)"
                                                  if len(res.failures) > 1 else ""), file=err)
        return EXIT_FAILED
    return 0


def cmd_kernels(args, out, err) -> int:
    import torch

    from workbench.bench import KERNEL_BUDGETS, kernel_bench, kernel_table

    budgets = KERNEL_BUDGETS
    if args.budgets:
        try:
            budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
        except ValueError:
            raise UsageError(f"--budgets {args.budgets!r}: each budget must be a positive integer") from None
        if not budgets or min(budgets) < 1:
            raise UsageError(f"--budgets {args.budgets!r}: each budget must be a positive integer")
    if args.threads:
        torch.set_num_threads(args.threads)
    res = kernel_bench(budgets, repeats=args.repeats, device=args.device, progress=args.progress)
    print(json.dumps(res) if args.json else kernel_table(res), file=out)
    return 0


def _is_trace(path: Path) -> bool:
    from workbench.cycle import TRACE_FORMAT

    with path.open() as fh:
        first = fh.readline()
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(head, dict) and head.get("format") == TRACE_FORMAT


def read_bench_rows(path: Path) -> list[dict]:
    """The JSON lines of ``bench --out``; ValueError with the line number when a line is not one."""
    rows = []
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{no}: not valid JSON ({e.msg}); expected a trace or a bench --out file") from None
        if not isinstance(row, dict) or not {"policy", "accept_lengths", "stage_seconds"} <= row.keys():
            raise ValueError(f"{path}:{no}: not a bench row (needs policy, accept_lengths, stage_seconds); "
                             "expected a trace or a bench --out file")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} is empty; expected a trace or a bench --out file")
    return rows


def bench_page(rows: list[dict], source: str) -> str:
    """One self-contained HTML page: a summary table and the acceptance / stage-time figures per policy."""
    from workbench.views.export import page
    from workbench.views.figures import acceptance_figure, stage_times_figure

    by: dict[str, dict] = {}
    for r in rows:
        d = by.setdefault(r["policy"], {"accept_lengths": [], "stage_seconds": {}, "new_tokens": 0, "wall_time": 0.0,
                                        "prompts": 0})
        d["accept_lengths"] += list(r["accept_lengths"])
        for k, v in r["stage_seconds"].items():
            d["stage_seconds"][k] = d["stage_seconds"].get(k, 0.0) + float(v)
        d["new_tokens"] += int(r.get("new_tokens", 0))
        d["wall_time"] += float(r.get("wall_time", 0.0))
        d["prompts"] += 1
    ar = by.get("AR")
    ar_tps = ar["new_tokens"] / ar["wall_time"] if ar and ar["wall_time"] else None
    trs = []
    for label, d in by.items():
        al = d["accept_lengths"]
        tau = sum(al) / len(al) if al else 0.0
        tps = d["new_tokens"] / d["wall_time"] if d["wall_time"] else 0.0
        sp = f"{tps / ar_tps:.2f}" if ar_tps else "-"
        trs.append(f"<tr><td>{html.escape(label)}</td><td>{d['prompts']}</td><td>{tau:.2f}</td><td>{tps:.1f}</td>"
                   f"<td>{sp}</td><td>{len(al)}</td></tr>")
    table = ("<table><tr><th>policy</th><th>prompts</th><th>tau</th><th>tokens/s</th><th>speedup vs AR</th>"
             f"<th>cycles</th></tr>{''.join(trs)}</table>")
    data = {k: {"accept_lengths": v["accept_lengths"], "stage_seconds": v["stage_seconds"]} for k, v in by.items()}
    return page(f"workbench bench: {source}", [
        f"<h1>Benchmark: {html.escape(source)}</h1>", table,
        acceptance_figure(data), stage_times_figure(data, per="cycle"), stage_times_figure(data, per="token"),
    ])


def cmd_report(args, out, err) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"report: file '{path}' does not exist")
    dest = Path(args.out)
    if _is_trace(path):
        from workbench.views.report import write_report

        write_report(path, dest)
    else:
        from workbench.views.export import atomic_write_text

        atomic_write_text(dest, bench_page(read_bench_rows(path), path.name))
    print(str(dest), file=out)
    return 0


COMMANDS = {"run": cmd_run, "bench": cmd_bench, "report": cmd_report, "kernels": cmd_kernels}


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
    except (UsageError, ValueError, RuntimeError, OSError) as e:
        if os.environ.get("WORKBENCH_DEBUG"):  # the full traceback, for bug reports
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"workbench: error: {msg}", file=err)
        return EXIT_USAGE
