"""``python -m workbench report``: a self-contained HTML page (``workbench.views.report``) from a trace
(``run --trace``) or a bench's rows (``bench --out``). A file that is neither, or a damaged one, is one line
naming the file and line (exit 2), before any page is written.

Why here and not in ``workbench/views/``: importing any module of the views package runs its ``__init__``,
which imports plotly and ipywidgets; the command line builds every command's parser on every call, so a
command module inside views would make every command (``run`` and ``bench`` too) need the notebook stack and
pay for importing it. This module is its own room on the floor above the views (``tools/import_graph.py``)
and imports ``workbench.views.report`` only when a page is written."""
from __future__ import annotations

import json
import math
from pathlib import Path

from workbench.cli_args.values import UsageError, check_output


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="a self-contained HTML page from a trace or a bench JSONL file")
    p.add_argument("file", metavar="TRACE_OR_BENCH_FILE", help="a trace (run --trace) or a bench --out file")
    p.add_argument("--out", metavar="FILE.html", default="report.html", help="the page to write (default report.html)")
    p.add_argument("--target", metavar="DIR", default=None,
                   help="model directory whose tokenizer shows token text (default: the trace's own target)")


def is_trace(path: Path) -> bool:
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
        problem = bench_row_problem(row)
        if problem:
            raise ValueError(f"{path}:{no}: damaged bench row: {problem}; expected a bench --out file")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} is empty; expected a trace or a bench --out file")
    return rows


def bench_row_problem(row: dict) -> str | None:
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


def run(args, out, err) -> int:
    path = Path(args.file)
    if path.is_dir():
        raise UsageError(f"report: '{path}' is a directory; give a trace or a bench --out file")
    if not path.is_file():
        raise UsageError(f"report: file '{path}' does not exist")
    dest = check_output(args.out, "--out")
    if args.target and not Path(args.target).is_dir():
        raise UsageError(f"--target '{args.target}' is not a directory; give the model directory with the tokenizer")
    if is_trace(path):
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


