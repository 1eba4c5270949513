"""``python -m workbench sweep``: the measured verify/draft forward sweep beside the cost model's prediction,
a saved sweep read back (``--from``), or the cost model's TP1/4/8 table (``--tp-table``).

``add_parser(sub)`` registers the command and its options; ``run(args, out, err)`` runs it. Every input it
cannot use is one line (exit 2) before any weight is built: an option this invocation would ignore, a config
the cost model cannot read or a drafter that does not fit (``workbench.bench.random_models``), a file that is
not a saved sweep (``workbench.bench.sweep.load``).
"""
from __future__ import annotations

import json

import torch

from workbench.bench.random_models import random_models
from workbench.bench.sweep import CPU_NODES, CPU_ROWS, NODES, ROWS, SweepInputError, load, save, sweep


def _ints(text: str, what: str) -> list[int]:
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{what} {text!r} must be comma-separated whole numbers, e.g. 1,4,16") from None
    if not xs or any(x < 1 for x in xs):
        raise ValueError(f"--{what} {text!r}: each must be 1 or more")
    return xs


# the options that choose or shape a measurement: --from (reads one) and --tp-table (measures nothing) use none
MEASURING = ("pair", "config", "draft_config", "layers", "draft_layers", "device", "dtype", "nodes", "rows", "context",
             "repeats", "warmup", "graphs", "no_draft", "threads", "seed", "save")


def add_parser(sub):
    """``python -m workbench sweep`` and its options (registered by workbench.cli). -> the parser."""
    from workbench.engine.validate import as_arg, threads

    p = sub.add_parser("sweep", help="the measured verify/draft forward sweep beside the cost model; --tp-table")
    p.add_argument("--pair", default=None, help="an embedded pair: 'embedded' (the default dense pair) or 'hybrid'")
    p.add_argument("--config", default=None, help="a shipped target config (e.g. qwen3-8b) built with random weights")
    p.add_argument("--draft-config", default="qwen3-8b-dflash-b16", help="the drafter's config with --config")
    p.add_argument("--layers", type=int, default=None, help="cut the target to this many layers (--config)")
    p.add_argument("--draft-layers", type=int, default=None, help="cut the drafter to this many layers (--config)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default=None, help="default: float32 on a CPU (its bf16 GEMV is slow), bfloat16 on CUDA")
    p.add_argument("--nodes", default=None, help=f"tree nodes per row (default {','.join(map(str, NODES))}; "
                   f"CPU with --config: {','.join(map(str, CPU_NODES))})")
    p.add_argument("--rows", default=None, help=f"rows (default {','.join(map(str, ROWS))}; CPU with --config: "
                   f"{','.join(map(str, CPU_ROWS))})")
    p.add_argument("--context", type=int, default=512, help="committed tokens per row (default 512)")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per point, interleaved (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per point first (default 2)")
    p.add_argument("--graphs", action="store_true", help="also replay each point from a CUDA graph (CUDA only)")
    p.add_argument("--no-draft", action="store_true", help="time the verify forward only")
    p.add_argument("--threads", type=as_arg(threads), default=None, help="CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default 0)")
    p.add_argument("--save", metavar="FILE", help="write the sweep as JSON to FILE (read it back with --from)")
    p.add_argument("--from", dest="from_file", metavar="FILE", help="a saved sweep: print it and the model's error, "
                   "measure nothing")
    p.add_argument("--tp-table", action="store_true", help="print the TP1/4/8 verify table for the shipped "
                   "configs (cost model only) and exit")
    p.add_argument("--batch", type=int, default=1, help="batch of the --tp-table (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def unused_options(args) -> list[str]:
    """The options given (set away from their defaults) that this invocation would not use, as spelt on the
    command line: measuring options beside --from or --tp-table, --from beside --tp-table, --batch without it."""
    import argparse

    defaults = add_parser(argparse.ArgumentParser().add_subparsers())
    given = [d for d in (*MEASURING, "from_file", "batch") if getattr(args, d) != defaults.get_default(d)]
    if args.tp_table:
        used = {"batch"}
    elif args.from_file:
        used = {"from_file"}
    else:
        used = {*MEASURING}
    spell = {"from_file": "--from"}
    return [spell.get(d, "--" + d.replace("_", "-")) for d in given if d not in used]


def _models_for(args):
    if args.config and args.pair:
        raise ValueError("--config (random weights) and --pair (an embedded checkpoint) exclude each other")
    nodes = _ints(args.nodes, "nodes") if args.nodes else None
    rows = _ints(args.rows, "rows") if args.rows else None
    dev = torch.device(args.device)
    if args.config:
        dtype = args.dtype or ("bfloat16" if dev.type == "cuda" else "float32")
        nodes = nodes or list(NODES if dev.type == "cuda" else CPU_NODES)
        rows = rows or list(ROWS if dev.type == "cuda" else CPU_ROWS)
        m = random_models(args.config, args.draft_config, args.device, dtype, args.layers, args.draft_layers,
                          args.seed, max(rows), max(nodes), args.context)
        return m, nodes, rows
    from workbench.engine.core import load as load_engine

    if args.layers or args.draft_layers:
        raise ValueError("--layers / --draft-layers cut a random-weight --config; an embedded pair runs whole")
    target = "hybrid" if args.pair == "hybrid" else None
    if args.pair not in (None, "embedded", "hybrid"):
        raise ValueError(f"--pair {args.pair!r} must be 'embedded' or 'hybrid'")
    eng = load_engine(target=target, device=args.device, dtype=args.dtype or "auto")
    return eng.models, nodes or list(NODES), rows or list(ROWS)


def run(args, out, err) -> int:
    """``python -m workbench sweep``: the measured sweep beside the cost model's prediction, or the TP table."""
    from workbench.shapes.measured import sweep_error

    unused = unused_options(args)
    if unused:  # said now: silently ignored, an option reads as applied to what is printed
        mode = "--tp-table (the cost model's table)" if args.tp_table else (
            "--from (a saved sweep)" if args.from_file else "a measured sweep")
        hint = " (--batch sizes the --tp-table; a measured sweep's batches are --rows)" \
            if "--batch" in unused and not args.tp_table else ""
        raise SweepInputError(f"{', '.join(unused)} would be ignored by {mode}: drop "
                              f"{'it' if len(unused) == 1 else 'them'}{hint}")
    if args.tp_table:
        from workbench.shapes.parallel_table import parallelism_table

        t = parallelism_table(batch=args.batch)
        print(json.dumps(t.as_dict()) if args.json else repr(t), file=out)
        return 0
    if args.from_file:
        s = load(args.from_file)
    else:
        for v, what, least in ((args.context, "context", 1), (args.repeats, "repeats", 1), (args.warmup, "warmup", 0)):
            if v < least:
                raise ValueError(f"--{what} {v} must be at least {least}")
        if args.save:
            from workbench.engine.validate import output_path

            output_path(args.save, "--save")
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        m, nodes, rows = _models_for(args)
        s = sweep(m, nodes, rows, args.context, args.repeats, args.warmup, args.graphs, not args.no_draft, args.seed,
                  progress=lambda msg: print(f"sweep: {msg}", file=err, flush=True))
        if args.save:
            save(s, args.save)
    e = sweep_error(s)
    if args.json:
        print(json.dumps({"sweep": s.as_dict(), "model_error": e.as_dict()}), file=out)
    else:
        print(s.table(), file=out)
        print(repr(e), file=out)
    return 0
