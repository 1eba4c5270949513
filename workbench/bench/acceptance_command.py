"""``python -m workbench acceptance FILE [FILE ...]``: per-request acceptance of saved runs, in AIPerf's record
shape and as ``vllm bench serve`` and SGLang report it (``workbench.analysis.acceptance``).

A FILE is a saved trace (``trace.save(...)``, ``run --trace``) or a cycle dump (``session(..., dump=...)``, vLLM's
adapter, the SGLang converters). Text by default: one row per request (steps, mean acceptance length, draft
acceptance rate, SGLang's spec_accept_length, the histogram), then the run pooled under vllm bench serve's names;
``--json``: one object (``records``: AIPerf's fields per request with its id, ``pooled``, ``bench_serve``).
Exit 2 with one line on stderr, before anything is printed: a file that is neither, a dump whose records lack the
accepted path, a dump or trace without a cycle, a dump whose last line is cut short (``--whole-only`` reads its
whole cycles and says so), a file given twice or a run given twice (its trace and its dump: the same steps), and
files of two pairs (each pair's runs are reported apart).
"""
from __future__ import annotations

import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("acceptance", help="per-request acceptance of a saved trace or cycle dump, in AIPerf's record "
                                          "shape and vllm bench serve's / SGLang's names")
    p.add_argument("files", nargs="+", metavar="FILE", help="a saved trace (.trace.jsonl) or a cycle dump")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--whole-only", action="store_true",
                   help="a dump whose last line is cut short (the run stopped mid-record): report its whole cycles, "
                        "and say so, instead of refusing it")


def read_source(path: str):
    """A file as ``acceptance`` takes it: a cycle dump as ``read_dump`` returns it, or a loaded trace. Neither:
    one line naming the file and both readers' reasons."""
    from workbench.analysis.acceptance import AcceptanceError
    from workbench.conform.dump import DumpFileError, read_dump
    from workbench.records.cycle import Trace, TraceFileError

    if not Path(path).exists():
        raise AcceptanceError(f"{path}: no such file: give a saved trace or a cycle dump")
    try:
        return read_dump(path)
    except DumpFileError as as_dump:
        try:
            return Trace.load(path)
        except TraceFileError as as_trace:
            if "not a ddtree-workbench trace" not in str(as_trace):  # a trace, damaged: its own words
                raise
            why = " ".join(str(as_dump).split())[:120]
            raise AcceptanceError(f"{path} is neither a cycle dump ({why}) nor a saved trace: give a file written by "
                                  "session(..., dump=...) or trace.save(...)") from None


def run(args, out, err) -> int:
    import os

    from workbench.analysis.acceptance import AcceptanceError, acceptance, pool

    parts = []
    for i, path in enumerate(args.files):
        again = next((p for p in args.files[:i] if os.path.exists(p) and os.path.exists(path)
                      and os.path.samefile(p, path)), None)
        if again is not None:
            raise AcceptanceError(f"{path} is given twice{'' if again == path else f' (as {again})'}: a copy is no new sample; give each file once")
        try:
            acc = acceptance(read_source(path), whole_only=args.whole_only)
        except AcceptanceError as e:
            if str(path) in str(e):
                raise
            raise AcceptanceError(f"{path}: {e}") from None
        parts.append((path, acc))
    merged = pool(parts, by_source=len(parts) > 1)  # several files: each request named by its file
    print(json.dumps(merged.to_dict()) if args.json else str(merged), file=out)
    return 0
