"""pays-off sizes the calibrated policies per batch size on calibration prompts, never on a measured one."""
from __future__ import annotations

import numpy as np
import pytest

from workbench.calibrate.collect import Cycles
from workbench.calibrate.prompts import calibration_prompts
from workbench.models.identity import pair_identity
from workbench.payoff import measure, pays_off
from workbench.payoff.inputs import PaysOffInputError, check_inputs, fit_to_engine
from workbench.payoff.sizing import MIN_SIZING_PROMPTS, SIZES, calibration_texts, size_policies, sized_shapes
from workbench.shipped import eval_prompts

MEASURED = [p["prompt"] for p in eval_prompts("long")[:10]]


def unit_run() -> measure.UnitRun:
    """A stand-in decode's unit: 30 tokens in 10 forwards and 0.3 s, 3 steps of 20 ms."""
    step = {**dict.fromkeys(("tree_build", "tree_compile", "accept", "record", "other"), 0.0), "draft": 0.005,
            "verify": 0.01, "commit": 0.005}
    return measure.UnitRun(30, 10, 10, 30, 0.3, 1.0, [step] * 3, [[1]])


def recorded_cycles(n: int = 40, depth: int = 15, k: int = 16, seed: int = 0) -> Cycles:
    """Cycles as ``collect`` records them: each slot's top-k log-probs (descending) and ids, the target's rank
    (mostly the top-1, now and then a sibling, sometimes none) and its tokens."""
    rng = np.random.default_rng(seed)
    topv = np.sort(np.log(rng.dirichlet(np.ones(k) * 0.3, size=(n, depth))).astype(np.float32), axis=-1)[..., ::-1]
    topi = np.stack([np.stack([rng.choice(4096, k, replace=False) for _ in range(depth)]) for _ in range(n)])
    ranks = rng.choice([0, 0, 0, 0, 1, 2, k], size=(n, depth))
    target = np.take_along_axis(topi, np.minimum(ranks, k - 1)[..., None], -1)[..., 0]  # [n, depth]
    path = np.concatenate([rng.integers(0, 4096, (n, 1)), np.where(ranks < k, target, -1)], axis=1)
    return Cycles(np.ascontiguousarray(topv), topi.astype(np.int64), ranks, path.astype(np.int64), np.arange(n),
                  0.0, 0)


def recomputed_blocks(n: int = 12, depth: int = 15, k: int = 16, hidden: int = 256, seed: int = 1):
    """Blocks as ``sizing.cond_blocks`` recomputes them for CondTree: random drafter states, each slot's top-k
    and the target's tokens (the recorded cycles' ranks and ids)."""
    import torch

    from workbench.train.cond_data import Blocks

    cyc = recorded_cycles(n, depth, k, seed)
    return Blocks(torch.randn(n, depth, hidden, generator=torch.Generator().manual_seed(seed)).half(),
                  torch.from_numpy(cyc.topv.copy()), torch.from_numpy(cyc.topi), torch.from_numpy(cyc.path),
                  torch.arange(n))


@pytest.fixture
def collected(monkeypatch):
    """collect's stand-in: the prompts it was asked to decode, and recorded cycles in return (and CondTree's
    blocks of their continuations)."""
    seen = []

    def collect(engine, prompts, max_new_tokens, width, progress=None):
        seen.extend(prompts)
        return recorded_cycles()

    monkeypatch.setattr("workbench.calibrate.collect.collect", collect)
    monkeypatch.setattr("workbench.payoff.sizing.cond_blocks", lambda models, sequences, K: recomputed_blocks())
    return seen


def test_a_measured_prompt_among_the_calibration_prompts_is_left_out():
    calib = [p["prompt"] for p in calibration_prompts(12)[0]]
    kept, notes = calibration_texts(MEASURED, calib)  # the calibration's own: none overlaps a measured one
    assert kept == calib and notes == []
    planted = calib[:9] + [MEASURED[3], "x = 1\n" + MEASURED[5] + "\n"]  # one measured, one holding a measured
    kept, notes = calibration_texts(MEASURED, planted)
    assert kept == calib[:9] and notes == [
        "2 calibration prompt(s) left out of the sizing: each equals, lies inside or holds a prompt measured here (a "
        "size is chosen on prompts the run does not measure)"]
    with pytest.raises(PaysOffInputError, match=rf"^7 calibration prompts are apart from the measured ones; sizing the "
                                                rf"calibrated policies needs {MIN_SIZING_PROMPTS}: "):
        calibration_texts(MEASURED, calib[:7] + MEASURED[:3])


def test_sizes_are_chosen_per_batch_on_calibration_prompts_only(engine, collected):
    inp = check_inputs(MEASURED, batch=(1, 8), max_new_tokens=4)
    shapes = fit_to_engine(inp, engine)
    sz = size_policies(engine, shapes, inp.batches, inp.texts)
    assert collected and not set(collected) & set(inp.texts)  # decoded: calibration prompts, none measured
    assert len(collected) == sz.prompts == 32 and sz.cycles == 40 and sz.blocks == 12
    for b in (1, 8):
        for fam, rates in sz.figures[b].items():
            assert list(rates) == list(SIZES) and sz.sizes[b][fam] == max(SIZES, key=lambda n: (rates[n], -n))
    # PairChain's and CondChain's widths are no sizes
    assert set(sz.sizes[8]) == {"path-tree", "cost-tree", "cut-tree", "pair-tree", "cond-tree"}
    # a measured prompt planted in the calibration set is never decoded for the sizing
    collected.clear()
    calib = [p["prompt"] for p in calibration_prompts(9)[0]]
    sz = size_policies(engine, shapes, inp.batches, inp.texts, given=calib + [inp.texts[0]])
    assert collected == calib and len(sz.notes) == 1
    # the sized shapes: each sized family at its batch's size, bound to the pair; the rest as they were
    sized = sized_shapes(shapes, sz, 8, pair_identity(engine.models))
    by_family = {s.family: s.policy for s in sized}
    for fam, n in sz.sizes[8].items():
        p = by_family[fam]
        bound = p.head_data().meta if fam == "cond-tree" else p.calibration_data().__dict__
        assert p.budget == n and bound["pair"]["vocab"] == 4096
    assert str(by_family["pair-chain"]) == "PairChain(8)" and str(by_family["cond-chain"]) == "CondChain(8)"
    assert [s.label for s in sized if s.family in ("ar", "chain", "tree")] == \
        [s.label for s in shapes if s.family in ("ar", "chain", "tree")]


def test_the_default_set_measures_the_sizes_chosen_for_its_batch(engine, collected, monkeypatch):
    decoded = []

    def decode(engine, policy, prompts, *a, **k):
        decoded.append(str(policy))
        return unit_run(), []

    monkeypatch.setattr(measure, "decode_unit", decode)
    res = pays_off(engine, MEASURED, batch=1, max_new_tokens=8, temperature=0.5, warmup=False, progress=False)
    chosen = res.sizing.sizes[1]
    labels = res.settings["shapes_by_batch"]["1"]
    assert f"PathTree({chosen['path-tree']})" in labels and f"PairTree({chosen['pair-tree']})" in labels
    assert f"CondTree({chosen['cond-tree']})" in labels and "CondChain(8)" in labels
    assert set(labels) == set(decoded) and not set(collected) & set(MEASURED)
    assert [c.label for c in res.batches[1].versus_best] == [x for x in labels if x.startswith(
        ("PathTree", "CostTree", "CutTree", "PairTree", "PairChain", "CondTree", "CondChain"))]
    assert f"calibrated sizes at batch 1: PathTree({chosen['path-tree']}), " in str(res)
    assert res.to_dict()["sizing"]["sizes"]["1"] == chosen


def test_named_policies_keep_their_sizes(engine, collected, monkeypatch):
    monkeypatch.setattr(measure, "decode_unit", lambda *a, **k: (unit_run(), []))
    res = pays_off(engine, MEASURED, batch=1, policies="ddtree:8,path:32", max_new_tokens=8, temperature=0.5,
                   warmup=False, progress=False)
    assert res.sizing is None and collected == [] and "PathTree(32)" in res.settings["shapes"]


def test_condtree_is_replayed_on_blocks_rooted_in_the_calibration_decodes_continuations(engine):
    from workbench.engine.policies import DFlash
    from workbench.payoff.sizing import cond_blocks

    s = engine.session("def add(a, b):", policy=DFlash(), max_new_tokens=6)
    s.run()
    ids, n = list(s.prompt_ids) + list(s.generated), len(s.prompt_ids)
    blocks = cond_blocks(engine.models, [(ids, n), (ids, n)], 16, anchors=3)
    assert blocks.hidden.shape[:2] == (6, 15) and blocks.topi.shape == (6, 15, 16)  # 3 roots per decode
    for path in blocks.path.tolist():  # rooted at a generated token (the first cycle's root on): the target's tokens
        assert any(path == (ids[a:] + [-1] * 16)[:16] for a in range(n, len(ids) - 1)), path
    assert cond_blocks(engine.models, [(ids[: n + 1], n)], 16) is None  # one generated token: no cycle drafts
