"""``wb.compare`` localises a fault it was not told of: with vLLM's two known losses worked
around, a third fault planted here (test-only: the drafter's block positions shifted by one) must be named by
the report as the drafter input that differs, and by nothing downstream of it. vLLM 0.32 CPU."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import workbench as wb

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["def parse(line):\n    ", "class Stack:\n    def __init__(self):\n", "import os\n\n\ndef main():\n",
           "def test_add():\n    assert"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tests"))
    from vllm_pairs import last_layer_pair

    return last_layer_pair(tmp_path_factory.mktemp("pair"))


def test_the_report_names_shifted_block_positions_as_the_drafter_input_that_differs(pair, monkeypatch):
    sys.path.insert(0, str(ROOT / "tests" / "conform"))
    from faults import vllm_block_positions_shifted

    t, d = pair
    vllm_block_positions_shifted(monkeypatch)
    r = wb.compare(str(t), str(d), PROMPTS[:2], max_new_tokens=12, repeats=1, workarounds=True)
    assert set(r.lossless.values()) == {"2/2 prompts"}  # lossless: nothing in the outputs shows the fault
    same, total = r.same_drafts
    assert total > 0 and same < total
    div = r.divergence
    inputs = {i["input"]: i for i in div.inputs}
    assert set(inputs) == {"context tokens", "context positions", "block tokens", "block positions"}
    bad = [n for n, i in inputs.items() if not i["equal"]]
    assert bad == ["block positions"], div.inputs
    start = div.position
    assert inputs["block positions"]["first"].startswith(f"slot 0: production {start + 1}, reference {start}")
    assert all(i["compared"] > 0 for i in inputs.values())
    # the features are the reference's, and every layer on vLLM's own inputs (positions too) computes as ours
    assert div.chunks and all(c["equal"] for c in div.chunks), div.chunks
    assert div.layers and all(v < 1e-4 for lay in div.layers for v in (lay["attention"], lay["mlp"])), div.layers
    assert div.layers_on_reference == []  # the layers ran on vLLM's own positions, the shifted ones included
    verdict = div.verdict()
    assert len(verdict) == 1 and verdict[0].startswith("drafter input 'block positions' differs"), verdict
    text = str(r)
    table = text[text.index("drafter input "):]
    assert "block positions" in table.splitlines()[4] and "verdict:\n  - drafter input 'block positions'" in text
