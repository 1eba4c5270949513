"""wb.shapes.cost: FLOPs equal FlopCounterMode's count of the real forwards; per-family bytes; free budget; speedup."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import workbench as wb
from workbench.shapes.cost import arch, experts_touched, forward_cost

TARGET = "workbench/assets/target"
DRAFT = "workbench/assets/draft"

# Published configs (values from the model cards' config.json), built here so the tests need no download.
DEEPSEEK_V3 = dict(model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                   moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                   n_shared_experts=1, n_routed_experts=256, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                   v_head_dim=128, qk_nope_head_dim=128, num_experts_per_tok=8, first_k_dense_replace=3,
                   max_position_embeddings=163840, tie_word_embeddings=False)
QWEN3_NEXT = dict(model_type="qwen3_next", vocab_size=151936, hidden_size=2048, intermediate_size=5120,
                  num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                  linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                  linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=512, num_experts_per_tok=10,
                  moe_intermediate_size=512, shared_expert_intermediate_size=512, full_attention_interval=4,
                  partial_rotary_factor=0.25, max_position_embeddings=262144, tie_word_embeddings=False)


def _sdpa_cpu_flops(q, k, v, *args, out_shape=None, **kwargs):
    # FlopCounterMode has formulas for the CUDA SDPA kernels; the CPU one gets the same formula here
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(q, k, v)


def _counter():
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False,
                           custom_mapping={torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops})


def _tree_mask(parents: list[int], batch: int, past: int) -> torch.Tensor:
    """bool [batch, 1, n, past + n]: every node sees the prefix, itself and its ancestors."""
    n = len(parents)
    vis = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        vis[i] |= vis[parents[i]]
    m = torch.ones(batch, 1, n, past + n, dtype=torch.bool)
    m[..., past:] = vis
    return m


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_flops_equal_flop_counter_on_embedded_target(attn):
    from transformers import AutoModelForCausalLM, DynamicCache

    from workbench.records.forward import ForwardMode
    from workbench.models.run import run_target

    model = AutoModelForCausalLM.from_pretrained(TARGET, attn_implementation=attn).eval()
    a = arch(TARGET)
    g = torch.Generator().manual_seed(0)
    b, P = 2, 24
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 6]  # a 9-node tree (root + 8)
    n = len(parents)
    ids = torch.randint(0, a.vocab, (b, P), generator=g)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        with _counter() as fc:
            run_target(model, ids, torch.arange(P)[None].expand(b, P), cache, ForwardMode.EXTEND, [1, 3, 5],
                       logits_to_keep=1)
        assert fc.get_total_flops() == forward_cost(a, "EXTEND", b, P, 0, 1)["flops"]
        depth = torch.tensor([0, 1, 1, 2, 2, 2, 3, 3, 4])
        with _counter() as fc:
            run_target(model, ids[:, :n], (P + depth)[None].expand(b, n), cache, ForwardMode.TARGET_VERIFY,
                       [1, 3, 5], _tree_mask(parents, b, P))
        assert fc.get_total_flops() == forward_cost(a, "TARGET_VERIFY", b, n, P, n)["flops"]
    # and the table's own rows say the same for its shapes
    t = wb.shapes.cost(TARGET, batch=b, prompt_len=P, budgets=[n - 1])
    assert t.forward("TARGET_VERIFY", n - 1)["flops"] == forward_cost(a, "TARGET_VERIFY", b, n, P, n)["flops"]


def test_draft_flops_equal_flop_counter_on_embedded_drafter():
    from dflash.model import DFlashDraftModel
    from transformers import AutoModelForCausalLM, DynamicCache

    from workbench.models.run import run_draft

    target = AutoModelForCausalLM.from_pretrained(TARGET).eval()
    draft = DFlashDraftModel.from_pretrained(DRAFT).eval()
    d = arch(DRAFT)
    b, P, B, c = 2, 20, d.draft["block_size"], 5
    F = d.draft["context_features"]
    g = torch.Generator().manual_seed(0)
    block = torch.zeros(b, B, dtype=torch.long)
    with torch.inference_mode():
        cache = DynamicCache(config=draft.config)
        run_draft(draft, target, block, torch.arange(P + B)[None].expand(b, P + B), torch.randn(b, P, F, generator=g),
                  cache)
        cache.crop(-B)  # keep the P context rows, as the engine does after a block
        with _counter() as fc:
            run_draft(draft, target, block, torch.arange(P, P + c + B)[None].expand(b, c + B),
                      torch.randn(b, c, F, generator=g), cache)
    assert fc.get_total_flops() == forward_cost(d, "DRAFT", b, B, P, B - 1, context=c)["flops"]
    assert d.params == sum(p.numel() for p in draft.parameters())  # no embedding, no LM head: the target's


def _hf_params(cls_name: str, cfg_name: str, cfg: dict) -> int:
    import transformers

    conf = getattr(transformers, cfg_name)(**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        m = getattr(transformers, cls_name)(conf)
    return sum(p.numel() for p in m.parameters())


TINY = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=96, max_position_embeddings=256)
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


@pytest.mark.parametrize("model_type,cls,conf,cfg", [
    ("qwen3", "Qwen3ForCausalLM", "Qwen3Config", TINY),
    ("llama", "LlamaForCausalLM", "LlamaConfig", TINY),
    ("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(TINY, **MOE, mlp_only_layers=[1])),
    ("deepseek_v3", "DeepseekV3ForCausalLM", "DeepseekV3Config",
     dict(TINY, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16,
          v_head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
          first_k_dense_replace=1, n_group=2, topk_group=1)),
    ("qwen3_next", "Qwen3NextForCausalLM", "Qwen3NextConfig",
     dict(TINY, **LINEAR, **MOE, shared_expert_intermediate_size=32, full_attention_interval=2)),
    ("qwen3_5_text", "Qwen3_5ForCausalLM", "Qwen3_5TextConfig",
     dict(TINY, **LINEAR, layer_types=["linear_attention", "full_attention"] * 2)),
])
def test_weight_count_equals_transformers_model(model_type, cls, conf, cfg):
    assert arch(dict(cfg, model_type=model_type)).params == _hf_params(cls, conf, cfg)


def test_published_parameter_counts():
    # model cards: Qwen3-8B 8.2B; Qwen3-Coder-30B-A3B 30.5B total, 3.3B activated; DeepSeek-V3 671B / 37B
    # (without its 14B multi-token-prediction module); Qwen3-Next-80B-A3B 80B / 3B activated, which counts
    # neither the embedding nor the LM head (2 x 0.31B; the other cards count both)
    for cfg, total, active, tables in (("qwen3-8b", 8.2e9, 8.2e9, 0), ("qwen3-coder-30b-a3b", 30.5e9, 3.3e9, 0),
                                       (DEEPSEEK_V3, 671e9, 37e9, 0), (QWEN3_NEXT, 80e9, 3e9, 2)):
        a = arch(cfg)
        assert abs(a.params / total - 1) < 0.02, (a.name, a.params)
        assert abs((a.active_params - tables * a.vocab * a.hidden) / active - 1) < 0.1, (a.name, a.active_params)


def test_dense_decode_reads_the_weights_once():
    for cfg in (TARGET, "qwen3-8b"):
        a = arch(cfg)
        c = forward_cost(a, "DECODE", 4, 1, 100, 1)
        # every weight except the embedding table (only 4 rows are gathered); tied: the table is the LM head
        assert c["weight_bytes"] == 2 * (a.params - (0 if a.tied else a.vocab * a.hidden))
        assert c["kv_bytes"] == 4 * a.kv_per_token * 101 * 2
        assert c["logits_bytes"] == 4 * a.vocab * 2


def test_moe_reads_the_experts_its_tokens_touch():
    a = arch("qwen3-coder-30b-a3b")
    L = a.layers[0]
    assert (L.experts, L.topk) == (128, 8)
    one = forward_cost(a, "DECODE", 1, 1, 512, 1)
    # one token: its 8 experts per layer, i.e. the active weights (less the embedding table)
    assert one["weight_bytes"] == 2 * (a.active_params - a.vocab * a.hidden)
    # flops per token follow the active weights too, not the total
    dense_flops = 2 * (a.active_params - a.vocab * a.hidden - sum(x.other_params for x in a.layers) - a.hidden)
    assert one["flops"] - one["attention_flops"] - a.rope_dim == dense_flops
    wide = forward_cost(a, "EXTEND", 8, 512, 0, 1)  # 4096 tokens touch every expert
    assert wide["weight_bytes"] == pytest.approx(2 * (a.params - a.vocab * a.hidden), rel=1e-9)
    assert experts_touched(128, 8, 1) == pytest.approx(8)
    assert 8 < experts_touched(128, 8, 2) < 16  # two tokens mostly pick different experts
    verify = [forward_cost(a, "TARGET_VERIFY", 1, 1 + B, 512, 1 + B, tree_states=True)["weight_bytes"]
              for B in (0, 1, 4, 16, 64)]
    assert verify == sorted(verify) and verify[-1] > 5 * verify[0]  # a tree touches more experts: not free
    assert wb.shapes.cost("qwen3-coder-30b-a3b", batch=1).free_budget < wb.shapes.cost("qwen3-8b", batch=1).free_budget


def test_mla_caches_the_latent():
    a = arch(DEEPSEEK_V3)
    assert {L.kind for L in a.layers} == {"mla"} and a.kv_per_token == 61 * (512 + 64)
    c = forward_cost(a, "DECODE", 3, 1, 1000, 1)
    assert c["kv_bytes"] == 3 * 61 * 576 * 1001 * 2
    # the same attention as plain multi-head K/V (128 heads x (192 + 128)) would cache 71x more per token
    assert 128 * (192 + 128) / 576 > 70
    assert [L.experts for L in a.layers[:4]] == [0, 0, 0, 256]  # first_k_dense_replace = 3


def test_hybrid_state_traffic():
    a = arch(QWEN3_NEXT)
    kinds = [L.kind for L in a.layers]
    assert kinds.count("linear") == 36 and kinds.count("attention") == 12 and kinds[3] == "attention"
    state = 32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 2  # float32 state + bf16 conv window per layer
    b, P = 2, 512
    dec = forward_cost(a, "DECODE", b, 1, P, 1)
    assert dec["state_bytes"] == b * 36 * 2 * state  # read once, written once
    assert dec["kv_bytes"] == b * 12 * (2 * 2 * 256) * (P + 1) * 2  # only the full-attention layers cache K/V
    ver = forward_cost(a, "TARGET_VERIFY", b, 17, P, 17, tree_states=True)
    assert ver["state_bytes"] == b * 36 * (1 + 17) * state  # one intermediate state per tree node
    t = wb.shapes.cost(QWEN3_NEXT, batch=1, budgets=[16])
    assert t.forward("TARGET_VERIFY", 16)["state_bytes"] == ver["state_bytes"] // b


def test_free_budget_is_solved_and_shrinks_with_batch():
    free = {}
    for batch in (1, 8):
        t = wb.shapes.cost("qwen3-8b", gpu="H200", batch=batch, prompt_len=512, budgets=[16, 64])
        B = t.free_budget
        limit = 1.1 * t.decode["seconds"]
        assert t.verify_seconds(B) <= limit < t.verify_seconds(B + 1)  # the largest integer, not a listed budget
        free[batch] = B
    assert 0 < free[8] < free[1]
    # the ridge point: a dense verify turns compute-bound near FLOP/s / bandwidth tokens per batch
    ridge = wb.shapes.cost_gpus()["H200"].ridge
    assert 0.5 * ridge < free[1] < 1.5 * ridge and 0.5 * ridge / 8 < free[8] < 1.5 * ridge / 8


def test_rows_and_roofline():
    t = wb.shapes.cost("qwen3-8b", gpu="H100", batch=2, prompt_len=256, budgets=[4, 1024],
                       draft_config="qwen3-8b-dflash-b16")
    assert [r["mode"] for r in t.rows] == ["EXTEND", "DECODE", "TARGET_VERIFY", "TARGET_VERIFY", "DRAFT"]
    g = t.gpu
    for r in t.rows:
        assert {"mode", "budget", "tokens", "flops", "bytes", "intensity", "seconds", "bound"} <= set(r)
        assert r["seconds"] == max(r["flops"] / g.flops, r["bytes"] / g.bandwidth)
        assert r["bound"] == ("compute" if r["intensity"] > g.ridge else "memory")
    by = {(r["mode"], r["budget"]): r for r in t.rows}
    assert by["DECODE", None]["bound"] == "memory" and by["EXTEND", None]["bound"] == "compute"
    assert by["TARGET_VERIFY", 4]["tokens"] == 2 * 5 and by["TARGET_VERIFY", 1024]["bound"] == "compute"
    custom = wb.shapes.cost("qwen3-8b", gpu=(g.flops, g.bandwidth), batch=2, prompt_len=256, budgets=[4])
    assert custom.rows[1]["seconds"] == t.rows[1]["seconds"]
    assert wb.shapes.cost("qwen3-8b", gpu="h200").gpu.name == wb.shapes.cost("qwen3-8b", gpu="H200 SXM").gpu.name
    assert "free budget" in repr(t)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gpu="H300"), r"unknown gpu='H300'; known: H100, H200, B200, A100 80GB, RTX PRO 6000 Blackwell"),
    (dict(gpu=(1e15,)), r"custom GPU is \(peak FLOP/s, bandwidth"),
    (dict(batch=0), r"batch=0 must be a positive integer"),
    (dict(budgets=[16, -1]), r"budgets \[-1\]"),
    (dict(prompt_len=40900, budgets=[256]), r"exceeds max_position_embeddings 40960"),
    (dict(draft_config="qwen3-8b"), r"draft_config is not a DFlash drafter"),
    (dict(dtype="int3"), r"dtype='int3'"),
])
def test_bad_input_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        wb.shapes.cost("qwen3-8b", **kwargs)


def test_bad_configs():
    with pytest.raises(ValueError, match=r"model_type='gpt2' has no cost model; known: deepseek_v3"):
        wb.shapes.cost({"model_type": "gpt2", "hidden_size": 8})
    with pytest.raises(ValueError, match=r"not a file, a directory with config.json, or a shipped config \(.*qwen3-8b"):
        wb.shapes.cost("no-such-model")
    with pytest.raises(ValueError, match=r"lacks the field 'num_experts_per_tok'"):
        wb.shapes.cost({**arch_cfg("qwen3-coder-30b-a3b"), "num_experts_per_tok": None})
    with pytest.raises(ValueError, match="pass it as draft_config"):
        wb.shapes.cost("qwen3-8b-dflash-b16")


def arch_cfg(name):
    from workbench.shapes.cost import load_config

    return load_config(name)


def test_nested_text_config_is_unwrapped():
    wrapped = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
               "text_config": dict(QWEN3_NEXT, model_type="qwen3_5_text")}
    assert arch(wrapped).params == arch(dict(QWEN3_NEXT, model_type="qwen3_5_text")).params


def test_predicted_speedup():
    t = wb.shapes.cost("qwen3-8b", gpu="H200", batch=1, draft_config="qwen3-8b-dflash-b16")
    taus = {4: 3.0, 16: 4.0, 64: 4.6, 1024: 5.0}
    sp = t.speedup(taus)
    dec, draft = t.decode["seconds"], t.forward("DRAFT")["seconds"]
    for r in sp.rows:
        assert r["speedup"] == pytest.approx(taus[r["budget"]] * dec / (draft + t.verify_seconds(r["budget"])))
    assert sp.best == max(sp.rows, key=lambda r: r["speedup"])
    assert sp.best["budget"] == 64  # 1024 nodes are compute-bound: their extra tau does not pay
    assert wb.shapes.speedup(t, {16: 1.0}).rows[0]["speedup"] < 1  # a drafter that never hits only costs time
    with pytest.raises(ValueError, match="below 1"):
        t.speedup({16: 0.5})
    with pytest.raises(TypeError, match="budget_needed"):
        t.speedup([4.0])


def test_speedup_from_budget_needed():
    from workbench.bench.analysis_speed import synthetic_trace

    need = wb.analysis.budget_needed(synthetic_trace(cycles=40, budget=16, record_topk=16, depth=6, vocab=64))
    t = wb.shapes.cost("qwen3-8b", batch=1, draft_config="qwen3-8b-dflash-b16")
    sp = t.speedup(need)
    assert [r["budget"] for r in sp.rows] == [1, 2, 4, 8, 16]
    assert [r["tau"] for r in sp.rows] == [need.tau_at(B) for B in (1, 2, 4, 8, 16)]


def test_cost_figures():
    pytest.importorskip("plotly")
    t = wb.shapes.cost("qwen3-8b", gpu="H200", batch=1)
    fig = wb.views.verify_cost_figure([t.curve([0, 16, 64, 256, 1024])], measured={0: 0.004, 16: 0.006, 64: 0.01})
    names = [tr.name for tr in fig.data if tr.name]
    assert any("H200" in n for n in names) and any("other regime" in n for n in names)
    free = [tr for tr in fig.data if tr.mode == "markers"][0]
    assert list(free.x) == [t.free_budget]
    measured = [tr for tr in fig.data if "other regime" in (tr.name or "")][0]
    assert list(measured.y) == pytest.approx([1.0, 1.5, 2.5])
    sfig = wb.views.speedup_figure(t.speedup({4: 3.0, 16: 4.0}))
    assert len(sfig.data) == 2 and list(sfig.data[1].x) == [t.speedup({4: 3.0, 16: 4.0}).best["budget"]]


def test_plan_and_cost_read_configs_alike(tmp_path):
    """One reader (families.load_config): shipped names (dots included), paths and dicts give the same
    facts and name to plan() and cost(); a missing path is refused, not taken for a shipped name."""
    from workbench.shapes import families

    for name in ("llama-3.1-8b-instruct", "qwen3.6-35b-a3b"):  # Path(name).stem would cut at the dot
        by_path = families.CONFIGS / f"{name}.json"
        assert arch(name).name == arch(by_path).name == name
        assert arch(name).params == arch(families.load_config(by_path)).params
    with pytest.raises(ValueError, match="is not a file, a directory with config.json, or a shipped config"):
        arch(tmp_path / "qwen3-8b.json")
    with pytest.raises(ValueError, match="is not a file, a directory with config.json, or a shipped config"):
        wb.shapes.plan(tmp_path / "qwen3-8b.json")
    with pytest.raises(ValueError, match="target_config is a DFlash drafter"):
        wb.shapes.plan("qwen3-8b-dflash-b16")  # refused before any model is built, as cost() refuses it
    wide = {**arch_cfg("qwen3-8b"), "hidden_size": 5120}
    for call in (wb.shapes.cost, wb.shapes.plan):  # the same pairing check in both
        with pytest.raises(ValueError, match=r"hidden size differs: target 5120 vs draft 4096"):
            call(wide, draft_config="qwen3-8b-dflash-b16")


def test_cost_and_families_agree_on_structure():
    from workbench.shapes import families

    for name in ("qwen3-8b", "qwen3-coder-30b-a3b", "deepseek-v3", "qwen3-next-80b-a3b", "qwen3.6-35b-a3b"):
        a, f = arch(name), families.facts(arch_cfg(name))
        assert a.params == f.params["total"] and a.active_params == f.active_params + f.params["embed"]
        assert a.kv_per_token * 2 == families.kv_bytes_per_token(f, "bfloat16")
        assert [L.experts > 0 for L in a.layers] == [i in f.moe_layers for i in range(f.layers)]
        if f.experts:
            for n in (1, 17, 4096):
                assert experts_touched(f.experts, f.experts_per_token, n) == families.experts_touched(f, n)["uniform"]
    # state traffic uses SGLang's MambaPool dtypes (bf16 conv window, float32 state) whatever the model dtype
    a = arch("qwen3-next-80b-a3b")
    for e in (2, 4):
        dec = forward_cost(a, "DECODE", 2, 1, 64, 1, dtype_bytes=e)
        assert dec["state_bytes"] == 2 * 2 * families.linear_state_bytes_per_request(a.facts)


def test_structure_defaults_follow_transformers():
    from workbench.shapes import families

    cfg = {k: v for k, v in DEEPSEEK_V3.items() if k != "first_k_dense_replace"}
    assert families.facts(cfg).moe_layers[0] == 3  # DeepseekV3Config's default
    with pytest.raises(ValueError, match="moe_layer_freq=2: only 1 is modelled"):
        arch(dict(DEEPSEEK_V3, moe_layer_freq=2))
    assert families.facts(dict(TINY, **LINEAR, model_type="qwen3_5_text")).linear.conv_kernel == 4


# ------------------------------------------------------------------------------------------ bad configs and inputs
def _one_line(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("field, value", [("hidden_size", "4096"), ("num_attention_heads", 0),
                                          ("num_key_value_heads", 2.0), ("num_hidden_layers", True),
                                          ("decoder_sparse_step", 0)])
def test_a_bad_config_field_is_named_in_one_line_by_cost_and_plan(field, value):
    """A string width (once a TypeError deep in cost), a zero head count (once accepted by cost, a crash in
    plan), a float or bool count, a zero stride (a ZeroDivisionError): refused before anything is built."""
    cfg = {**arch_cfg("qwen3-coder-30b-a3b"), field: value}
    for call in (wb.shapes.cost, wb.shapes.plan):
        _one_line(lambda: call(cfg), rf"target config field {field}={value!r} must be an? (positive )?integer")


def test_a_bad_drafter_block_size_is_named():
    dcfg = arch_cfg("qwen3-8b-dflash-b16")
    dcfg = {**dcfg, "block_size": 0, "dflash_config": {**(dcfg.get("dflash_config") or {}), "block_size": 0}}
    for call in (wb.shapes.cost, wb.shapes.plan):
        _one_line(lambda: call("qwen3-8b", draft_config=dcfg), "draft config field block_size=0 must be an integer >= 2")


@pytest.mark.parametrize("block_size", [0, 1, -4, 8.0, "16"])
def test_plan_refuses_a_bad_block_size_instead_of_taking_16(block_size):
    _one_line(lambda: wb.shapes.plan("qwen3-8b", block_size=block_size),
              rf"block_size={block_size!r} must be an integer >= 2")


def test_plan_keeps_a_given_block_size_and_defaults_to_the_drafters():
    p = wb.shapes.plan("qwen3-8b", batch=1, prompt_len=8, budget=2, block_size=4)
    assert any("(4 tokens)" in label for label, _ in p.forwards), [label for label, _ in p.forwards]


@pytest.mark.parametrize("taus, match", [({16: float("inf")}, "tau inf at budget 16 must be a finite number"),
                                         ({16: float("nan")}, "tau nan at budget 16 must be a finite number"),
                                         ({16: "4"}, "tau '4' at budget 16 must be a finite number"),
                                         ({4: 6.0}, "tau 6.0 at budget 4 is above 5"),
                                         ({16.5: 4.0}, "acceptance budget 16.5 must be a non-negative integer")])
def test_speedup_refuses_impossible_taus_in_one_line(taus, match):
    t = wb.shapes.cost("qwen3-8b", budgets=[4, 16])
    _one_line(lambda: t.speedup(taus), match)
    _one_line(lambda: t.speedup({16: 4.0}, overhead_s=float("inf")), "overhead_s=inf must be a finite number")
    assert "infx" not in repr(t.speedup({4: 5.0, 16: 17.0}))  # the largest possible taus still print numbers


# ------------------------------------------------------------------- tensor parallelism, DFlash, the sweep
def test_ring_collectives_match_the_formula_by_hand():
    from workbench.shapes.parallel import Interconnect, all_gather_seconds, all_reduce_seconds

    link = Interconnect("test", 100e9, 2e-6)
    # all-reduce of 1 MB over 4 GPUs: 2 x 3/4 x 1e6 / 1e11 = 15 us of bandwidth + 2 x 3 steps x 2 us = 12 us
    assert all_reduce_seconds(1e6, 4, link) == pytest.approx(15e-6 + 12e-6)
    # all-gather of 1 MB over 8 GPUs: 7/8 x 1e6 / 1e11 = 8.75 us + 7 steps x 2 us = 14 us
    assert all_gather_seconds(1e6, 8, link) == pytest.approx(8.75e-6 + 14e-6)
    assert all_reduce_seconds(1e6, 1, link) == all_gather_seconds(1e6, 1, link) == 0.0


def test_tp8_decode_of_qwen3_8b_by_hand():
    """Qwen3-8B, one DECODE token, batch 1, TP8 over a link of 366 GB/s and 1 us per step, on H200."""
    from workbench.shapes.parallel import resolve_interconnect

    t1 = wb.shapes.cost("qwen3-8b", gpu="H200", batch=1, prompt_len=512, budgets=[16])
    t8 = wb.shapes.cost("qwen3-8b", gpu="H200", batch=1, prompt_len=512, budgets=[16], tp=8, interconnect="nvlink")
    d1, d8 = t1.decode, t8.decode
    link = resolve_interconnect("nvlink")
    assert (link.bandwidth, link.latency) == (366e9, 1e-6)
    # two all-reduces per layer of 1 token x 4096 hidden x 2 bytes = 8192 bytes, 36 layers:
    per = 2 * 7 / 8 * 8192 / 366e9 + 2 * 7 * 1e-6
    # the LM head's logits all-gathered once: 151936 x 2 bytes
    gather = 7 / 8 * 151936 * 2 / 366e9 + 7 * 1e-6
    assert d8["all_reduce_s"] == pytest.approx(2 * 36 * per)
    assert d8["all_gather_s"] == pytest.approx(gather)
    # weights split 8 ways; K/V split by its 8 K/V heads: every byte / 8; FLOPs / 8
    assert d8["bytes_per_gpu"] == pytest.approx(d1["bytes"] / 8, rel=1e-6)
    assert d8["memory_s"] == pytest.approx(d1["bytes"] / 8 / 4.8e12, rel=1e-6)
    assert d8["seconds"] == pytest.approx(max(d1["flops"] / 8 / 989e12, d1["bytes"] / 8 / 4.8e12) + d8["comm_s"],
                                          rel=1e-6)
    # TP1 is the plain roofline, no collectives
    assert d1["comm_s"] == 0 and d1["seconds"] == pytest.approx(max(d1["flops"] / 989e12, d1["bytes"] / 4.8e12))


def test_kv_splits_by_kv_heads_and_mla_latent_is_whole():
    from workbench.shapes.parallel import kv_split

    assert kv_split(arch("qwen3-8b"), 4) == 4 and kv_split(arch("qwen3-8b"), 16) == 8  # 8 K/V heads at most
    assert kv_split(arch(DEEPSEEK_V3), 8) == 1
    # at TP16 qwen3-8b: weights / 16 but K/V / 8
    t = wb.shapes.cost("qwen3-8b", budgets=[0], prompt_len=4096, tp=16, interconnect="pcie5")
    c = t.decode
    assert c["bytes_per_gpu"] == pytest.approx((c["bytes"] - c["kv_bytes"]) / 16 + c["kv_bytes"] / 8, rel=1e-9)


def test_bad_tp_and_interconnect_are_one_line():
    with pytest.raises(ValueError, match=r"^tp=0 must be a positive integer"):
        wb.shapes.cost("qwen3-8b", tp=0)
    with pytest.raises(ValueError, match=r"^unknown interconnect='infiniband'; known: nvlink, pcie5"):
        wb.shapes.cost("qwen3-8b", tp=2, interconnect="infiniband")
    with pytest.raises(ValueError, match=r"^overhead_s=-1"):
        wb.shapes.cost("qwen3-8b", overhead_s=-1)


@pytest.mark.parametrize("tp", [3, 64, 1000])
def test_a_tp_no_engine_can_shard_is_refused_with_the_valid_degrees(tp):
    """Qwen3-8B has 32 attention heads: 3, 64 or 1000 GPUs cannot each hold a whole number of them."""
    from workbench.shapes.parallel import TensorParallelError

    with pytest.raises(TensorParallelError) as e:
        wb.shapes.cost("qwen3-8b", tp=tp)
    assert str(e.value) == (f"tp={tp} cannot shard qwen3-8b: its 32 attention heads do not split {tp} ways; "
                            "valid tp for it: 1, 2, 4, 8, 16, 32")
    assert isinstance(e.value, ValueError)


def test_kv_heads_split_or_replicate_evenly_and_linear_heads_split():
    """K/V heads either split tp ways or, past them, replicate (tp a multiple of them, as vLLM and SGLang
    replicate K/V heads); a GatedDeltaNet layer's key and value heads must split tp ways too. The drafter runs
    at its target's TP, so a drafter that cannot shard is refused as well."""
    from workbench.shapes.parallel import TensorParallelError, valid_tp

    odd = dict(arch_cfg("qwen3-8b"), num_attention_heads=28, num_key_value_heads=4)  # Qwen2.5-7B's heads
    assert valid_tp(arch(odd)) == [1, 2, 4, 28]  # 7 and 14 divide 28 but neither split nor replicate 4 K/V heads
    with pytest.raises(TensorParallelError, match=r"^tp=14 cannot shard .*: its 4 K/V heads neither split 14 ways "
                       r"nor replicate evenly \(vLLM and SGLang replicate K/V heads when tp exceeds them, which "
                       r"needs tp to be a multiple of 4\); valid tp for it: 1, 2, 4, 28$"):
        wb.shapes.cost(odd, tp=14)
    assert wb.shapes.cost(odd, tp=28).settings["tp"] == 28  # 7 replicas of each K/V head
    assert wb.shapes.cost("qwen3-8b", tp=16).settings["tp"] == 16  # 8 K/V heads, each on 2 GPUs
    assert valid_tp(arch(QWEN3_NEXT)) == [1, 2, 4, 8, 16]
    lin = dict(QWEN3_NEXT, linear_num_key_heads=8)  # 16 attention heads split 16 ways; 8 key heads do not
    with pytest.raises(TensorParallelError, match=r"^tp=16 cannot shard .*: its 8 linear-attention key heads do "
                       r"not split 16 ways; valid tp for it: 1, 2, 4, 8$"):
        wb.shapes.cost(lin, tp=16)
    assert wb.shapes.cost("kimi-k2", tp=64).settings["tp"] == 64  # MLA: 64 heads, the latent whole on every GPU
    draft = dict(arch_cfg("qwen3-8b-dflash-b16"), num_attention_heads=24, num_key_value_heads=8)
    with pytest.raises(TensorParallelError, match=r"^tp=16 cannot shard .*: its 24 attention heads"):
        wb.shapes.cost("qwen3-8b", tp=16, draft_config=draft)


@pytest.mark.parametrize("tp", [1, 4])
def test_an_unknown_interconnect_is_refused_at_any_tp(tp):
    """At tp=1 no collective runs, but a misspelt link must not pass there and fail only once tp changes."""
    with pytest.raises(ValueError, match=r"^unknown interconnect='infiniband'; known: nvlink, pcie5; or pass "
                       r"\(bandwidth, latency\)$"):
        wb.shapes.cost("qwen3-8b", tp=tp, interconnect="infiniband")
    assert wb.shapes.cost("qwen3-8b", tp=1, interconnect="pcie5").settings["interconnect"] is None


def test_linear_dflash_row_is_the_chain_verify_plus_the_draft_plus_overhead():
    t = wb.shapes.cost("qwen3-8b", budgets=[16, 32], draft_config="qwen3-8b-dflash-b16", overhead_s=2e-3)
    assert t.chain_budget == 15  # root + 15 drafted tokens = the block of 16
    sp = t.speedup({16: 4.0, 32: 4.4}, dflash_tau=3.5)
    chain = [r for r in sp.rows if r["policy"] == "DFlash"][0]
    assert chain["cycle_s"] == pytest.approx(t.forward("DRAFT")["seconds"] + t.verify_seconds(15) + 2e-3)
    assert chain["speedup"] == pytest.approx(3.5 * t.decode["seconds"] / chain["cycle_s"])
    for r in sp.rows:
        if r["policy"] == "DDTree":
            assert r["vs_dflash"] == pytest.approx(r["speedup"] / chain["speedup"])
    assert sp.best["policy"] == "DDTree"
    # a larger per-step overhead shrinks every speedup
    slower = t.speedup({16: 4.0, 32: 4.4}, overhead_s=10e-3, dflash_tau=3.5)
    assert all(a["speedup"] > b["speedup"] for a, b in zip(sp.rows, slower.rows))


def test_a_tree_is_dearer_under_tp_over_pcie_than_nvlink():
    t = wb.shapes.parallelism_table(configs=("qwen3-8b",), nodes=(1, 17, 65))
    row = {(r["system"][1], r["tp"]): r for r in t.rows}
    assert row["nvlink", 1]["ratio"][17] == pytest.approx(1.0, abs=0.01)  # memory-bound at TP1: 16 nodes free
    assert row["nvlink", 1]["comm_share"] == 0 and row["pcie5", 8]["comm_share"] > row["nvlink", 8]["comm_share"] > 0
    assert row["pcie5", 8]["ratio"][65] > row["nvlink", 8]["ratio"][65] > row["nvlink", 1]["ratio"][65]
    assert len(t.headline()) == 2 and "TP8" in t.headline()[0]


def test_sweep_error_is_prediction_over_measurement():
    """A synthetic sweep: the error is predicted / measured - 1 per point, with the median and max of |error|;
    a planted slowdown (measured x2) is named as -50%."""
    from workbench.shapes.measured import predict_forward, sweep_error

    t = dict(json.loads(open("workbench/configs/qwen3-8b.json").read()), num_hidden_layers=2)
    dev = {"name": "test", "flops": 1e12, "bandwidth": 1e11, "op_seconds": 1e-6, "dtype": "bfloat16", "threads": 1}
    pts = []
    for n in (1, 16):
        pred = predict_forward(arch(t), "verify", 1, n, 512 + 16, 0, 2, SimpleNamespace(**dev), 100)["seconds"]
        pts.append({"kind": "verify", "mode": "eager", "rows": 1, "nodes": n, "keys": 528, "context_rows": 0,
                    "ops": 100, "median_s": pred * (2 if n == 16 else 1)})
    err = sweep_error({"settings": {"model": "t", "dtype": "bfloat16", "device": "test"}, "device": dev,
                       "points": pts, "target_config": t, "draft_config": None})
    assert [round(r["rel_error"], 6) for r in err.rows] == [0.0, -0.5]
    assert err.median_rel_error == pytest.approx(0.25) and err.max_rel_error == pytest.approx(0.5)
    # launch term: 100 ops x 1 us
    assert err.rows[0]["launch_s"] == pytest.approx(100e-6)
    # calibrate: the smallest point sets the seconds per op (here measured = roofline + 100 ops x 1 us, so the
    # same 1 us) and leaves the error figures; the planted point's error stays
    cal = sweep_error({"settings": {"model": "t", "dtype": "bfloat16", "device": "test"}, "device": dev,
                       "points": pts, "target_config": t, "draft_config": None}, calibrate=True)
    assert [r["calibration"] for r in cal.rows] == [True, False]
    assert cal.rows[0]["launch_s"] == pytest.approx(100e-6) and cal.median_rel_error == pytest.approx(0.5)


def test_weight_bits_scale_the_layer_weights_only():
    """A quantized target: its layers' matmul weights at weight_bits / 8 bytes, the K/V cache, norms and the
    (untied) LM head at the dtype's 2 bytes."""
    plain = wb.shapes.cost("qwen3-8b", gpu="H200", budgets=[16])
    q = wb.shapes.cost("qwen3-8b", gpu="H200", budgets=[16], weight_bits=4.5)
    a, b = plain.decode, q.decode
    assert b["kv_bytes"] == a["kv_bytes"] and b["logits_bytes"] == a["logits_bytes"]
    layers = sum(L.matmul_params for L in plain.target.layers)
    assert a["weight_bytes"] - b["weight_bytes"] == pytest.approx(layers * (2 - 4.5 / 8), rel=1e-6)
    with pytest.raises(ValueError, match=r"weight_bits=0 must be a number of bits per weight from 1 to 32"):
        wb.shapes.cost("qwen3-8b", weight_bits=0)
