"""Batched DDTree: a batch reproduces each request run alone, with exact KV caches and inert padding."""
from __future__ import annotations

import pytest
import torch

import workbench as wb
from ddtree_kernels import accept_walk
from test_engine import plain_cache, tiny_prompts
from workbench.engine.batch import _pad_trees, ragged_layout

MIXED = [wb.DDTree(16), wb.DDTree(3), wb.DFlash(), wb.DDTree(40), wb.AR()]


def alone(engine, prompt, policy, n, **kw):
    s = engine.session(prompt, policy=policy, max_new_tokens=n, **kw)
    s.run()
    return s


def check_same_cycles(got, ref):
    """Cycle for cycle, the batch drafted, built and verified the same tree as the request alone."""
    assert len(got.cycles) == len(ref.cycles)
    for a, b in zip(got.cycles, ref.cycles):
        for f in ("tokens", "parents", "position_ids", "visibility", "target_choice", "accepted_nodes",
                  "draft_topk_tokens"):
            assert torch.equal(getattr(a, f), getattr(b, f)), (a.index, f)
        torch.testing.assert_close(a.draft_topk_logprobs, b.draft_topk_logprobs, atol=1e-4, rtol=1e-4)


def check_cycle_accept(cycle):
    """The batched accept (recorded) equals the accept walk over this request's own, unpadded tree."""
    one = accept_walk(cycle.tokens[None], cycle.parents[None], cycle.depth[None], cycle.visibility[None],
                      cycle.target_choice[None], int(cycle.depth.max()))
    L = int(one.length[0])
    assert torch.equal(one.index[0, : L + 1], cycle.accepted_nodes), cycle.index
    assert int(one.bonus[0]) == cycle.bonus


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["l4-h32", "l3-h48-b5", "l6-h32-d2"])
def test_batch_equals_each_request_alone_on_random_models(tiny_engines, shape):
    engine = tiny_engines[shape]
    prompts = tiny_prompts(engine, 5, seed=7 + len(shape))  # 1 to 11 tokens: mixed lengths
    limits = [30, 30, 6, 30, 12]  # request 2 ends early; the others go on without it
    bs = engine.batch_session(prompts, policy=MIXED, max_new_tokens=limits)
    bs.run()
    for p, pol, n, s in zip(prompts, MIXED, limits, bs.sessions):
        ref = alone(engine, p, pol, n)
        assert s.tokens == ref.tokens, f"{shape} {pol} {p!r}"
        check_same_cycles(s, ref)
        assert s.finish_reason == ref.finish_reason
        for c in s.cycles:
            check_cycle_accept(c)
    assert bs.finished and len(bs.cycles) == max(len(s.cycles) for s in bs.sessions)
    assert len(bs.cycles[-1].requests) < len(prompts)  # retired requests left the batch


def test_batch_equals_alone_and_kv_cache_after_every_cycle_on_embedded(engine, eval_prompts):
    prompts = [p["prompt"] for p in eval_prompts[:3]] + ["class Parser:\n    def __init__(self"]
    policies = [wb.DDTree(16), wb.DDTree(4), wb.DFlash(), wb.DDTree(32)]
    limits = [40, 40, 40, 12]
    bs = engine.batch_session(prompts, policy=policies, max_new_tokens=limits)
    while not bs.finished:
        live = bs.live
        bs.step()
        for i in live:
            s = bs.sessions[i]
            if s.finished:
                assert s.kv_cache() == []  # retired: its rows left the batch
                continue
            committed = s.prompt_ids + s.tokens[:-1]  # the pending bonus is not in the cache yet
            got = s.kv_cache()
            assert got[0][0].shape[2] == len(committed) == s.start
            for (k, v), (rk, rv) in zip(got, plain_cache(engine, committed)):
                torch.testing.assert_close(k, rk, atol=2e-5, rtol=1e-4)
                torch.testing.assert_close(v, rv, atol=2e-5, rtol=1e-4)
    for p, pol, n, s in zip(prompts, policies, limits, bs.sessions):
        ref = alone(engine, p, pol, n)
        assert s.tokens == ref.tokens, pol
        check_same_cycles(s, ref)
        assert s.text == engine.tokenizer.decode(s.tokens) and bs.texts[bs.sessions.index(s)] == s.text
    assert any(c.accepted > 0 for s in bs.sessions for c in s.cycles)  # drafts were accepted, not only bonuses


def test_padding_nodes_are_inert_on_random_trees():
    """Padded batched accept == per-tree accept, even when the target's choices match padding everywhere."""
    from ddtree_kernels import build_tree, compile_tree

    g = torch.Generator().manual_seed(3)
    trees, comps, starts = [], [], []
    for b, budget in enumerate([1, 5, 12, 30]):
        lp = torch.log_softmax(torch.randn(1, 4, 6, generator=g), -1)
        t = build_tree(lp, torch.tensor([b]), budget)
        trees.append(t)
        comps.append(compile_tree(t, 10 + b, 4))
        starts.append(10 + b)
    tree, comp = _pad_trees(trees, comps, starts)
    for trial in range(20):
        choice = torch.randint(0, 6, tree.tokens.shape, generator=g)
        # Make every real node's target choice agree with its first child half of the time: long paths.
        if trial % 2:
            for b, t in enumerate(trees):
                for j in range(1, t.n):
                    choice[b, int(t.parents[0, j])] = t.tokens[0, j]
        got = accept_walk(tree.tokens, tree.parents, tree.depth, comp.visibility, choice, 4)
        for b, (t, c) in enumerate(zip(trees, comps)):
            one = accept_walk(t.tokens, t.parents, t.depth, c.visibility, choice[b : b + 1, : t.n], 4)
            assert torch.equal(got.index[b], one.index[0]) and int(got.bonus[b]) == int(one.bonus[0])
            assert int(got.length[b]) == int(one.length[0])
        assert (got.index < torch.tensor([t.n for t in trees])[:, None]).all()  # no padding node taken


def test_verify_layout_padded_and_ragged(tiny_engines):
    engine = tiny_engines["l6-h32-d2"]
    budgets = [4, 9, 2]
    bs = engine.batch_session(tiny_prompts(engine, 3, seed=1), policy=[wb.DDTree(b) for b in budgets],
                              max_new_tokens=20)
    bc = bs.step()
    lay = bs.verify_layout()
    assert lay["verify_lens"] == [c.n_nodes + 1 for c in bc.cycles] == [1 + b for b in budgets]
    N = max(lay["verify_lens"])
    V = lay["padded"]["logits"][-1]
    assert lay["padded"]["forward"]["mode"] == "TARGET_VERIFY"
    assert lay["padded"]["logits"] == [3, N, V] and lay["padded"]["padding_rows"] == 3 * N - sum(lay["verify_lens"])
    assert lay["ragged"]["rows"] == sum(1 + b for b in budgets)  # SGLang: sum over requests of 1 + budget
    assert lay["ragged"]["logits"] == [sum(1 + b for b in budgets), V]
    assert lay["ragged"]["qo_indptr"] == [0, 5, 15, 18]
    assert lay["every_draft_token_has_logits"]
    # The shapes tables take the batch session: ours shows the padded forward, SGLang's the ragged rows.
    ours = wb.shapes.table(bs, mode="TARGET_VERIFY", model="target")
    assert any(r["shape"] == [3, N, V] for r in ours if r["tensor"] == "logits")
    theirs = wb.shapes.table(bs, mode="TARGET_VERIFY", model="target", view="sglang")
    text = str(theirs)
    assert f"[{sum(lay['verify_lens'])}, {V}]" in text  # logits rows = sum over requests of (1 + budget)


def test_ragged_layout_matches_sglang():
    pytest.importorskip("sglang.srt.speculative.ragged_verify")
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    lens = [17, 1, 33, 5]
    ref = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=lens, device=torch.device("cpu"), grid=[64])
    ours = ragged_layout(lens, 11)
    assert ours["qo_indptr"] == ref.qo_indptr_device.tolist() == [0, 17, 18, 51, 56]
    assert ours["rows"] == ref.total_verify_tokens


@pytest.mark.slow
def test_batch_sampling_reproduces_each_seeded_session(tiny_engines):
    engine = tiny_engines["l4-h32"]
    prompts = tiny_prompts(engine, 3, seed=5)
    bs = engine.batch_session(prompts, policy=wb.DDTree(8), temperature=0.8, seed=11, max_new_tokens=24)
    bs.run()
    for i, (p, s) in enumerate(zip(prompts, bs.sessions)):
        assert s.tokens == alone(engine, p, wb.DDTree(8), 24, temperature=0.8, seed=11 + i).tokens


@pytest.mark.parametrize("kw, match", [
    (dict(prompts=[]), "empty"),
    (dict(prompts="one string"), "list of strings"),
    (dict(prompts=["a", 3]), r"prompts\[1\]=3 is not a string"),
    (dict(prompts=["a", "b"], policy=[wb.DDTree(4)] * 3), "3 policies for 2 prompts"),
    (dict(prompts=["a", "b"], max_new_tokens=[4]), "1 max_new_tokens for 2 prompts"),
    (dict(prompts=["a", ""]), "empty"),
])
def test_bad_input_one_line_errors(tiny_engines, kw, match):
    with pytest.raises(ValueError, match=match) as e:
        tiny_engines["l4-h32"].batch_session(**kw)
    assert "\n" not in str(e.value)


def test_stepping_a_finished_batch_or_a_request_directly(tiny_engines):
    bs = tiny_engines["l4-h32"].batch_session(["t1 t2", "t3"], policy=wb.DDTree(4), max_new_tokens=3)
    with pytest.raises(RuntimeError, match="batch.step"):
        bs.sessions[0].step()
    bs.run()
    with pytest.raises(wb.SessionFinished if hasattr(wb, "SessionFinished") else RuntimeError):
        bs.step()


def test_batch_stepper_shows_one_tree_per_request(tiny_engines):
    from workbench import views

    engine = tiny_engines["l4-h32"]
    bs = engine.batch_session(["t1 t2 t3", "t4"], policy=[wb.DDTree(6), wb.DDTree(2)], max_new_tokens=12)
    st = views.BatchStepper(bs)
    assert st.shown is None
    st.step()
    for r in (0, 1):
        st.show(r)
        assert st.shown == (r, 0)
        assert views.tree_node_count(st.tree) == bs.sessions[r].cycles[0].n_nodes + 2  # + root and bonus
    st.run(100)
    assert bs.finished and st.step_button.disabled and "finished" in st.status.value
    with pytest.raises(IndexError, match="out of range"):
        st.show(0, 10_000)


def test_cli_bench_batch_size(tiny_pairs, capsys, tmp_path):
    import json

    from workbench.__main__ import main

    t, d = tiny_pairs["l4-h32"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "t1 t5 t9"}\n{"id": "b", "prompt": "t4 t2 t17 t8 t8 t30"}\n')
    rc = main(["bench", "--target", str(t), "--draft", str(d), "--threads", "1", "--prompts", str(prompts),
               "--batch-size", "3", "--policies", "dflash,ddtree:8", "--max-new-tokens", "6", "--no-warmup",
               "--repeats", "2", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["batch_size"] == 3 and res["batches"] == 1 and set(res["policies"]) == {"DFlash", "DDTree(8)"}
    for label, r in res["policies"].items():
        assert r["lossless"] is True and r["tau"] >= 1 and r["cycle_ms_p50"] > 0
        # every repeat's figure is there (a percentile summary such as "p50 2.45x p90 2.46x" hides a 0.48x repeat)
        assert len(r["speedup_per_repeat"]) == len(r["batch_tok_s_per_repeat"]) == 2
        assert r["speedup"] == sorted(r["speedup_per_repeat"])[0] + (sorted(r["speedup_per_repeat"])[1] -
                                                                     sorted(r["speedup_per_repeat"])[0]) / 2
    assert res["policies"]["DFlash"]["decode_vs_dflash_per_repeat"] == [1.0, 1.0]


@pytest.mark.parametrize("policy", [wb.AR(), wb.DDTree(7)])
def test_batch_of_one_and_all_ar_batch_equal_alone(tiny_engines, policy):
    engine = tiny_engines["l3-h48-b5"]
    for prompts in (["t3 t1 t4 t1 t5"], tiny_prompts(engine, 3, seed=2)):
        bs = engine.batch_session(prompts, policy=policy, max_new_tokens=15)
        bs.run()
        for p, s in zip(prompts, bs.sessions):
            check_same_cycles(s, alone(engine, p, policy, 15))
            assert s.tokens == alone(engine, p, policy, 15).tokens
        if isinstance(policy, wb.AR):
            assert all(c.forwards[-1].mode == wb.ForwardMode.DECODE for c in bs.cycles)


def test_ragged_cache_keep_rows_equals_per_request_compaction():
    """Batched compaction == compact_kv on each request's own rows, for ragged lengths and accept counts."""
    from types import SimpleNamespace

    from ddtree_kernels import compact_kv
    from workbench.models.kv_buffers import KVBuffers as RaggedCache

    cfg = SimpleNamespace(get_text_config=lambda decoder=True: SimpleNamespace(num_hidden_layers=2))
    g = torch.Generator().manual_seed(0)
    starts, n = [3, 0, 7], 6
    cache = RaggedCache(cfg, [0, 0, 0])
    prefix = torch.randn(3, 2, max(starts), 4, generator=g)
    for layer in cache.layers:
        layer.update(prefix, -prefix)
    cache.set_lengths(starts)
    tree = torch.randn(3, 2, n, 4, generator=g)
    for layer in cache.layers:
        k, v = layer.update(tree, -tree)
        assert k.shape[2] == max(starts) + n
    before = [cache.kv(b) for b in range(3)]
    full = [[(torch.cat([k, tree[b : b + 1]], 2), torch.cat([v, -tree[b : b + 1]], 2)) for k, v in kv]
            for b, kv in enumerate(before)]
    nodes = [torch.tensor([0, 2, 5]), torch.tensor([0]), torch.tensor([0, 1, 3, 4])]
    cache.keep_rows(starts, nodes)
    assert cache.lengths == [6, 1, 11]
    for b in range(3):
        for (k, v), (fk, fv) in zip(cache.kv(b), full[b]):
            assert torch.equal(k, compact_kv(fk, starts[b], nodes[b]))
            assert torch.equal(v, compact_kv(fv, starts[b], nodes[b]))
    cache.select([2, 0])
    assert cache.lengths == [11, 6] and cache.kv(0)[0][0].shape == (1, 2, 11, 4)


def test_batch_with_causal_and_sliding_drafter_layers_equals_alone(tmp_path):
    """A drafter mixing sliding-window (causal) and full layers, as z-lab's Qwen3.6 drafters do: batched
    drafting builds each layer kind's mask per row and reproduces every request run alone."""
    import json

    from tiny_models import make_pair

    t, d = make_pair(tmp_path, vocab=64, hidden=32, layers=4, draft_layers=3, layer_ids=(1, 2), block_size=8,
                     seed=11)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(layer_types=["sliding_attention", "full_attention", "sliding_attention"], use_sliding_window=True,
               sliding_window=5)  # shorter than block + context: the window hides keys
    (d / "config.json").write_text(json.dumps(cfg))
    engine = wb.load(target=t, draft=d, threads=1)
    kinds = [(layer.self_attn.is_causal, layer.self_attn.sliding_window) for layer in engine.models.draft.layers]
    assert kinds == [(True, 5), (False, None), (True, 5)], kinds
    prompts = tiny_prompts(engine, 4, seed=13)
    policies = [wb.DDTree(8), wb.DFlash(), wb.DDTree(3), wb.AR()]
    limits = [24, 24, 10, 16]
    bs = engine.batch_session(prompts, policy=policies, max_new_tokens=limits)
    bs.run()
    refs = []
    for p, pol, n, s in zip(prompts, policies, limits, bs.sessions):
        ref = alone(engine, p, pol, n)
        assert s.tokens == ref.tokens, f"{pol} {p!r}"
        check_same_cycles(s, ref)
        refs.append(ref)
    # The layer kinds matter: the same drafter with every layer full and non-causal drafts otherwise.
    for layer in engine.models.draft.layers:
        layer.self_attn.is_causal, layer.self_attn.sliding_window = False, None
    full = alone(engine, prompts[0], policies[0], limits[0])
    assert any(not torch.equal(a.draft_topk_tokens, b.draft_topk_tokens) for a, b in zip(full.cycles, refs[0].cycles))
