"""The vLLM adapter's dump says whether its target is hybrid, as the workbench's own dump does: a checker refuses
a header that disagrees with the target (``workbench.conform.check``), so a hard-coded "attention-only" would
have it refuse every valid dump of a hybrid vLLM target."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from workbench.conform.dump import read_dump
from workbench.conform.vllm_dump import VllmDump
from workbench.shipped import ASSETS


@pytest.mark.parametrize("pair,hybrid", [("", False), ("hybrid", True)])
def test_the_header_says_hybrid_for_a_hybrid_target(tmp_path, pair, hybrid):
    root = ASSETS / pair if pair else ASSETS
    engine = SimpleNamespace(target_dir=root / "target", draft_dir=root / "draft", block_size=16, dtype="float32",
                             device="cpu", version="0.0-test", patches=[], num_speculative_tokens=15)
    session = SimpleNamespace(policy="DFlash", request_id="0", prompt_ids=[1, 2, 3], generated=[4],
                              max_new_tokens=8)
    d = VllmDump(engine, session, tmp_path / "v.dump")
    d.writer.close()
    header, _ = read_dump(tmp_path / "v.dump")
    assert header["pair"]["hybrid"] is hybrid
