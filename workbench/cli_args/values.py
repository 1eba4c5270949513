"""The command line's value parsers, beside validation (``workbench.engine.validate``): the argparse types and
output checks every command module takes, and the error that means "bad input".

A ``UsageError`` (or a ValueError, the Python API's refusal) is printed by ``workbench.cli.main`` as one line on
stderr with exit code 2: the one place that convention is written.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

EXIT_FAILED = 1  # the command ran, but what it checks failed (a lossless check, a broken contract)


class UsageError(Exception):
    """Bad input on the command line: one line naming the value and the fix (exit code 2)."""


def int_at_least(low: int, what: str):
    """An argparse type: an integer >= ``low``; the refusal says which kind of integer (``what``)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what} integer")
        return v

    return parse


positive_int = int_at_least(1, "positive")
non_negative_int = int_at_least(0, "non-negative")


def device(text: str) -> str:
    """cpu, cuda or cuda:N; anything else (tpu, meta, mps, ...) is refused before any model loads."""
    from workbench.engine.validate import device as check

    t = text.strip().lower()
    try:
        return check(t)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def finite_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return v


def check_output(path: str, option: str) -> Path:
    """Refuse an output path that cannot be written, before any model loads (the message names it; a missing
    folder is refused, never created)."""
    from workbench.engine.validate import output_path

    try:
        return output_path(path, option)
    except ValueError as e:
        raise UsageError(str(e)) from None


def progress(args) -> bool:
    """Long work shows progress on stderr by default, a terminal or not (a log, a notebook's !cell);
    ``--no-progress`` or ``--quiet`` silence it."""
    return bool(args.progress) and not args.quiet
