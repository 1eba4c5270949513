"""Loading: one code path for the embedded pair and real checkpoints, with clear validation errors."""
from __future__ import annotations

import json
import re
import shutil

import pytest

import workbench as wb
from workbench.engine.loading import DEFAULT_DRAFT, DEFAULT_TARGET


def test_default_load_uses_the_shipped_directories(engine):
    m = engine.models
    assert m.target_dir == DEFAULT_TARGET and m.draft_dir == DEFAULT_DRAFT
    assert type(m.draft).__name__ == "DFlashDraftModel"
    assert m.target.config.model_type == "qwen3"
    n = sum(p.numel() for p in m.target.parameters())
    assert n <= 8.5e6
    assert len(m.target_layer_ids) >= 2
    assert m.tokenizer.convert_ids_to_tokens(m.mask_token_id) == "<|mask|>"


def test_shipped_weights_are_small():
    total = sum(f.stat().st_size for d in (DEFAULT_TARGET, DEFAULT_DRAFT) for f in d.iterdir())
    assert total < 40e6


def copy_pair(tmp_path):
    t, d = tmp_path / "t", tmp_path / "d"
    shutil.copytree(DEFAULT_TARGET, t)
    shutil.copytree(DEFAULT_DRAFT, d)
    return t, d


def edit(path, fn):
    cfg = json.loads((path / "config.json").read_text())
    fn(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def test_not_a_model_directory(tmp_path):
    with pytest.raises(wb.ModelPairError, match=r"target path '.*nowhere' is not a directory"):
        wb.load(target=tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(wb.ModelPairError, match=r"draft path '.*empty' is not a model directory: it has no config.json"):
        wb.load(draft=tmp_path / "empty")


@pytest.mark.parametrize("which,change,match", [
    ("d", lambda c: c.__setitem__("vocab_size", c["vocab_size"] + 8), r"vocab size differs: target \d+ .* vs draft \d+"),
    ("d", lambda c: c.__setitem__("hidden_size", 128), r"hidden size differs: target 256 .* vs draft 128"),
    ("d", lambda c: c["dflash_config"].__setitem__("target_layer_ids", [1, 9]),
     r"target_layer_ids \[1, 9\] out of range for a target with 6 layers \(bad: \[9\]\)"),
    ("d", lambda c: c["dflash_config"].pop("mask_token_id"), "no 'mask_token_id'"),
    ("d", lambda c: c.pop("dflash_config"), r"has no 'mask_token_id' \(in its dflash_config or at the top level\)"),
    ("d", lambda c: c.__setitem__("num_target_layers", 36),
     r"draft num_target_layers=36 .* but the target has 6 layers .*: the drafter was trained for another target"),
    ("d", lambda c: c["dflash_config"].__setitem__("mask_token_id", 4096),
     r"draft mask_token_id 4096 is outside the target's embedding of 4096 rows"),
    ("d", lambda c: c.__setitem__("architectures", ["Qwen3ForCausalLM"]),
     r"names architectures \['Qwen3ForCausalLM'\], not a DFlash drafter"),
    ("t", lambda c: c.update(num_hidden_layers=4, layer_types=c.get("layer_types", [None] * 6)[:4]),
     r"draft num_target_layers=6 .* but the target has 4 layers"),
])
def test_pair_validation_errors(tmp_path, which, change, match):
    t, d = copy_pair(tmp_path)
    edit(t if which == "t" else d, change)
    with pytest.raises(wb.ModelPairError, match=match):
        wb.load(target=t, draft=d)


def test_tokenizer_without_the_mask_token(tmp_path):
    """z-lab's Qwen3 drafters use mask id len(tokenizer): accepted (only its embedding is used), and said."""
    from tiny_models import make_tokenizer

    t, d = copy_pair(tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (t / f).unlink()
    small = make_tokenizer(100)  # ids 0..99 only; the drafter's mask id is beyond
    small.save_pretrained(t)
    edit(d, lambda c: c["dflash_config"].__setitem__("mask_token_id", c["vocab_size"] - 1))
    e = wb.load(target=t, draft=d)
    assert e.models.mask_token_id == 4095
    assert "note: mask_token_id 4095 has no string in the tokenizer (100 tokens)" in repr(e)
    assert "note:" not in repr(wb.load())


def test_bad_device_and_dtype():
    with pytest.raises(ValueError, match="dtype='float8'"):
        wb.load(dtype="float8")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            wb.load(device="cuda")


def test_never_downloads(monkeypatch, tmp_path):
    """A hub-style name is not a local directory: refused before any network code runs."""
    with pytest.raises(wb.ModelPairError, match="not a directory"):
        wb.load(target="Qwen/Qwen3-8B")


@pytest.mark.slow
def test_dflash_generate_is_an_independent_oracle_for_linear_dflash(engine, eval_prompts):
    """The official dflash_generate and our DFlash policy both equal the target's greedy output."""
    import torch
    from dflash.model import dflash_generate

    m = engine.models
    for item in eval_prompts[:4]:
        ids = torch.tensor([m.tokenizer(item["prompt"], add_special_tokens=False)["input_ids"]])
        official = dflash_generate(m.draft, m.target, ids, 48, None)[0, ids.shape[1]:].tolist()
        ours = engine.session(item["prompt"], policy=wb.DFlash(), max_new_tokens=48)
        ours.run()
        ar = engine.session(item["prompt"], policy=wb.AR(), max_new_tokens=48)
        ar.run()
        assert ours.tokens == ar.tokens
        assert official[: len(ar.tokens)] == ar.tokens


# ------------------------------------------------------------------------------ damaged checkpoints: one line each
def _cut(path, keep: float):
    f = path / "model.safetensors"
    raw = f.read_bytes()
    f.write_bytes(raw[: int(len(raw) * keep)] if keep >= 0.01 else raw[:20])


DAMAGE = [  # (which, how, what the one line says: the file and the field or tensor)
    ("t", lambda p: edit(p, lambda c: c.__setitem__("intermediate_size", 100)),
     r"target checkpoint '.*/t' does not match Qwen3ForCausalLM: \d+ with the wrong shape: "
     r"model\.layers\.0\.mlp\.down_proj\.weight \(checkpoint \[256, 768\], config\.json wants \[256, 100\]\)"),
    ("d", lambda p: edit(p, lambda c: c.__setitem__("intermediate_size", 100)),
     r"draft checkpoint '.*/d' does not match DFlashDraftModel: 6 with the wrong shape: layers\.0\.mlp\.down_proj"),
    ("d", lambda p: edit(p, lambda c: c["dflash_config"].__setitem__("target_layer_ids", [])),
     r"draft config .*/d/config\.json has target_layer_ids=\[\]; it must be a non-empty list"),
    ("t", lambda p: _cut(p, 0.5), r"target weights .*/t/model\.safetensors: not a readable safetensors file "
     r"\(.*incomplete metadata.*\); it is cut short or damaged"),
    ("d", lambda p: _cut(p, 0), r"draft weights .*/d/model\.safetensors: not a readable safetensors file"),
    ("t", lambda p: edit(p, lambda c: c.__setitem__("num_hidden_layers", "four")),
     r".*/t/config\.json: num_hidden_layers='four' must be a positive integer"),
    ("d", lambda p: edit(p, lambda c: c.__setitem__("hidden_size", "big")),
     r".*/d/config\.json: hidden_size='big' must be a positive integer"),
    ("t", lambda p: edit(p, lambda c: c.__setitem__("rms_norm_eps", "tiny")),
     r"target config .*/t/config\.json: .*rms_norm_eps"),
    ("t", lambda p: (p / "model.safetensors.index.json").write_text("{'weight_map': 1}"),
     r"target weight index .*/t/model\.safetensors\.index\.json is not valid JSON \(Expecting property name"),
    ("t", lambda p: (p / "model.safetensors.index.json").write_text('{"weight_map": {"a": "gone.safetensors"}}'),
     r"names shard\(s\) that are not there: gone\.safetensors"),
    ("d", lambda p: edit(p, lambda c: c["dflash_config"].__setitem__("block_size", 100000)),
     r"draft config .*/d/config\.json has block_size=100000 but the target has 1024 positions"),
]


@pytest.mark.parametrize("which,damage,match", DAMAGE, ids=[
    "config-contradicts-target-weights", "config-contradicts-draft-weights", "empty-target-layer-ids",
    "target-cut-in-half", "draft-header-cut", "string-num-layers", "string-hidden-size", "string-eps",
    "index-not-json", "index-names-missing-shard", "block-size-past-positions"])
def test_damaged_checkpoints_are_one_line_naming_file_and_field(tmp_path, which, damage, match, capsys):
    from workbench.cli import main

    t, d = copy_pair(tmp_path)
    damage(t if which == "t" else d)
    with pytest.raises(wb.ModelPairError, match=match):
        wb.load(target=t, draft=d)
    code = main(["run", "--target", str(t), "--draft", str(d), "--prompt", "x", "--max-new-tokens", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err, err
    assert err.startswith("workbench: error: ") and re.search(match, err), err


def test_a_large_drafter_block_is_warned_about_before_any_cycle(tmp_path):
    t, d = copy_pair(tmp_path)
    edit(d, lambda c: c["dflash_config"].__setitem__("block_size", 200))
    with pytest.warns(UserWarning, match=r"draft block_size=200 is far above the 16 DFlash drafters are trained with"):
        e = wb.load(target=t, draft=d)
    assert "block_size=200" in repr(e)


def test_embedded_pairs_say_which_they_are(engine):
    assert repr(engine).startswith("Engine(target=target: ")
    assert repr(wb.load("hybrid")).startswith("Engine(target=hybrid/target: ")


def test_a_drafter_reading_the_last_target_layer_is_warned_about_in_one_line(tmp_path):
    import warnings

    import workbench as wb
    from tiny_models import make_pair

    t, d = make_pair(tmp_path / "last", vocab=40, hidden=32, layers=3, layer_ids=(0, 2), block_size=6, seed=1)
    with pytest.warns(UserWarning, match=r"target_layer_ids \[0, 2\] include the target's last layer \(2\), where "
                                         r"engines differ: .* vLLM the pre-norm residual, SGLang captures nothing"):
        e = wb.load(target=t, draft=d)
    assert "reads target layers [0, 2]" in repr(e) and "include the target's last layer" in repr(e)
    t, d = make_pair(tmp_path / "inner", vocab=40, hidden=32, layers=3, layer_ids=(0, 1), block_size=6, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a drafter that reads inner layers only: no warning
        e = wb.load(target=t, draft=d)
    assert "last layer" not in repr(e)
