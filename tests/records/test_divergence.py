"""wb.first_divergence: where two runs first differ, and whether a near-tie explains it.

Crafted traces pin each cause; real CPU runs of a tiny pair in float32 and bfloat16 give real
near-ties; the same engine in float32 never diverges (greedy speculative decoding is lossless).
"""
from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch

import workbench as wb
from workbench.records.divergence import near_tie_tolerance, output_with_top2

PAIR = "l4-h32"


def prompts(n=12, seed=0):
    rng = random.Random(seed)
    return [" ".join(f"t{rng.randrange(60)}" for _ in range(5)) for _ in range(n)]


@pytest.fixture(scope="module")
def fp32(tiny_engines):
    return tiny_engines[PAIR]


@pytest.fixture(scope="module")
def bf16(tiny_pairs):
    t, d = tiny_pairs[PAIR]
    return wb.load(target=t, draft=d, dtype="bfloat16", threads=1)


@pytest.fixture(scope="module")
def ar_trace(fp32):
    return fp32.generate(prompts()[0], wb.AR(), max_new_tokens=12)


def test_recorded_top2_holds_the_targets_choice(fp32):
    t = fp32.generate(prompts()[1], wb.DDTree(8), max_new_tokens=24)
    for c in t:
        assert c.target_top2_tokens.shape == (c.tokens.shape[0], 2) and c.target_top2_tokens.dtype == torch.long
        assert torch.all(c.target_top2_logits[:, 0] >= c.target_top2_logits[:, 1])
        picked = (c.target_top2_tokens == c.target_choice[:, None]).any(-1)
        assert picked.all()  # greedy: the choice is one of the top 2 (the first, unless exactly tied)
    assert len(t.meta["prefill_top2"]["tokens"]) == 2
    toks, where = output_with_top2(t)
    assert len(toks) == len(where) == t.new_tokens and where[0][0] == "prefill"
    assert toks[0] in t.meta["prefill_top2"]["tokens"]


def test_equal_runs_have_no_divergence(fp32):
    for p in prompts()[:4]:
        a = fp32.session(p, policy=wb.AR(), max_new_tokens=30)
        a.run()
        b = fp32.session(p, policy=wb.DDTree(8), max_new_tokens=30)
        b.run()
        assert a.tokens == b.tokens and wb.first_divergence(a, b) is None


def test_float32_vs_bfloat16_divergences_are_near_ties(fp32, bf16):
    """Real runs: every prompt where bf16 DDTree and fp32 AR differ differs first at a near-tie
    (the first three such prompts: bfloat16 on a CPU is slow)."""
    diverged = 0
    for p in prompts():
        if diverged == 3:
            break
        a = fp32.session(p, policy=wb.AR(), max_new_tokens=40)
        a.run()
        b = bf16.session(p, policy=wb.DDTree(8), max_new_tokens=40)
        b.run()
        d = wb.first_divergence(b, a)
        if a.tokens == b.tokens:
            assert d is None
            continue
        diverged += 1
        i = next(k for k in range(len(a.tokens)) if a.tokens[k] != b.tokens[k])
        assert d.position == i and a.tokens[:i] == b.tokens[:i]
        assert (d.a.token, d.b.token) == (b.tokens[i], a.tokens[i])
        assert d.a.dtype == "bfloat16" and d.b.dtype == "float32" and "bfloat16" in d.a.label
        assert d.near_tie, d
        assert d.a.top2.margin <= near_tie_tolerance("bfloat16", max(map(abs, d.a.top2.logits))) + 1e-9
    assert diverged, "no prompt diverged between float32 and bfloat16; the real near-tie test needs one"


def _craft(trace, k, tokens, logits, dtype=None, cut=True, temperature=None):
    """A copy of an AR trace whose cycle k emitted tokens[0] with the given top-2 (and ends there)."""
    cycles = list(trace.cycles[: k + 1] if cut else trace.cycles)
    c = cycles[k]
    choice = c.target_choice.clone()
    choice[c.accepted_nodes[-1]] = tokens[0]  # the bonus is the target's choice at the last accepted node
    cycles[k] = dataclasses.replace(c, bonus=tokens[0], target_choice=choice,
                                    target_top2_tokens=torch.tensor([list(tokens)]),
                                    target_top2_logits=torch.tensor([list(logits)]))
    meta = dict(trace.meta)
    if dtype:
        meta["dtype"] = dtype
    if temperature is not None:
        meta["temperature"] = temperature
    return dataclasses.replace(trace, meta=meta, cycles=cycles)


def test_crafted_near_tie(ar_trace):
    a = _craft(ar_trace, 3, (7, 9), (10.03, 10.0))
    b = _craft(ar_trace, 3, (9, 7), (10.02, 10.0), dtype="bfloat16")
    d = wb.first_divergence(a, b)
    assert d.position == 4 and d.prompt_tokens == len(ar_trace.meta["prompt_ids"])
    assert (d.a.token, d.b.token) == (7, 9) and d.a.where == "cycle 3, node 0"
    assert d.kind == "near-tie" and d.near_tie
    assert d.cause.startswith("near-tie: margin 0.03 in float32 (margins 0.03 (float32) and 0.02 (bfloat16)")
    assert "bfloat16 numerics can flip" in d.cause
    r = repr(d)
    assert r.startswith("Divergence(token 4 (position ") and "chose 7 (10.03) over 9 (10), margin 0.03" in r
    assert "\n" not in r and len(r) < 400
    # The same margins are no near-tie in float32 alone, nor under a tighter tolerance.
    b32 = _craft(ar_trace, 3, (9, 7), (10.02, 10.0))
    assert wb.first_divergence(a, b32).kind == "not a near-tie"
    assert wb.first_divergence(a, b, tolerance=0.01).kind == "not a near-tie"
    assert "not a near-tie: margin 0.03" in wb.first_divergence(a, b, tolerance=0.01).cause


def test_crafted_clear_preferences_are_not_near_ties(ar_trace):
    a = _craft(ar_trace, 2, (7, 9), (13.0, 10.0))
    b = _craft(ar_trace, 2, (9, 7), (12.5, 10.0), dtype="bfloat16")
    d = wb.first_divergence(a, b)
    assert d.kind == "not a near-tie" and not d.near_tie and "margin 3 in float32" in d.cause
    c = _craft(ar_trace, 2, (9, 5), (14.0, 10.0), dtype="bfloat16")  # does not even rank 7 second
    d = wb.first_divergence(a, c)
    assert d.kind == "not a near-tie" and "does not rank 7 in its top 2" in d.cause
    e = _craft(ar_trace, 2, (9, 5), (10.01, 10.0), dtype="bfloat16")
    f = _craft(ar_trace, 2, (7, 5), (10.02, 10.0))
    assert wb.first_divergence(f, e).kind == "near-tie (3+ tokens)"


def test_other_causes(ar_trace):
    a = _craft(ar_trace, 3, (7, 9), (10.03, 10.0))
    shorter = dataclasses.replace(ar_trace, cycles=ar_trace.cycles[:2])
    d = wb.first_divergence(ar_trace, shorter)
    assert d.kind == "ended" and d.b.token is None and d.position == 3 and "ended first" in d.cause
    sampled = _craft(ar_trace, 3, (9, 7), (10.5, 10.0), temperature=0.8)
    assert wb.first_divergence(a, sampled).kind == "sampled"
    old = _craft(ar_trace, 3, (9, 7), (10.5, 10.0))
    old.cycles[3] = dataclasses.replace(old.cycles[3], target_top2_tokens=None, target_top2_logits=None)
    assert wb.first_divergence(a, old).kind == "unknown"
    other = dataclasses.replace(ar_trace, meta={**ar_trace.meta, "prompt_ids": [1, 2]})
    with pytest.raises(ValueError, match="different prompts"):
        wb.first_divergence(ar_trace, other)
    with pytest.raises(TypeError, match="give a wb.Trace"):
        wb.first_divergence(ar_trace, [1, 2])
    assert wb.first_divergence(ar_trace, ar_trace) is None


def test_top2_survives_save_and_load_and_old_files_still_load(ar_trace, tmp_path):
    a = _craft(ar_trace, 3, (7, 9), (10.03, 10.0))
    b = _craft(ar_trace, 3, (9, 7), (10.02, 10.0), dtype="bfloat16")
    la, lb = wb.Trace.load(a.save(tmp_path / "a.jsonl")), wb.Trace.load(b.save(tmp_path / "b.jsonl"))
    assert torch.equal(la.cycles[0].target_top2_tokens, a.cycles[0].target_top2_tokens)
    assert torch.equal(la.cycles[0].target_top2_logits, a.cycles[0].target_top2_logits)
    assert repr(wb.first_divergence(la, lb)) == repr(wb.first_divergence(a, b))
    # A trace written before the top-2 fields existed: they load as None.
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    for i in range(1, len(lines) - 1):
        c = json.loads(lines[i])
        del c["target_top2_tokens"], c["target_top2_logits"]
        lines[i] = json.dumps(c)
    (tmp_path / "old.jsonl").write_text("\n".join(lines) + "\n")
    old = wb.Trace.load(tmp_path / "old.jsonl")
    assert old.cycles[0].target_top2_tokens is None
    assert wb.first_divergence(old, lb).kind == "unknown"


def test_tokenizer_text_in_the_repr(fp32, ar_trace):
    a = _craft(ar_trace, 1, (7, 9), (10.03, 10.0))
    b = _craft(ar_trace, 1, (9, 7), (10.02, 10.0), dtype="bfloat16")
    assert "chose 7 't7'" in repr(wb.first_divergence(a, b, tokenizer=fp32.tokenizer))
