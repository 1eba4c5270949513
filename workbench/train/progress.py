"""The training run's progress lines on stderr (stdout carries only the report's JSON, which the tests read)."""
from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
