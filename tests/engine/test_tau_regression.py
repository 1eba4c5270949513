"""Tau regression of the embedded pairs: the per-cycle accept lengths on a fixed prompt set equal the ones in
``tests/data/tau_regression.json`` (float32 on one CPU thread is deterministic), so a drafter-path bug that keeps
the output lossless still fails a test. The file is regenerated after a retraining by
``.venv/bin/python tools/tau_regression.py --write``; it records the weights' fingerprint, and this test fails
(naming that command) when the shipped weights are not the ones it was measured on.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_checks import load_script

ROOT = Path(__file__).resolve().parents[2]


def tool():
    return load_script(ROOT / "tools" / "tau_regression.py", "tau_regression")


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["dense", "hybrid"])
def test_tau_on_fixed_prompts_equals_the_recorded_figures(pair):
    t = tool()
    want = json.loads(t.DATA.read_text())["pairs"][pair]
    assert t.fingerprint(pair) == want["fingerprint"], (
        f"the embedded {pair} pair's weights are not the ones tests/data/tau_regression.json was measured on; "
        f"after a retraining regenerate it: {t.COMMAND}")
    got = t.measure(pair)
    assert got["prompts"] == want["prompts"]
    for policy, rows in want["runs"].items():
        for i, (g, w) in enumerate(zip(got["runs"][policy], rows)):
            assert g["tokens"] == w["tokens"], f"{pair} {policy} prompt {i}: the greedy output changed (the target?)"
            assert g["accept_lengths"] == w["accept_lengths"], (
                f"{pair} {policy} prompt {i}: accept lengths {g['accept_lengths']} != {w['accept_lengths']} "
                f"(tau {t.tau([g]):.3f} vs {t.tau([w]):.3f}): the drafter path changed")
        assert t.tau(got["runs"][policy]) == pytest.approx(t.tau(rows))
    assert t.tau(want["runs"]["DDTree(8)"]) > 1.3, "the recorded figures are of a drafter that is no help"
