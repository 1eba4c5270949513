"""``bench --out FILE`` writes its rows where plotly (the notebook stack) is not installed: the CLI's file
writes come from the records floor, not from the views (whose package imports plotly)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
sys.modules["plotly"] = None  # as if plotly were not installed: any import of it raises ImportError
from workbench.cli import main
raise SystemExit(main(["bench", "--policies", "ar,ddtree:4", "--limit", "1", "--max-new-tokens", "4",
                       "--threads", "1", "--out", sys.argv[1]]))
"""


def test_bench_out_without_plotly_writes_every_row(tmp_path):
    out = tmp_path / "rows.jsonl"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = out.read_text().splitlines()
    assert len(rows) == 2 and all(row.startswith("{") for row in rows)  # one row per policy
