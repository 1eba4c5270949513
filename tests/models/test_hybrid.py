"""Hybrid targets (GatedDeltaNet + gated attention) behind the model interface: lossless greedy against AR and
transformers' own ``generate``, every verified node against the per-path oracle, the committed recurrent state
against transformers' cache, batched rows, the sampling law, and the tools (stepper, traces, shapes, server)."""
from __future__ import annotations

import pytest
import torch

import workbench as wb
from ddtree_kernels import build_tree
from tiny_hybrid import make_hybrid_pair
from workbench.engine import stages
from workbench.models.path_oracle import path_logits
from workbench.models import HybridGDN

LAYOUTS = ("qwen3_next", "qwen3_5", "qwen3_5_nested")  # the last: Qwen3_5ForConditionalGeneration + text_config
POLICIES = (wb.DFlash(), wb.DDTree(8), wb.EagleTree(topk=2, steps=3, num_draft_tokens=6))


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid_pairs")
    out = {}
    for layout in LAYOUTS:
        kind = layout.removesuffix("_nested")
        # A small vocabulary: random drafts are accepted often enough that commits go deeper than the root.
        t, d = make_hybrid_pair(root, kind, nested=layout.endswith("_nested"), seed=LAYOUTS.index(layout), vocab=24)
        out[layout] = wb.load(target=t, draft=d)
    out["qwen3_6_moe"] = wb.load(*write_qwen3_6_moe(root))
    return out


def write_qwen3_6_moe(root):
    """Qwen3.6's text model (``qwen3_5_moe_text``: Qwen3.5's GatedDeltaNet with MoE MLPs), tiny, and a drafter."""
    from tiny_hybrid import hybrid_config
    from tiny_models import draft_model, make_tokenizer
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    c = hybrid_config("qwen3_5", vocab=24).to_dict()
    fields = {k: v for k, v in c.items() if k not in ("model_type", "architectures", "transformers_version")}
    cfg = Qwen3_5MoeTextConfig(**fields, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                               shared_expert_intermediate_size=32)
    torch.manual_seed(4)
    tdir, ddir = root / "qwen3_6_moe", root / "qwen3_6_moe_draft"
    Qwen3_5MoeForCausalLM(cfg).save_pretrained(tdir)
    make_tokenizer(cfg.vocab_size).save_pretrained(tdir)
    common = {k: c[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                "num_key_value_heads", "head_dim", "max_position_embeddings", "initializer_range")}
    draft_model(common, cfg.num_hidden_layers, 1, (1, 2), 8).save_pretrained(ddir)
    return tdir, ddir


def prompts_of(engine, k: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    V = len(engine.tokenizer) - 2
    return [" ".join(f"t{int(t)}" for t in torch.randint(0, V, (int(torch.randint(2, 10, (1,), generator=g)),),
                                                          generator=g)) for _ in range(k)]


def hf_generate(engine, prompt: str, n: int) -> list[int]:
    m = engine.models
    ids = torch.tensor([m.tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        out = m.target.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=m.tokenizer.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


# ------------------------------------------------------------------------------------------ lossless
@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_dflash_ddtree_eagle_equal_ar_and_transformers_generate(engines, layout):
    engine = engines[layout]
    assert isinstance(engine.session("t1", policy=wb.AR(), max_new_tokens=1)._rows.target, HybridGDN)
    accepted = 0
    for seed, prompt in enumerate(prompts_of(engine, 2, seed=7)):
        ar = engine.session(prompt, policy=wb.AR(), max_new_tokens=16)
        ar.run()
        assert ar.tokens == hf_generate(engine, prompt, 16), (layout, prompt)
        for policy in POLICIES:
            s = engine.session(prompt, policy=policy, max_new_tokens=16, seed=seed)
            s.run()
            assert s.tokens == ar.tokens, (layout, str(policy), prompt)
            assert all(torch.equal(c.state_from, c.parents) for c in s.cycles)
            accepted += sum(c.accepted for c in s.cycles)
    assert accepted >= 6, "drafts were hardly ever accepted: commits past the root would go untested"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_batched_ragged_rows_equal_each_request_alone(engines, layout):
    """Ragged prompts (the prefill runs each linear layer row by row), mixed policies (padded trees), rows
    retiring at different times: every request's output equals its own solo AR output."""
    engine = engines[layout]
    prompts = prompts_of(engine, 4, seed=11)
    policies = [wb.DDTree(8), wb.DFlash(), POLICIES[2], wb.AR()]
    limits = [16, 10, 16, 7]
    batch = engine.batch_session(prompts, policies, max_new_tokens=limits)
    batch.run()
    for p, n, s in zip(prompts, limits, batch.sessions):
        solo = engine.session(p, policy=wb.AR(), max_new_tokens=n)
        solo.run()
        assert s.tokens == solo.tokens, (layout, p)


def test_sglang_triton_kernels_run_a_lossless_session(engines):
    """SGLang's own tree kernels (Triton's interpreter on this CPU) in a whole greedy DDTree session."""
    engine = engines["qwen3_next"]
    prompt = prompts_of(engine, 1, seed=3)[0]
    ar = engine.session(prompt, policy=wb.AR(), max_new_tokens=5)
    ar.run()
    s = engine.session(prompt, policy=wb.DDTree(4), max_new_tokens=5, kernel_backend="sglang-triton")
    s.run()
    assert s.tokens == ar.tokens
    assert s.trace.meta["kernel_backend"] == "sglang-triton"


# ------------------------------------------------------------------------------------------ per node, per cycle
def random_tree(g, root: int, vocab: int, budget: int, depth: int = 4):
    lp = torch.log_softmax(torch.randn(1, depth, vocab, generator=g) * 3, -1)
    return build_tree(lp, torch.tensor([root]), budget=budget)


def path_to(tree, node: int) -> list[int]:
    parents = tree.parents[0].tolist()
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def committed_caches(state: HybridGDN, row: int):
    """(linear [(conv window, state)], attention [(keys, values)]) of one row of the state, in layer order."""
    view = state.view(row)
    lin = [view[i] for i in state.cache.linear_ids]
    attn = [view[i] for i in state.cache.attn_ids]
    return lin, attn


def hf_caches(cache, state: HybridGDN):
    lin = [(cache.layers[i].conv_states[0][..., 1:], cache.layers[i].recurrent_states[0]) for i in state.cache.linear_ids]
    attn = [(cache.layers[i].keys, cache.layers[i].values) for i in state.cache.attn_ids]
    return lin, attn


def assert_close_all(got, ref, what):
    for i, (g, r) in enumerate(zip(got, ref)):
        for a, b in zip(g, r):
            torch.testing.assert_close(a.float(), b.float(), atol=1e-4, rtol=1e-4, msg=lambda m: f"{what} {i}: {m}")


@pytest.mark.parametrize("layout,backend", [("qwen3_next", "torch"), ("qwen3_5", "torch"), ("qwen3_5_nested", "torch"),
                                            ("qwen3_6_moe", "torch"), ("qwen3_5", "sglang-triton")])
def test_every_node_equals_its_path_and_commit_equals_transformers_cache(engines, layout, backend):
    """Two ragged rows, random trees with siblings (padded to one N), two cycles: every node's verify logits ==
    ``hybrid_oracle.path_logits`` (a sibling continuing the wrong branch is off by whole units), and after each
    commit the row's conv windows, recurrent states and attention K/V == transformers' cache after the path."""
    engine = engines[layout]
    m = engine.models
    model, V = m.target, m.target.config.vocab_size
    g = torch.Generator().manual_seed(5)
    state = HybridGDN(m)
    state.kernel_backend = backend
    contexts = [torch.randint(0, V - 2, (n,), generator=g).tolist() for n in (5, 9)]
    with torch.inference_mode():
        pre = state.prefill(contexts)
        for b, ctx in enumerate(contexts):
            ref = model(input_ids=torch.tensor([ctx])).logits[0, -1]
            torch.testing.assert_close(pre.logits[b, 0], ref, atol=1e-4, rtol=1e-4)
        cycles = 2 if backend == "torch" else 1
        for cycle in range(cycles):
            roots = [int(torch.randint(0, V - 2, (1,), generator=g)) for _ in contexts]
            trees = [random_tree(g, r, V, budget) for r, budget in zip(roots, (7, 4) if cycle == 0 else (3, 8))]
            layout_ = stages.tree_compile(trees, [len(c) for c in contexts], [4, 4])
            assert layout_.padded
            out = state.verify(layout_)
            nodes = []
            for b, (ctx, tree) in enumerate(zip(contexts, trees)):
                ref, caches = path_logits(model, torch.tensor([ctx]), tree, return_caches=True)
                # 5e-4: transformers 5.17's GatedDeltaNet reference sums in another order than 5.15's (1.6e-4 seen
                # on the nested layout); a node continuing the wrong branch is off by whole units
                torch.testing.assert_close(out.logits[b, : tree.n].float(), ref[0], atol=5e-4, rtol=1e-4,
                                           msg=lambda e: f"{layout} {backend} cycle {cycle} row {b}: {e}")
                deepest = int(tree.depth[0].argmax())  # accept a whole branch (not the first: siblings count)
                last = int(torch.randint(1, tree.n, (1,), generator=g)) if cycle else deepest
                nodes.append((torch.tensor(path_to(tree, last)), caches[0][last]))
            state.commit(layout_, [x for x, _ in nodes])
            for b, (path, cache) in enumerate(nodes):
                contexts[b] = contexts[b] + trees[b].tokens[0, path].tolist()
                assert state.lengths[b] == len(contexts[b])
                got_lin, got_attn = committed_caches(state, b)
                ref_lin, ref_attn = hf_caches(cache, state)
                assert_close_all(got_lin, ref_lin, f"{layout} {backend} cycle {cycle} row {b} linear layer")
                assert_close_all(got_attn, ref_attn, f"{layout} {backend} cycle {cycle} row {b} attention layer")


def test_session_state_after_every_cycle_equals_transformers_cache_of_the_committed_tokens(engines):
    engine = engines["qwen3_5"]
    m = engine.models
    s = engine.session(prompts_of(engine, 1, seed=2)[0], policy=wb.DDTree(8), max_new_tokens=20)
    state = s._rows.target
    while not s.finished:
        s.step()
        committed = s.prompt_ids + s.tokens[:-1]  # the pending bonus is in no cache yet
        from transformers import DynamicCache

        cache = DynamicCache(config=m.target.config)
        with torch.inference_mode():
            m.target(input_ids=torch.tensor([committed]), past_key_values=cache, use_cache=True)  # chunked path
        got_lin, got_attn = committed_caches(state, 0)
        ref_lin, ref_attn = hf_caches(cache, state)
        assert got_attn[0][0].shape[2] == len(committed) == s.start
        assert_close_all(got_lin, ref_lin, f"cycle {len(s.cycles)} linear layer")
        assert_close_all(got_attn, ref_attn, f"cycle {len(s.cycles)} attention layer")


# ------------------------------------------------------------------------------------------ the state's contract
def test_state_describes_its_recurrent_tensors_refuses_crop_and_counts_its_bytes(engines):
    engine = engines["qwen3_next"]
    s = engine.session("t1 t2 t3", policy=wb.DDTree(8), max_new_tokens=12)
    s.step()
    state = s._rows.target
    specs = {x.name: x for x in state.describe(nodes=9)}
    c = engine.models.target.config
    conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    assert specs["conv_window"].shape == (1, conv_dim, c.linear_conv_kernel_dim - 1)
    assert specs["ssm_state"].shape == (1, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)
    assert specs["intermediate_ssm_state"].shape[:2] == (1, 9) and specs["intermediate_ssm_state"].kind == "scratch_per_node"
    assert specs["keys"].layers == c.layer_types.count("full_attention") and specs["keys"].shape[2] == s.start + 9
    assert specs["ssm_state"].layers == c.layer_types.count("linear_attention")
    # Committed bytes: the attention K/V rows and every linear layer's window and state, as the views hold them.
    assert state.nbytes() == sum(t.nbytes for layer in state.view(0) for t in layer)
    assert s.cache_bytes() == state.nbytes() + s._rows.draft.nbytes()
    assert not state.can_crop([s.start - 1]) and state.can_crop([s.start])
    with pytest.raises(ValueError, match="cannot be rolled back"):
        state.crop([s.start - 1])


def test_a_hybrid_declares_its_capabilities_and_refuses_static_shapes_in_one_line(engines):
    from workbench.models import DenseKV, TargetState

    engine = engines["qwen3_5"]
    s = engine.session("t1 t2 t3", policy=wb.DDTree(4), max_new_tokens=4)
    state = s._rows.target
    assert isinstance(state, TargetState) and isinstance(state.attention, DenseKV)  # the dense part, composed
    assert state.supports_static_shapes is False and state.attention.cache is state.cache.kv
    with pytest.raises(ValueError, match="static_shapes=True: HybridGDN runs with dynamic shapes only") as e:
        engine.session("t1 t2 t3", policy=wb.DDTree(4), max_new_tokens=4, static_shapes=True)
    assert "\n" not in str(e.value)


def test_an_unsupported_hybrid_is_refused_in_one_line(engines):
    import copy

    from workbench.models.registry import check_supported

    cfg = copy.deepcopy(engines["qwen3_5"].models.target.config)
    cfg.model_type = "falcon_h1"
    with pytest.raises(ValueError, match="'falcon_h1' has linear-attention layers"):
        check_supported(cfg)


# ------------------------------------------------------------------------------------------ sampling
@pytest.mark.slow
def test_sampling_law_holds_on_a_hybrid_target(tmp_path):
    """The dense targets' chi-square test of the first three tokens' joint law (tests/engine/test_engine.py), on a
    6-token two-layer Qwen3.5 hybrid (one GatedDeltaNet, one attention layer): a stochastic accept over trees whose
    nodes each continue their parent's state."""
    from shared_checks import assert_sampling_law

    t, d = make_hybrid_pair(tmp_path, "qwen3_5", seed=3, vocab=6, hidden=16, init_std=0.3, eos=False,
                            layer_types=("linear_attention", "full_attention"), block_size=4, layer_ids=(0, 1))
    assert_sampling_law(wb.load(target=t, draft=d), "t1 t3 t2", wb.DDTree(4), dict(temperature=1.0), n=400)


# ------------------------------------------------------------------------------------------ the tools
def test_stepper_views_trace_and_shapes_on_a_hybrid_session(engines, tmp_path):
    """The headless stepper and figures, a trace saved and loaded (with each node's state source), the shapes
    table's recurrent rows beside SGLang's layout, and the contracts (including the parent-state rule)."""
    from workbench import views

    engine = engines["qwen3_5_nested"]
    s = engine.session("t1 t2 t3", policy=wb.DDTree(8), max_new_tokens=14)
    st = views.Stepper(s)
    with wb.shapes.capture(s):
        st.step()
    st.run(3)
    assert st.shown_cycle == len(s.cycles) - 1 and views.tree_node_count(st.tree) == s.cycles[-1].n_nodes + 2
    views.write_report([s.trace], tmp_path / "report.html", engine.tokenizer)
    loaded = wb.Trace.load(s.trace.save(tmp_path / "hybrid.jsonl"))
    for a, b in zip(s.cycles, loaded.cycles):
        assert torch.equal(a.state_from, b.state_from) and a.forwards == b.forwards
    verify = wb.shapes.table(loaded, mode="TARGET_VERIFY", model="target")
    rows = {r["tensor"]: r for r in verify if r["module"] == "(recurrent state)"}
    n = s.cycles[0].n_nodes + 1
    c = engine.models.target.config
    assert rows["intermediate_ssm_state"]["shape"] == [1, n, c.linear_num_value_heads, c.linear_key_head_dim,
                                                       c.linear_value_head_dim]
    assert rows["intermediate_ssm_state"]["bytes"] == n * c.linear_num_value_heads * 8 * 8 * 4
    assert rows["conv_window"]["layers"] == "0-3 (x3)" and rows["conv_window"]["io"] == "in"
    sg = wb.shapes.table(loaded, mode="TARGET_VERIFY", model="target", view="sglang")
    assert sg.row("intermediate_ssm_state")["shape"] == [1, n, c.linear_num_value_heads, 8, 8]
    assert sg.row("retrieve_parent_token")["shape"] == [1, n] and sg.row("retrieve_parent_token")["dtype"] == "int64"
    checks = wb.shapes.check_contracts(s)
    assert checks.passed, str(checks)
    assert any(r["check"] == "recurrent state from the parent" for r in checks)


def test_a_served_hybrid_session_equals_the_local_one(engines):
    from workbench.serve import EngineServer, Limits

    engine = engines["qwen3_next"]
    server = EngineServer(engine, port=0, limits=Limits(max_sessions=2, max_new_tokens=32, max_budget=16)).start()
    try:
        remote = wb.connect(server.url, token=server.token)
        kw = dict(policy=wb.DDTree(6), max_new_tokens=12)
        local, rs = engine.session("t4 t5", **kw), remote.session("t4 t5", **kw)
        local.run(), rs.run()
        assert rs.tokens == local.tokens
        assert [c.state_from.tolist() for c in rs.cycles] == [c.state_from.tolist() for c in local.cycles]
        assert [tuple(k.shape) for k, _ in rs.kv_cache()] == [tuple(k.shape) for k, _ in local.kv_cache()]
        rs.close()
    finally:
        server.stop()
