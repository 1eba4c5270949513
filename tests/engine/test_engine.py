"""The engine's correctness properties: lossless greedy, lossless sampling, exact KV cache."""
from __future__ import annotations

import itertools

import pytest
import torch

import workbench as wb
from ddtree_kernels import accept, compile_tree
from ddtree_kernels.tree_build import Tree
from shared_checks import assert_sampling_law
from workbench.bench.policy_bench import first_difference
from workbench.records.cycle import STAGES

BUDGETS = [1, 2, 8, 32, 128]


def greedy_ids(engine, prompt, policy, n, **kw):
    s = engine.session(prompt, policy=policy, max_new_tokens=n, **kw)
    s.run()
    return s.tokens, s


def tiny_prompts(engine, k: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    V = len(engine.tokenizer) - 2
    out = []
    for _ in range(k):
        length = int(torch.randint(1, 12, (1,), generator=g))
        out.append(" ".join(f"t{int(t)}" for t in torch.randint(0, V, (length,), generator=g)))
    return out


@pytest.mark.parametrize("shape", ["l4-h32", "l3-h48-b5", "l6-h32-d2"])
def test_greedy_speculative_equals_ar_on_random_models(tiny_engines, shape):
    engine = tiny_engines[shape]
    for seed, prompt in enumerate(tiny_prompts(engine, 4, seed=hash(shape) % 1000)):
        ref, _ = greedy_ids(engine, prompt, wb.AR(), 40, seed=seed)
        for policy in [wb.DFlash()] + [wb.DDTree(b) for b in BUDGETS]:
            got, _ = greedy_ids(engine, prompt, policy, 40, seed=seed)
            assert got == ref, f"{shape} {policy} prompt {prompt!r}"


@pytest.mark.slow
def test_greedy_speculative_equals_ar_on_embedded_default(engine, eval_prompts):
    for item in eval_prompts[:6]:
        ref, _ = greedy_ids(engine, item["prompt"], wb.AR(), 48)
        for policy in [wb.DFlash()] + [wb.DDTree(b) for b in BUDGETS]:
            got, s = greedy_ids(engine, item["prompt"], policy, 48)
            assert got == ref, f"{policy} on {item['id']}: first difference at {first_difference(ref, got)}"


def test_embedded_drafter_is_useful(engine, eval_prompts):
    """Sanity of the shipped models: drafts are accepted and trees beat chains (not noise)."""
    taus = {}
    for policy in [wb.DFlash(), wb.DDTree(32)]:
        t = [engine.generate(p["prompt"], policy, max_new_tokens=48).tau for p in eval_prompts[:6]]
        taus[str(policy)] = sum(t) / len(t)
    assert taus["DFlash"] > 1.5, taus  # random drafts give 1.0
    assert taus["DDTree(32)"] > taus["DFlash"], taus


@pytest.mark.parametrize("shape", ["l4-h32", "l6-h32-d2"])
def test_chain_shaped_ddtree_reproduces_dflash_cycle_for_cycle(tiny_engines, engine, shape):
    for eng in (tiny_engines[shape], engine):
        B = eng.models.block_size
        prompt = "def parse(line):\n    " if eng is engine else "t1 t2 t3"
        a = eng.session(prompt, policy=wb.DFlash(), max_new_tokens=48)
        b = eng.session(prompt, policy=wb.DDTree(budget=B - 1, width=1), max_new_tokens=48)
        a.run(), b.run()
        assert len(a.cycles) == len(b.cycles)
        for ca, cb in zip(a.cycles, b.cycles):
            for field in ("tokens", "parents", "depth", "position_ids", "visibility", "target_choice",
                          "accepted_nodes", "accepted_tokens"):
                assert torch.equal(getattr(ca, field), getattr(cb, field)), (shape, ca.index, field)
            assert ca.bonus == cb.bonus


def plain_cache(engine, ids):
    """The cache that plain decoding of ``ids`` builds (one prefill: the same keys/values as step by step)."""
    from transformers import DynamicCache

    m = engine.models
    cache = DynamicCache(config=m.target.config)
    with torch.inference_mode():
        m.target(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize("policy", [wb.DFlash(), wb.DDTree(8), wb.DDTree(64)])
def test_kv_cache_after_every_cycle_equals_plain_decoding(engine, policy):
    s = engine.session("class Parser:\n    def __init__(self", policy=policy, max_new_tokens=40)
    while not s.finished:
        s.step()
        committed = s.prompt_ids + s.tokens[:-1]  # the pending bonus is not in the cache yet
        ref = plain_cache(engine, committed)
        got = s.kv_cache()
        assert got[0][0].shape[2] == len(committed) == s.start
        for (k, v), (rk, rv) in zip(got, ref):
            torch.testing.assert_close(k, rk, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(v, rv, atol=2e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def sampling_engine(tmp_path_factory):
    from tiny_models import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("vocab6"), vocab=6, hidden=16, layers=2, layer_ids=(0, 1),
                     block_size=4, init_std=0.3, seed=3, eos=False)
    return wb.load(target=t, draft=d)


@pytest.mark.parametrize("policy,sampling", [
    (wb.DDTree(4), dict(temperature=1.0)),
    (wb.DFlash(), dict(temperature=0.8, top_k=4)),
    (wb.DDTree(6), dict(temperature=1.2, top_p=0.9)),
])
@pytest.mark.slow
def test_sampling_is_lossless_first_three_tokens(sampling_engine, policy, sampling):
    """The joint law of the first three generated tokens equals the target's (chi-square, fixed seeds).

    Token 1 comes from the prefill; tokens 2-3 come from drafted nodes the target verified
    (every cycle checks that at least some were accepted), so the verify path is exercised.
    """
    assert_sampling_law(sampling_engine, "t1 t3 t2", policy, sampling, n=800)


def test_sampling_same_seed_same_trace(engine):
    kw = dict(policy=wb.DDTree(16), temperature=0.9, top_p=0.95, max_new_tokens=32)
    a = engine.session("import os\n", seed=7, **kw)
    b = engine.session("import os\n", seed=7, **kw)
    c = engine.session("import os\n", seed=8, **kw)
    a.run(), b.run(), c.run()
    assert a.tokens == b.tokens
    assert [x.target_choice.tolist() for x in a.cycles] == [x.target_choice.tolist() for x in b.cycles]
    assert a.tokens != c.tokens


def test_sessions_are_independent(engine):
    p1, p2 = "def read(path):\n    ", "class Stack:\n    "
    ref1 = engine.session(p1, policy=wb.DDTree(16), max_new_tokens=30)
    ref1.run()
    ref2 = engine.session(p2, policy=wb.DFlash(), max_new_tokens=30)
    ref2.run()
    a = engine.session(p1, policy=wb.DDTree(16), max_new_tokens=30)
    b = engine.session(p2, policy=wb.DFlash(), max_new_tokens=30)
    while not (a.finished and b.finished):
        for s in (a, b):
            if not s.finished:
                s.step()
    assert a.tokens == ref1.tokens and b.tokens == ref2.tokens


def test_sglang_kernel_agrees_on_every_cycle_of_real_runs(engine, eval_prompts):
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    for item in eval_prompts[:2]:
        s = engine.session(item["prompt"], policy=wb.DDTree(32), max_new_tokens=40)
        s.run()
        for c in s.cycles:
            tree = Tree(c.tokens[None], c.parents[None], c.depth[None], c.rank[None], c.score[None])
            depth = int(c.depth.max())
            ct = compile_tree(tree, c.start, depth)
            ours = accept("torch", tree, ct, c.target_choice[None], depth)
            theirs = accept("sglang", tree, ct, c.target_choice[None], depth)
            assert torch.equal(ours.index, theirs.index) and torch.equal(ours.bonus, theirs.bonus)
            assert theirs.index[0, : c.accepted + 1].tolist() == c.accepted_nodes.tolist()
        t = engine.session(item["prompt"], policy=wb.DDTree(32), max_new_tokens=40, kernel_backend="sglang")
        t.run()
        assert t.tokens == s.tokens


def test_step_after_end_says_so(engine):
    s = engine.session("x = 1\n", policy=wb.DFlash(), max_new_tokens=5)
    s.run()
    assert len(s.tokens) == 5
    with pytest.raises(wb.SessionFinished, match="max_new_tokens=5"):
        s.step()
    s.run(max_new_tokens=9)  # a larger limit lets it go on
    assert len(s.tokens) == 9


def test_cycle_record_is_complete_and_consistent(engine):
    s = engine.session("def parse(line):\n    ", policy=wb.DDTree(32), max_new_tokens=30)
    c = s.step()
    n = c.tokens.shape[0]
    assert n == 33 and c.n_nodes == 32
    assert c.draft_topk_tokens.shape == (engine.models.block_size - 1, 8)
    assert c.visibility.shape == (n, n) and c.position_ids.tolist() == [c.start + d for d in c.depth.tolist()]
    assert c.target_choice.shape == (n,) and torch.all((c.target_prob > 0) & (c.target_prob <= 1))
    assert c.accepted_tokens[0] == c.root_token
    assert c.bonus == int(c.target_choice[c.accepted_nodes[-1]])
    assert set(c.stage_seconds) == set(STAGES)
    modes = [(f.model, f.mode) for f in c.forwards]
    assert modes == [("draft", wb.ForwardMode.TARGET_VERIFY), ("target", wb.ForwardMode.TARGET_VERIFY)]
    assert c.forwards[1].outputs["logits"]["shape"] == [1, n, engine.models.target.config.vocab_size]
    assert c.tokens.device.type == "cpu"
    a = engine.session("def parse(line):\n    ", policy=wb.AR(), max_new_tokens=3).step()
    assert [(f.model, f.mode) for f in a.forwards] == [("target", wb.ForwardMode.DECODE)]


def test_trace_roundtrip_and_bad_files(engine, tmp_path):
    s = engine.session("import sys\n", policy=wb.DDTree(8), max_new_tokens=20)
    t = s.run()
    p = t.save(tmp_path / "run.trace.jsonl")
    back = wb.Trace.load(p)
    assert back.summary().tau == t.summary().tau and len(back) == len(t)
    assert torch.equal(back[1].visibility, t[1].visibility) and back[1].forwards == t[1].forwards
    lines = p.read_text().splitlines()
    (tmp_path / "cut.jsonl").write_text("\n".join(lines[:-2]) + "\n")
    with pytest.raises(wb.TraceFileError, match="truncated"):
        wb.Trace.load(tmp_path / "cut.jsonl")
    (tmp_path / "foreign.jsonl").write_text('{"hello": 1}\n')
    with pytest.raises(wb.TraceFileError, match="not a ddtree-workbench trace"):
        wb.Trace.load(tmp_path / "foreign.jsonl")
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".")] == []  # no temp files left


def test_summary_counts(engine):
    s = engine.session("def parse(line):\n    ", policy=wb.DDTree(16), max_new_tokens=40)
    t = s.run()
    summ = t.summary()
    assert summ.new_tokens == len(s.tokens) == 40
    assert summ.cycles == len(t.cycles)
    assert sum(c.committed for c in t) == 39  # the first token came from the prefill
    assert sum(k * v for k, v in summ.accept_histogram.items()) == sum(c.accept_length for c in t)
    assert summ.tau == pytest.approx(sum(c.accept_length for c in t) / len(t))


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("kw,match", [
    (dict(prompt=""), "prompt='' is empty"),
    (dict(temperature=-0.5), "temperature=-0.5"),
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(top_p=1.5), "top_p=1.5"),
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(kernel_backend="cuda-magic"), "kernel_backend='cuda-magic'"),
])
def test_bad_session_arguments(engine, kw, match):
    args = dict(prompt="x = 1")
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        engine.session(args.pop("prompt"), **args)


def test_prompt_longer_than_positions(engine):
    with pytest.raises(ValueError, match=r"prompt is \d+ tokens but the target has 1024 positions"):
        engine.session("x = 1\n" * 2000)


@pytest.mark.parametrize("budget,match", [(0, "budget=0"), (-3, "budget=-3"), (10**6, "absurdly large"),
                                          (2.5, "budget=2.5")])
def test_bad_budgets(budget, match):
    with pytest.raises(ValueError, match=match):
        wb.DDTree(budget=budget)


def test_unavailable_kernel_backend_says_how_to_install(engine, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    with pytest.raises(RuntimeError, match="make install-sglang"):
        engine.session("x = 1", kernel_backend="sglang")
