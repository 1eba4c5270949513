"""The hybrid pair's training (``--arch hybrid``): the fast chunked delta rule equals transformers' own,
the smoke recipe writes a Qwen3.5-text target and a drafter that load, and the engine-free greedy
simulation (greedy_sim) counts what the engine and dflash_generate count on a dense pair."""
from __future__ import annotations

import json
import time

import pytest
import torch


def _delta_inputs(T: int, gen: torch.Generator, with_state: bool, heads: int = 3, dk: int = 16, dv: int = 8):
    q, k = (torch.randn(2, T, heads, dk, generator=gen) for _ in range(2))
    v = torch.randn(2, T, heads, dv, generator=gen)
    g = -2 * torch.rand(2, T, heads, generator=gen)  # log-decay <= 0, as softplus gives
    beta = torch.rand(2, T, heads, generator=gen)
    state = torch.randn(2, heads, dk, dv, generator=gen) if with_state else None
    return q, k, v, g, beta, state


@pytest.mark.parametrize("T,with_state,chunk", [(100, False, 64), (64, True, 64), (7, True, 64), (37, True, 16)])
def test_fast_chunked_delta_rule_equals_transformers(T, with_state, chunk):
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule

    from workbench.train.fast_delta import chunk_gated_delta_rule

    gen = torch.Generator().manual_seed(T)
    q, k, v, g, beta, state = _delta_inputs(T, gen, with_state)
    leaves = [t.requires_grad_() for t in (q, k, v, g, beta)]
    kw = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True, chunk_size=chunk)
    ref_out, ref_state = torch_chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, ref_state, atol=1e-5, rtol=1e-5)
    # and the token-by-token recurrence (the definition) agrees too
    step_out, step_state = torch_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                                            use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out, step_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, step_state, atol=1e-4, rtol=1e-4)
    # gradients (what training uses) agree with autograd through transformers' loop
    w = torch.randn(out.shape, generator=gen)
    ref = torch.autograd.grad((ref_out * w).sum() + ref_state.sum(), leaves)
    got = torch.autograd.grad((out * w).sum() + final.sum(), leaves)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    other, _ = chunk_gated_delta_rule(q, k.flip(1), v, g, beta, **kw)
    assert not torch.allclose(other, ref_out, atol=1e-3)  # the comparison can fail


def test_fast_delta_rule_is_patched_only_inside_and_restored_on_error():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

    from workbench.train.fast_delta import chunk_gated_delta_rule, fast_delta_rule

    original = mq.torch_chunk_gated_delta_rule
    with pytest.raises(RuntimeError, match="boom"):
        with fast_delta_rule():
            assert mq.torch_chunk_gated_delta_rule is chunk_gated_delta_rule
            raise RuntimeError("boom")
    assert mq.torch_chunk_gated_delta_rule is original


@pytest.mark.slow
def test_hybrid_smoke_training_writes_a_qwen3_5_pair_that_loads(tmp_path, monkeypatch, capfd):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shared_checks import run_main
    from workbench.engine import loading
    from workbench.train.distill import greedy_continue
    from workbench.train.pipeline import main

    rc, out, err = run_main(main, capfd, "--arch", "hybrid", "--out", str(tmp_path), "--smoke", "--threads", "1")
    assert rc == 0, err[-2000:]
    metrics = json.loads(out.strip().splitlines()[-1])
    assert metrics["arch"] == "hybrid"
    for split in ("long", "short"):  # the engine's own tau beside the simulated one
        assert metrics["engine"][split]["dflash_tau"] >= 1.0 and metrics["engine"][split]["prompts"] > 0
    assert set(metrics["target_layer_types"]) == {"linear_attention", "full_attention"}
    for split in ("long", "short"):
        fig = metrics["splits"][split]
        assert fig["sim_dflash_tau"] >= 1.0 and fig["sim_ddtree32_tau"] >= 1.0
        assert len(fig["slot_top1_agreement"]) == 7 and fig["prompts"] > 0  # smoke block size 8
        assert fig["prefill_vs_cached_greedy_agreement"] > 0.9  # one full forward's argmax = cached decode's
    report = json.loads((tmp_path / "training_report.json").read_text())
    assert report["recipe"]["full_attention_interval"] == 3 and report["splits"] == metrics["splits"]
    monkeypatch.setitem(loading.PAIRS, "hybrid", (tmp_path / "target", tmp_path / "draft"))
    models = loading.load_models("hybrid")  # wb.load("hybrid") resolves the name the same way
    assert (models.target_dir, models.draft_dir) == loading.PAIRS["hybrid"]
    assert type(models.target).__name__ == "Qwen3_5ForCausalLM"
    assert models.target_layer_ids == [0, 1] and models.block_size == 8
    # Distillation's cached greedy decode equals transformers' own generate on the hybrid target.
    target = AutoModelForCausalLM.from_pretrained(tmp_path / "target").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "target")
    x = tok("def parse(line):\n    ", return_tensors="pt", add_special_tokens=False)["input_ids"]
    ours = greedy_continue(target, x, 12)[0].tolist()
    theirs = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=tok.eos_token_id)[0, x.shape[1]:].tolist()
    assert ours == theirs
    # A later stage on this directory without --arch hybrid is refused in one line.
    rc, _, err = run_main(main, capfd, "--out", str(tmp_path), "--smoke", "--stage", "report")
    assert rc == 2 and "pass --arch hybrid" in err.strip().splitlines()[-1]


@pytest.mark.slow
def test_greedy_simulation_counts_what_the_engine_and_dflash_generate_count(monkeypatch):
    """On the embedded dense pair (which the engine runs), the simulated cycles are the real ones."""
    import dflash.model as dm

    import workbench as wb
    from workbench.train import greedy_sim
    from workbench.bench.policy_bench import run_one
    from workbench.shipped import eval_prompts

    engine = wb.load(threads=1)  # the process-wide count: later tests in this process keep it
    target, draft, tok = engine.models.target, engine.models.draft, engine.tokenizer
    eos = tok.eos_token_id
    if not torch.cuda.is_available():  # dflash_generate's stats clock calls torch.cuda.synchronize()
        monkeypatch.setattr(dm, "_cuda_time", time.perf_counter)
    for item in eval_prompts("short")[:2] + eval_prompts("long")[:1]:
        ids = tok(item["prompt"], add_special_tokens=False)["input_ids"]
        r = greedy_sim.rollout(target, draft, ids, 24, eos)
        ref = dm.dflash_generate(draft, target, torch.tensor([ids]), 24, [eos], return_stats=True)
        assert r.ids == ref.output_ids[0].tolist()  # the same greedy text
        assert greedy_sim.cycles(r, None, eos, "dflash_generate") == ref.acceptance_lengths
        assert greedy_sim.cycles(r, None, eos) == run_one(engine, wb.DFlash(), item["prompt"], 24).accept_lengths
        assert greedy_sim.cycles(r, 16, eos) == run_one(engine, wb.DDTree(16), item["prompt"], 24).accept_lengths
    assert max(ref.acceptance_lengths) > 1  # drafts were accepted: the comparison means something


def test_hybrid_recipe_fits_the_size_budget():
    """The default hybrid recipe's target + drafter stay under 30 MB in float32, and its layers interleave."""
    from transformers import AutoTokenizer

    from workbench.engine.loading import DEFAULT_TARGET
    from workbench.train.drafter import draft_config
    from workbench.train.recipe import HybridRecipe
    from workbench.train.target import target_class, target_config

    from dflash.model import DFlashDraftModel

    recipe = HybridRecipe()
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)  # the same BPE recipe as the dense pair
    cfg = target_config(recipe, tok)
    assert cfg.layer_types == ["linear_attention", "linear_attention", "full_attention"] * 2
    target = target_class(recipe)(cfg)
    draft = DFlashDraftModel(draft_config(recipe, cfg, tok))
    # tied embeddings are stored once; the drafter borrows the target's embedding and head
    n = sum(p.numel() for p in target.parameters()) + sum(p.numel() for p in draft.parameters())
    assert 4 * n < 30e6, n
    assert all(0 <= i < recipe.layers for i in recipe.target_layer_ids)


def test_an_embedded_pair_by_name_missing_or_shadowed_is_a_clear_error(tmp_path, monkeypatch):
    from workbench.engine import loading

    monkeypatch.setitem(loading.PAIRS, "hybrid", (tmp_path / "nowhere" / "target", tmp_path / "nowhere" / "draft"))
    with pytest.raises(loading.ModelPairError, match="embedded 'hybrid' pair is not in .*make train-hybrid"):
        loading.load_models("hybrid")
    monkeypatch.chdir(tmp_path)  # a directory of that name wins over the embedded pair's name
    (tmp_path / "hybrid").mkdir()
    with pytest.raises(loading.ModelPairError, match="'hybrid' is not a model directory"):
        loading.load_models("hybrid")


def test_a_hybrid_model_runs_the_fast_rule_inside_and_gives_transformers_logits(monkeypatch):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    import workbench.train.fast_delta as fd

    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                            linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                            full_attention_interval=3, max_position_embeddings=128)
    model = Qwen3_5ForCausalLM(cfg).eval()
    x = torch.randint(0, 64, (2, 70))  # two chunks of 64, the second partial
    calls = []
    real = fd.chunk_gated_delta_rule
    monkeypatch.setattr(fd, "chunk_gated_delta_rule", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        ref = model(input_ids=x).logits
        with fd.fast_delta_rule():
            got = model(input_ids=x).logits
    assert len(calls) == 2  # both linear-attention layers, only inside
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
