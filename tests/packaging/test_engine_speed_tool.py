"""tools/engine_speed.py: its arithmetic on made-up rounds, and its refusals before any work (never timed here)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("engine_speed", ROOT / "tools" / "engine_speed.py")
es = importlib.util.module_from_spec(spec)
spec.loader.exec_module(es)


def _rounds(speed_of_prompt, rounds=3, same=True):
    """Rounds in which prompt i's reference takes 1 s and the engine 1 / speed_of_prompt(i) s, every budget."""
    return [{str(b): [{"engine": 1.0 / speed_of_prompt(i), "reference": 1.0, "same": same, "tokens": 64}
                      for i in range(12)] for b in es.BUDGETS} for _ in range(rounds)]


def test_report_gives_each_side_s_speed_the_paired_ratio_and_a_p_value():
    before = _rounds(lambda i: 1.0 + 0.01 * i)
    after = _rounds(lambda i: 1.2 + 0.01 * i + 0.001 * i * i)
    out = es.report(before, after).splitlines()
    row = next(line for line in out if line.startswith("16 "))
    assert "1.055" in row  # before: median over prompts 1.00-1.11
    cells = row.split()
    ratio, p = float(cells[-3]), float(cells[-2])
    assert 1.21 < ratio < 1.23 and p < 0.01 and cells[-1] == "yes"


def test_report_says_when_any_run_decoded_other_tokens():
    out = es.report(_rounds(lambda i: 1.0), _rounds(lambda i: 1.1, same=False))
    assert all(line.endswith("NO") for line in out.splitlines() if line[:2] in ("16", "32", "64"))


def test_no_difference_is_p_1_not_an_error():
    out = es.report(_rounds(lambda i: 1.0), _rounds(lambda i: 1.0))
    assert " 1.000  yes" in out


def test_a_bad_commit_and_a_busy_machine_are_refused_in_one_line(monkeypatch):
    with pytest.raises(SystemExit, match="'no-such-commit' is not a commit here"):
        es.main(["no-such-commit", "HEAD"])
    monkeypatch.setattr(es.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    with pytest.raises(SystemExit, match=r"busy \(load 3.00 > 0.5\).*--busy-ok"):
        es.main(["HEAD", "HEAD"])
    with pytest.raises(SystemExit, match="--rounds 0"):
        es.main(["HEAD", "HEAD", "--rounds", "0"])
