"""wb.shapes.plan and wb.shapes.families on every shipped full-size config: dense (Qwen3, Llama), MoE
(Qwen3-Coder-30B-A3B), MLA (DeepSeek-V3, Kimi-K2) and hybrid (Qwen3-Next, Qwen3.6 with a nested text_config).

Expected numbers are computed here from the config.json values with the published formulas (not through
families.py), so a wrong width, layer count or dtype in either place fails.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import workbench as wb
from workbench.shapes import families
from workbench.shapes.plan import CONFIGS
from workbench.shapes.sglang_source import sglang_def

TARGETS = sorted(p.stem for p in CONFIGS.glob("*.json") if "dflash" not in p.stem)
DRAFTS = {p.stem.removesuffix("-dflash").removesuffix("-dflash-b16"): p for p in CONFIGS.glob("*dflash*.json")}
BS, P, BUDGET = 2, 8, 4  # small on purpose: on the meta device only the layer count costs time


def load(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def text(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


def test_every_family_ships_a_config():
    fams = {families.facts(load(n)).family for n in TARGETS}
    assert fams == {"dense", "moe", "mla", "hybrid"}, TARGETS
    assert {"qwen3-8b", "llama-3.1-8b-instruct", "qwen3-coder-30b-a3b", "deepseek-v3", "kimi-k2",
            "qwen3-next-80b-a3b", "qwen3.6-35b-a3b"} <= set(TARGETS)
    for name, path in DRAFTS.items():  # every drafter config names a shipped target and fits its depth
        d = json.loads(path.read_text())
        assert name in TARGETS, path.name
        assert d["num_target_layers"] == text(load(name))["num_hidden_layers"], path.name
        assert d["hidden_size"] == text(load(name))["hidden_size"], path.name


@pytest.mark.parametrize("name", TARGETS)
def test_param_formulas_equal_the_meta_model(name):
    """families' parameter count is transformers' own: the model built on the meta device, weight by weight."""
    import transformers

    t = families.text_config(load(name))
    row = families.FAMILY_OF_MODEL_TYPE[t["model_type"]]
    config_cls, model_cls = row.config_class, row.model_class
    conf = getattr(transformers, config_cls)(**{k: v for k, v in t.items() if not k.startswith("_")})
    with torch.device("meta"):
        model = getattr(transformers, model_cls)(conf)
    assert families.facts(load(name)).params["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, total_b, active_b", [
    ("qwen3-coder-30b-a3b", 30.5, 3.3), ("qwen3-next-80b-a3b", 80, 3.9), ("deepseek-v3", 671, 37),
    ("kimi-k2", 1040, 32), ("llama-3.1-8b-instruct", 8.0, 8.0), ("qwen3-8b", 8.2, 8.2)])
def test_params_match_the_published_sizes(name, total_b, active_b):
    """Totals and active parameters per token as the model cards state them (active counted with the
    embedding there, without it here: a lookup is not a matmul)."""
    f = families.facts(load(name))
    assert f.params["total"] / 1e9 == pytest.approx(total_b, rel=0.03)
    assert (f.active_params + f.params["embed"]) / 1e9 == pytest.approx(active_b, rel=0.1)


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2"])
def test_mla_cache_is_the_latent(name):
    cfg = load(name)
    assert "head_dim" not in cfg  # MLA has none: a plan that reads head_dim stops here
    f = families.facts(cfg)
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 512 + 64
    assert families.kv_bytes_per_token(f, "bfloat16") == (512 + 64) * cfg["num_hidden_layers"] * 2
    assert families.kv_bytes_per_token(f, "float32") == (512 + 64) * cfg["num_hidden_layers"] * 4


def test_moe_experts_touched_per_token_and_per_batch():
    cfg = load("qwen3-coder-30b-a3b")
    f = families.facts(cfg)
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    assert (f.experts, f.experts_per_token, len(f.moe_layers)) == (128, 8, 48)
    assert families.experts_touched(f, 1) == {"per_token": k, "max": k, "uniform": pytest.approx(k), "shared": 0}
    assert families.experts_touched(f, 8)["max"] == 64 and families.experts_touched(f, 4096)["max"] == E
    # The uniform-routing expectation against a seeded simulation of 8 tokens each picking 8 distinct experts.
    g = torch.Generator().manual_seed(0)
    picks = torch.rand(4000, 8, E, generator=g).argsort(-1)[..., :k]  # [trials, tokens, k]
    hit = torch.zeros(4000, E, dtype=torch.bool).scatter_(1, picks.flatten(1), True)
    assert families.experts_touched(f, 8)["uniform"] == pytest.approx(hit.sum(1).float().mean().item(), rel=0.01)
    ds = families.facts(load("deepseek-v3"))  # 3 dense layers first, one shared expert
    assert (len(ds.moe_layers), ds.moe_layers[0], ds.shared_experts, ds.experts) == (58, 3, 1, 256)


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "qwen3.6-35b-a3b"])
def test_hybrid_state_bytes_from_the_config_formula(name):
    t = text(load(name))
    n = t["num_hidden_layers"]
    kinds = t.get("layer_types") or ["full_attention" if (i + 1) % t["full_attention_interval"] == 0
                                     else "linear_attention" for i in range(n)]
    lin = kinds.count("linear_attention")
    conv_dim = 2 * t["linear_num_key_heads"] * t["linear_key_head_dim"] + \
        t["linear_num_value_heads"] * t["linear_value_head_dim"]
    conv = conv_dim * (t["linear_conv_kernel_dim"] - 1) * 2  # bfloat16 (SGLang's conv dtype)
    state = t["linear_num_value_heads"] * t["linear_value_head_dim"] * t["linear_key_head_dim"] * 4  # float32
    f = families.facts(load(name))
    assert (f.linear_layers, f.attention_layers) == (lin, n - lin)
    assert families.linear_state_bytes_per_request(f) == lin * (conv + state)
    assert families.per_node_state_bytes(f) == lin * (conv + state)
    kv_tok = (n - lin) * 2 * t["num_key_value_heads"] * t["head_dim"] * 2
    assert families.kv_bytes_per_token(f, "bfloat16") == kv_tok
    for prompt in (512, 32768, 262144):  # the first budget whose 1 + budget nodes outweigh the prompt's KV
        b = families.crossover_budget(f, prompt)
        assert (1 + b) * lin * (conv + state) > prompt * kv_tok >= b * lin * (conv + state)
    assert families.crossover_budget(families.facts(load("qwen3-8b")), 512) is None


def test_linear_state_shapes_are_sglangs():
    """conv [conv_dim, K - 1] and state [HV, V, K] as SGLang's own Mamba2StateShape.create computes them
    (run from the installed source: sglang.srt does not import on a --no-deps install)."""
    pytest.importorskip("sglang", reason="sglang is installed by the README set-up")
    create = sglang_def("srt/configs/mamba_utils.py", "Mamba2StateShape.create",
                        divide=lambda a, b: a // b, Mamba2StateShape=lambda **kw: kw)
    for name in ("qwen3-next-80b-a3b", "qwen3.6-35b-a3b"):
        t, f = text(load(name)), families.facts(load(name))
        s = create(tp_world_size=1, intermediate_size=t["linear_value_head_dim"] * t["linear_num_value_heads"],
                   n_groups=t["linear_num_key_heads"], num_heads=t["linear_num_value_heads"],
                   head_dim=t["linear_value_head_dim"], state_size=t["linear_key_head_dim"],
                   conv_kernel=t["linear_conv_kernel_dim"])
        assert s["conv"] == [f.linear.conv_shape] and s["temporal"] == f.linear.state_shape


def test_nested_text_config_is_unwrapped():
    cfg = load("qwen3.6-35b-a3b")
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and "vocab_size" not in cfg
    f = families.facts(cfg)
    assert (f.model_type, f.vocab_size, f.layers) == ("qwen3_5_moe_text", 248320, 40)


@pytest.mark.parametrize("bad, named", [
    ({"model_type": "gpt_oss", "hidden_size": 8}, "'gpt_oss'"),
    ({"hidden_size": 8}, "None"),
    ({"model_type": "qwen3_5", "text_config": {"model_type": "mamba"}}, "'mamba'")])
def test_unknown_model_type_is_refused_in_one_line(bad, named):
    for call in (lambda: families.facts(bad), lambda: wb.shapes.plan(bad)):
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and f"model_type={named}" in msg and "known: deepseek_v3" in msg


def test_cli_refuses_an_unknown_family_in_one_line(tmp_path, capsys):
    from workbench.shapes.__main__ import _main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt_oss", "hidden_size": 8}))
    with pytest.raises(SystemExit) as e:
        _main(["--plan", str(cfg)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "model_type='gpt_oss' has no shape plan" in err


def test_missing_mla_field_is_named():
    cfg = {k: v for k, v in load("deepseek-v3").items() if k != "kv_lora_rank"}
    with pytest.raises(ValueError, match="target config lacks the field 'kv_lora_rank'"):
        wb.shapes.plan(cfg)


# ------------------------------------------------------------------------------------------------ plans
@pytest.fixture(scope="module")
def plans():
    return {}


def _plan(plans, name):
    if name not in plans:
        plans[name] = wb.shapes.plan(CONFIGS / f"{name}.json", batch=BS, prompt_len=P, budget=BUDGET,
                                     draft_config=DRAFTS.get(name))
    return plans[name]


def _module_out(rec, name):
    return next(m for m in rec.modules if m["name"] == name)["outputs"]


@pytest.mark.parametrize("name", TARGETS)
def test_plan_works_on_every_shipped_config(plans, name):
    cfg = load(name)
    t = text(cfg)
    p = _plan(plans, name)
    f = families.facts(cfg)
    dd_label = f"DDTree({BUDGET}) verify ({BUDGET + 1} tokens)"
    recs = dict(p.forwards)
    dd = recs[dd_label]
    n = BUDGET + 1
    assert dd.outputs["logits"]["shape"] == [BS, n, t["vocab_size"]] and (dd.kv_before, dd.kv_after) == (P, P + n)
    assert recs["prefill"].outputs["logits"]["shape"] == [BS, 1, t["vocab_size"]]
    if name in DRAFTS:
        assert any(r.model == "draft" for r in recs.values())
    held = p.state_bytes(dd_label)  # {kind: bytes}
    per_tok = next(s for s in p.states[dd_label] if s.kind == "per_token")
    assert held["per_token"] == per_tok.bytes == BS * (P + n) * families.kv_bytes_per_token(f, "bfloat16")
    sg = {r["tensor"]: r for r in p.sglang(mode="TARGET_VERIFY") if r["forward"].startswith(dd_label)}
    if f.family == "mla":  # latent cache: (512 + 64) per token per layer, no head_dim anywhere
        assert per_tok.shape == (BS, P + n, t["kv_lora_rank"] + t["qk_rope_head_dim"])
        assert sg["kv_buffer (MLA latent)"]["shape"] == [t["num_hidden_layers"], BS * (P + n), 1, 576]
        layer0 = _module_out(dd, "model.layers.0.self_attn.kv_a_proj_with_mqa")["output"]
        assert layer0["shape"] == [BS, n, 576]  # the projection whose output is cached
    else:
        kvd = t["num_key_value_heads"] * t["head_dim"]
        row = next(r for r in p.compare() if r["module"] == "(kv cache)")[dd_label]
        assert row["shape"] == [f.attention_layers, 2, BS, P + n, kvd]  # only attention layers hold KV
        assert row["bytes"] == per_tok.bytes
    if f.experts:
        moe0 = f.moe_layers[0]
        gate = _module_out(dd, f"model.layers.{moe0}.mlp.gate")
        assert gate["output.0"]["shape"] == [BS * n, f.experts]  # router logits [tokens, experts]
        assert gate["output.2"]["shape"] == [BS * n, t["num_experts_per_tok"]]  # expert ids [tokens, k]
        assert sg["router_logits"]["shape"] == [BS * n, f.experts]
        assert p.experts[dd_label]["max"] == min(f.experts, BS * n * t["num_experts_per_tok"])
    if f.linear is not None:
        lin = f.linear_layers
        assert held["per_request"] == BS * families.linear_state_bytes_per_request(f)
        assert held["scratch_per_node"] == BS * n * families.per_node_state_bytes(f)
        assert sg["intermediate_ssm"]["shape"] == [lin, BS, n, *f.linear.state_shape]
        assert sg["intermediate_conv_window"]["shape"] == [lin, BS, n, *f.linear.conv_shape]
        assert "budget 0" in repr(p)  # at an 8-token prompt one node's states already outweigh its KV
    else:
        assert set(held) == {"per_token"}
    assert f"{f.params['total'] / 1e9:.2f}B" in repr(p)


def test_plan_compare_shows_the_state_rows(plans):
    p = _plan(plans, "qwen3-next-80b-a3b")
    rows = {(r["module"], r["tensor"]): r for r in p.compare(model="target")}
    dd_label = f"DDTree({BUDGET}) verify ({BUDGET + 1} tokens)"
    node = rows[("(state)", "per-node recurrent state")]
    assert node[dd_label]["shape"] == [36, BS, BUDGET + 1, 32, 128, 128] and node["AR decode"] is None
    assert node[dd_label]["bytes"] == 36 * BS * (BUDGET + 1) * 32 * 128 * 128 * 4
    assert math.prod(rows[("(state)", "recurrent state")]["prefill"]["shape"]) * 4 == \
        rows[("(state)", "recurrent state")]["prefill"]["bytes"]
