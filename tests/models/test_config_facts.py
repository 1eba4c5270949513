"""One reader of config facts (workbench.models.config_facts): every shipped config and tiny layout gives every
consumer the same layer kinds, drafter settings and dtypes, and they agree with what transformers and dflash
build from the same config."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from workbench.engine import loading, validate
from workbench.models import config_facts, hybrid, registry
from workbench.models.stand_ins import KINDS, LAYERS, common_config, draft_config, hybrid_config
from workbench.shapes import families

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "workbench" / "configs").glob("*.json"))
EMBEDDED = sorted((ROOT / "workbench" / "assets").glob("**/config.json"))


def _tiny() -> dict:
    """The tiny layouts of tests/real_layouts.py, tiny_models.py and tiny_hybrid.py, as config dicts."""
    out = {"qwen3": dict(common_config(), model_type="qwen3", num_hidden_layers=LAYERS),
           "qwen3_moe": dict(common_config(), model_type="qwen3_moe", num_hidden_layers=LAYERS, num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=16),
           "qwen3_5 nested": {"model_type": "qwen3_5", "text_config": dict(
               common_config(), num_hidden_layers=LAYERS, layer_types=["full_attention"] * LAYERS)},
           "draft": draft_config().to_dict(), "draft sliding": draft_config(sliding=True, seed_layers=2).to_dict(),
           "draft dflash2": draft_config(dflash2=True).to_dict()}
    for kind in KINDS:
        out[kind] = hybrid_config(kind).to_dict()
        # The same layout without layer_types: the full_attention_interval rule must rebuild it.
        bare = {k: v for k, v in hybrid_config(kind, layer_types=("linear_attention",) * 2 + ("full_attention",)
                                               ).to_dict().items() if k != "layer_types"}
        out[f"{kind} by interval"] = dict(bare, full_attention_interval=3)
    return out


CONFIGS = {**{p.stem: json.loads(p.read_text()) for p in SHIPPED},
           **{str(p.parent.relative_to(ROOT / "workbench" / "assets")): json.loads(p.read_text()) for p in EMBEDDED},
           **_tiny()}


def _transformers_config(cfg: dict):
    """The config transformers builds from this dict (its class from the family table; None where none is)."""
    t = config_facts.text_config(cfg)
    row = config_facts.FAMILY_OF_MODEL_TYPE.get(t.get("model_type"))
    if row is None:
        return None
    return getattr(transformers, row.config_class)(**{k: v for k, v in t.items() if not k.startswith("_")})


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_consumer_reads_the_same_layer_kinds(name):
    cfg = CONFIGS[name]
    kinds = config_facts.layer_kinds(cfg)
    kv = sum(k != "linear_attention" for k in kinds)
    # transformers' own rule (layer_types, or its full_attention_interval rule in the hybrid classes)
    tcfg = _transformers_config(cfg)
    if tcfg is not None:  # a class without layer_types (DeepSeek-V3): every layer is full attention
        theirs = getattr(tcfg, "layer_types", None) or ("full_attention",) * tcfg.num_hidden_layers
        assert kinds == tuple(theirs), name
        assert config_facts.layer_kinds(tcfg) == kinds  # a config object reads as its dict does
    assert registry.attention_layers(cfg) == config_facts.attention_layers(cfg) == kv
    assert (registry.family_of(cfg) == "hybrid") == (config_facts.linear_layers(cfg) > 0 or
                                                     config_facts.family_table(cfg).kind == "hybrid")
    row = config_facts.family_table(cfg)
    t = config_facts.text_config(cfg)
    if row is not None and row.shapes and all(t.get(f) is not None for f in families.REQUIRED[row.kind]):
        f = families.facts(cfg, "draft" if config_facts.is_drafter(cfg) else "target")
        assert f.layers == len(kinds) and f.attention_layers == kv
        assert f.linear_layers == len(kinds) - kv
    if row is not None and row.kind == "hybrid":
        cache = hybrid.HybridCache(tcfg, [0])
        assert len(cache.attn_ids) == kv and len(cache.linear_ids) == len(kinds) - kv
        specs = hybrid.linear_specs(tcfg, batch=1, nodes=2, dtype=torch.float32)
        assert {s.layers for s in specs if s.name != "retrieve_parent_token"} == {len(kinds) - kv}


def test_the_shipped_qwen3_next_config_has_12_kv_layers():
    """The registry and the shape plan agree: 12 K/V layers of 48 (one in every four is full attention)."""
    cfg = CONFIGS["qwen3-next-80b-a3b"]
    assert "layer_types" not in cfg and cfg["full_attention_interval"] == 4 and cfg["num_hidden_layers"] == 48
    assert registry.attention_layers(cfg) == families.facts(cfg).attention_layers == 12


def test_a_hybrid_layer_kind_that_is_neither_full_nor_linear_is_named():
    cfg = dict(CONFIGS["qwen3_5"], layer_types=["linear_attention", "sliding_attention", "full_attention",
                                                "linear_attention"])
    with pytest.raises(ValueError, match="must name full_attention / linear_attention for each of the 4 layers"):
        config_facts.layer_kinds(cfg)


DRAFTERS = sorted(n for n, c in CONFIGS.items() if config_facts.is_drafter(c))


def test_the_drafters_are_found():
    assert len(DRAFTERS) >= 7 and {"draft", "hybrid/draft", "qwen3-8b-dflash-b16"} <= set(DRAFTERS)
    assert not any(config_facts.is_drafter(CONFIGS[n]) for n in ("qwen3-8b", "target", "qwen3_next"))


@pytest.mark.parametrize("name", DRAFTERS)
def test_every_consumer_reads_the_same_drafter_settings(name, tmp_path):
    cfg = CONFIGS[name]
    # dflash's own drafter (on the meta device) is the oracle of how its config is read
    from dflash.model import DFlashDraftModel

    with torch.device("meta"):
        model = DFlashDraftModel(transformers.Qwen3Config(**{k: v for k, v in cfg.items() if not k.startswith("_")}))
    ids, block = list(model.target_layer_ids), model.block_size
    assert list(config_facts.draft_value(cfg, "target_layer_ids")) == ids
    assert config_facts.draft_value(cfg, "block_size", config_facts.DEFAULT_BLOCK_SIZE) == block
    assert config_facts.draft_value(model.config, "mask_token_id") == model.mask_token_id
    d = families.dflash(cfg)
    assert list(d.target_layer_ids) == ids and d.block_size == block
    with_mask = cfg if model.mask_token_id is not None else dict(cfg, mask_token_id=1)  # the loader needs one
    ds = loading.draft_settings(with_mask, tmp_path)
    assert ds.target_layer_ids == ids and ds.block_size == block
    assert ds.mask_token_id == (model.mask_token_id if model.mask_token_id is not None else 1)


def test_dflash_config_wins_over_the_top_level_in_every_reader(tmp_path):
    cfg = dict(CONFIGS["draft"], block_size=4, dflash_config={**CONFIGS["draft"]["dflash_config"], "block_size": 8})
    assert config_facts.draft_value(cfg, "block_size") == 8
    assert families.dflash(cfg).block_size == 8 and loading.draft_settings(cfg, tmp_path).block_size == 8


NAMES = [*config_facts.RUN_DTYPES, *config_facts.DTYPE_ALIASES, "BF16", "Float16"]


@pytest.mark.parametrize("name", NAMES)
def test_every_dtype_reader_agrees(name):
    dt = config_facts.torch_dtype(name)
    assert loading.resolve_dtype(name) == dt
    assert validate.dtype(name) == name and validate.dtype(dt) == dt
    assert config_facts.dtype_bytes(dt) == config_facts.dtype_bytes(config_facts.run_dtype(name)) == dt.itemsize
    assert families.dtype_bytes(dt) == registry.dtype_bytes(name.lower() if name.lower() in
                                                             config_facts.DTYPE_BYTES else dt)


@pytest.mark.parametrize("name", ["float64", "int8", "fp8", "half-precision", ""])
def test_every_dtype_reader_refuses_the_same(name):
    assert config_facts.run_dtype(name) is None
    for read in (config_facts.torch_dtype, loading.resolve_dtype, validate.dtype):
        with pytest.raises(ValueError, match=f"dtype={name!r}"):
            read(name)


def test_one_family_table_routes_states_forwards_and_shapes():
    """The engine's own dense forward, the state routing and the shape plan read one table: a model type the
    own forward covers is a dense-kind row; one the shape plan has formulas for is its own family there."""
    from workbench.models import dense_forward

    assert dense_forward.FAMILY_OF_MODEL_TYPE is registry.FAMILY_OF_MODEL_TYPE is families.FAMILY_OF_MODEL_TYPE
    own = {mt for mt, row in config_facts.FAMILY_OF_MODEL_TYPE.items() if row.own_forward}
    assert own == {"qwen3", "qwen3_moe", "qwen2", "llama", "mistral"}
    assert all(config_facts.FAMILY_OF_MODEL_TYPE[mt].kind in ("dense", "moe") for mt in own)
    with pytest.raises(ValueError, match="has no shape plan; known: .*qwen3_next"):
        families.model_type({"model_type": "qwen2"})
