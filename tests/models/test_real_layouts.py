"""Published checkpoint layouts (tiny random copies, see real_layouts.py): each loads, and greedy DFlash,
DDTree and EagleTree equal AR and transformers' own ``generate`` token for token, solo and batched; what
the engine cannot serve is refused in one line."""
from __future__ import annotations

import json

import pytest
import torch

import real_layouts as rl
import workbench as wb
from shared_checks import hf_greedy

PROMPTS = ["t1 t2 t3 t4", "t7 t5"]
NEW = 10
THREADS = 1  # tiny models: one thread is several times faster than two on a busy machine
POLICIES = [wb.DFlash(), wb.DDTree(8), wb.EagleTree(topk=2, steps=3, num_draft_tokens=8)]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Writes each layout once, on first use: ``layouts(name)`` -> its directory."""
    root = tmp_path_factory.mktemp("layouts")
    writers = {
        "qwen3": rl.write_qwen3, "qwen3_moe": rl.write_qwen3_moe, "llama3": rl.write_llama3,
        "deepseek_v3": rl.write_deepseek_v3, "kimi_k25": rl.write_kimi_k25, "qwen3_5_dense": rl.write_qwen3_5_dense,
        "sharded_bf16": lambda d: rl.write_qwen3(d, seed=5, dtype=torch.bfloat16, max_shard_size="20KB"),
        "kimi_k2_remote": rl.write_remote_code_config, "remote_code": rl.write_remote_code_target,
        **{f"draft_{k}": (lambda d, k=k: rl.write_draft(d, k)) for k in ("zlab", "toplevel", "dflash2", "sliding")},
    }
    done = {}

    def get(name):
        if name not in done:
            done[name] = writers[name](root / name)
        return done[name]

    return get


@pytest.fixture(scope="module")
def engines(layouts):
    cache = {}

    def get(target, draft="zlab", **kw):
        key = (target, draft, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = wb.load(target=layouts(target), draft=layouts(f"draft_{draft}"), threads=THREADS, **kw)
        return cache[key]

    return get


PAIRS = [(t, "zlab") for t in ("qwen3", "qwen3_moe", "llama3", "deepseek_v3", "kimi_k25", "qwen3_5_dense",
                                    "sharded_bf16")] + [
    ("qwen3", k) for k in ("toplevel", "dflash2", "sliding")]


@pytest.mark.parametrize("target,draft", PAIRS, ids=[f"{t}+{d}" for t, d in PAIRS])
def test_lossless_solo_and_batched(engines, target, draft):
    e = engines(target, draft, dtype="float32")
    ar = [e.session(p, policy=wb.AR(), max_new_tokens=NEW) for p in PROMPTS]
    for s in ar:
        s.run()
    assert [s.tokens for s in ar] == [hf_greedy(e, s.prompt_ids, NEW) for s in ar]
    assert all(len(s.tokens) >= 4 for s in ar), "too short to test anything: pick other prompts"
    for policy in POLICIES:
        for p, a in zip(PROMPTS, ar):
            s = e.session(p, policy=policy, max_new_tokens=NEW)
            s.run()
            assert s.tokens == a.tokens, f"{policy} on {p!r}"
        b = e.batch_session(PROMPTS, policy=policy, max_new_tokens=NEW)
        b.run()
        assert [s.tokens for s in b.sessions] == [a.tokens for a in ar], f"batched {policy}"


def test_zlab_drafter_layout(engines, layouts):
    """z-lab's config: block_size and num_target_layers at the top level, mask id == len(tokenizer)."""
    cfg = json.loads((layouts("draft_zlab") / "config.json").read_text())
    assert "block_size" not in cfg["dflash_config"] and cfg["block_size"] == rl.BLOCK
    assert cfg["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    for kind in ("zlab", "toplevel"):
        if kind == "toplevel":
            assert "dflash_config" not in json.loads((layouts("draft_toplevel") / "config.json").read_text())
        m = engines("qwen3", kind).models
        assert (m.block_size, m.mask_token_id, m.target_layer_ids) == (rl.BLOCK, rl.VOCAB - 4, rl.LAYER_IDS)
        assert m.mask_token_id == len(m.tokenizer) < m.target.get_input_embeddings().num_embeddings
        assert "note: mask_token_id 60 has no string in the tokenizer (60 tokens)" in repr(engines("qwen3", kind))


def test_dflash2_loads_its_own_class_and_every_tensor(engines, layouts, tmp_path):
    from safetensors.torch import load_file

    m = engines("qwen3", "dflash2").models
    assert type(m.draft).__name__ == "DFlash2DraftModel" and "note: draft: DFlash2DraftModel" in repr(
        engines("qwen3", "dflash2"))
    disk = load_file(layouts("draft_dflash2") / "model.safetensors")
    assert "candidate_selector.predecessor_codebook" in disk  # the published bare-tensor name
    sd = m.draft.state_dict()
    assert torch.equal(sd["candidate_selector.predecessor_codebook.weight"],
                       disk["candidate_selector.predecessor_codebook"])
    assert torch.equal(sd["layers.0.attention_conv.base_kernel"], disk["layers.0.attention_conv.base_kernel"])
    # Named as DFlash 1, its 7 DFlash 2 tensors would be dropped: an error naming them instead.
    import shutil

    d = shutil.copytree(layouts("draft_dflash2"), tmp_path / "d")
    c = json.loads((d / "config.json").read_text())
    c["architectures"] = ["DFlashDraftModel"]
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(wb.ModelPairError, match=r"draft checkpoint .* does not match DFlashDraftModel: 7 unexpected: "
                                                r"candidate_selector\.hidden_projection\.weight, "):
        wb.load(target=layouts("qwen3"), draft=d, threads=THREADS)


def test_missing_or_unexpected_weights_are_named(layouts, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    d = shutil.copytree(layouts("draft_zlab"), tmp_path / "d")
    t = load_file(d / "model.safetensors")
    del t["fc.weight"]
    t["extra.bias"] = torch.zeros(2)
    save_file(t, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(wb.ModelPairError, match=r"^draft checkpoint .* 1 missing: fc\.weight; 1 unexpected: extra\.bias"):
        wb.load(target=layouts("qwen3"), draft=d, threads=THREADS)
    tdir = shutil.copytree(layouts("qwen3"), tmp_path / "t")
    t = load_file(tdir / "model.safetensors")
    del t["model.layers.2.mlp.up_proj.weight"]
    save_file(t, tdir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(wb.ModelPairError, match=r"^target checkpoint .* 1 missing: model\.layers\.2\.mlp\.up_proj"):
        wb.load(target=tdir, draft=layouts("draft_zlab"), threads=THREADS)


def test_sliding_drafter_layers_are_causal_and_windowed(engines):
    layers = engines("qwen3", "sliding", dtype="float32").models.draft.layers
    assert [(a.self_attn.is_causal, a.self_attn.sliding_window) for a in layers] == [(True, 3), (False, None)]


@pytest.mark.parametrize("target,cls,prefix,head,others", [
    ("kimi_k25", "DeepseekV3ForCausalLM", "language_model.model.", "language_model.lm_head.weight", 2),
    ("qwen3_5_dense", "Qwen3_5ForCausalLM", "model.language_model.", "lm_head.weight", 21),
])
def test_nested_text_config_loads_the_text_model(engines, layouts, target, cls, prefix, head, others):
    from safetensors.torch import load_file

    e = engines(target, dtype="float32")
    assert type(e.models.target).__name__ == cls
    wrapper = {"kimi_k25": "Kimi_K25", "qwen3_5_dense": "Qwen3_5"}[target]
    assert f"note: target: the text model of a {wrapper} checkpoint ({others} other tensors left on disk)" in repr(e)
    disk = load_file(layouts(target) / "model.safetensors")
    sd = e.models.target.state_dict()
    for name in ("embed_tokens.weight", "layers.1.self_attn.o_proj.weight", "norm.weight"):
        assert torch.equal(sd["model." + name], disk[prefix + name]), name
    assert torch.equal(sd["lm_head.weight"], disk[head])


def test_bf16_sharded_loads_in_its_own_dtype(engines, layouts):
    d = layouts("sharded_bf16")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    m = engines("sharded_bf16").models  # dtype="auto", the default
    assert m.dtype == torch.bfloat16
    assert {p.dtype for p in m.target.parameters()} == {p.dtype for p in m.draft.parameters()} == {torch.bfloat16}
    s = engines("sharded_bf16").session(PROMPTS[0], policy=wb.DDTree(8), max_new_tokens=6)
    s.run()
    assert s.trace.meta["dtype"] == "bfloat16" and len(s.tokens) >= 1
    assert wb.load(threads=THREADS).models.dtype == torch.float32  # the embedded pair's checkpoint says float32


DEVICE_MAP = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu",
              "lm_head": "cpu"}


def test_device_map_without_accelerate_is_one_line(layouts, monkeypatch):
    """transformers places weights itself only with accelerate (a dependency): without it, one line."""
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_accelerate_available", lambda *a, **k: False)
    with pytest.raises(wb.ModelPairError, match=r"^device_map=\{.*\} needs the 'accelerate' package \(pip install accelerate\)$"):
        wb.load(target=layouts("qwen3"), draft=layouts("draft_zlab"), device_map=DEVICE_MAP, threads=THREADS)


def test_explicit_device_map_on_cpu(layouts, monkeypatch):
    """The map goes to transformers as given; the drafter lands on the device of the target's embedding."""
    from transformers import Qwen3ForCausalLM

    dmap = DEVICE_MAP
    seen = []
    real = Qwen3ForCausalLM.from_pretrained.__func__

    def spy(cls, *a, **kw):
        seen.append(kw.get("device_map"))
        return real(cls, *a, **kw)

    monkeypatch.setattr(Qwen3ForCausalLM, "from_pretrained", classmethod(spy))
    e = wb.load(target=layouts("qwen3"), draft=layouts("draft_zlab"), device_map=dmap, threads=THREADS)
    assert seen == [dmap]
    assert e.device == torch.device("cpu") and next(e.models.draft.parameters()).device == e.device
    a = e.session(PROMPTS[0], policy=wb.AR(), max_new_tokens=NEW)
    s = e.session(PROMPTS[0], policy=wb.DDTree(8), max_new_tokens=NEW)
    a.run(), s.run()
    assert len(a.tokens) >= 4 and s.tokens == a.tokens


@pytest.mark.parametrize("target,match", [
    ("kimi_k2_remote", r"^target '.*' needs its own Python code \(model_type 'kimi_k2', auto_map in config.json\); "
                       r"pass trust_remote_code=True \(CLI --trust-remote-code\) if you trust that code$"),
])
def test_refusals_are_one_line(layouts, monkeypatch, target, match):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # a [y/N] question would read here and fail
    with pytest.raises(wb.ModelPairError, match=match) as err:
        wb.load(target=layouts(target), draft=layouts("draft_zlab"), threads=THREADS)
    assert "\n" not in str(err.value)


def test_trusted_remote_code_loads_and_is_lossless(layouts, monkeypatch, tmp_path):
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # the copied code stays in tmp
    with pytest.raises(wb.ModelPairError, match=r"pass trust_remote_code=True \(CLI --trust-remote-code\)"):
        wb.load(target=layouts("remote_code"), draft=layouts("draft_zlab"), threads=THREADS)
    e = wb.load(target=layouts("remote_code"), draft=layouts("draft_zlab"), threads=THREADS, trust_remote_code=True,
                dtype="float32")
    assert type(e.models.target).__module__.endswith("modeling_remote")  # the checkpoint's own class
    ar = e.session(PROMPTS[0], policy=wb.AR(), max_new_tokens=NEW)
    tree = e.session(PROMPTS[0], policy=wb.DDTree(8), max_new_tokens=NEW)
    ar.run(), tree.run()
    assert len(ar.tokens) >= 4 and tree.tokens == ar.tokens == hf_greedy(e, ar.prompt_ids, NEW)


def test_cli_refusal_names_the_flag(layouts, capsys):
    from workbench.cli import main

    code = main(["run", "--target", str(layouts("kimi_k2_remote")), "--draft", str(layouts("draft_zlab")),
                 "--prompt", "t1", "--threads", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith("workbench: error: target ") and "--trust-remote-code" in err


def test_chat_prompts_bos_and_exact_ids(engines):
    q = engines("qwen3")
    tok = q.tokenizer
    msgs = [{"role": "user", "content": "t1 t2"}]
    s = q.session(messages=msgs, policy=wb.DDTree(8), max_new_tokens=4)
    want = "<|im_start|>user\nt1 t2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert s.prompt == want and s.prompt_ids == tok(want, add_special_tokens=False)["input_ids"]
    meta = s.trace.meta
    assert (meta["prompt_format"], meta["chat_template_kwargs"], meta["messages"]) == (
        "chat", {"enable_thinking": False}, msgs)
    assert q.session("t1 t2", max_new_tokens=2).trace.meta["prompt_format"] == "text"
    ids = [3, 5, 61]  # exact ids, one past the tokenizer
    s = q.session(prompt_ids=ids, policy=wb.AR(), max_new_tokens=3)
    assert s.prompt_ids == ids and s.trace.meta["prompt_format"] == "ids"
    with pytest.raises(ValueError, match=r"prompt_ids holds ids \[64\] outside the target's vocabulary \[0, 64\)"):
        q.session(prompt_ids=[1, 64])
    with pytest.raises(ValueError, match=r"give exactly one of prompt=, messages= or prompt_ids= \(got prompt, messages\)"):
        q.session("t1", messages=msgs)
    # Llama 3: raw text gets the BOS its tokenizer's own call adds; the chat template writes exactly one.
    ll = engines("llama3")
    bos = ll.tokenizer.bos_token_id
    s = ll.session("t1 t2", max_new_tokens=2)
    assert s.prompt_ids[0] == bos and s.prompt_ids[1:] == ll.tokenizer("t1 t2", add_special_tokens=False)["input_ids"]
    assert s.trace.meta["bos_added"] is True
    s = ll.session(messages=msgs, max_new_tokens=2)
    assert s.prompt_ids.count(bos) == 1 and s.prompt_ids[0] == bos and s.trace.meta["chat_template_kwargs"] == {}
    # Batched chats and id lists give each request's solo output.
    chats = [msgs, [{"role": "user", "content": "t9"}]]
    b = q.batch_session(messages=chats, policy=wb.DDTree(8), max_new_tokens=6)
    b.run()
    solo = [q.session(messages=c, policy=wb.AR(), max_new_tokens=6) for c in chats]
    assert [x.tokens for x in b.sessions] == [x.run() and x.tokens for x in solo]
    b = q.batch_session(prompt_ids=[x.prompt_ids for x in solo], policy=wb.DFlash(), max_new_tokens=6)
    b.run()
    assert [x.tokens for x in b.sessions] == [x.tokens for x in solo]


def test_cli_chat_flag(layouts, capsys):
    from workbench.cli import main

    args = ["run", "--target", str(layouts("qwen3")), "--draft", str(layouts("draft_zlab")), "--prompt", "t1 t2",
            "--max-new-tokens", "5", "--policy", "ddtree:8", "--json", "--threads", "1"]
    assert main(args + ["--chat"]) == 0
    chat = json.loads(capsys.readouterr().out)
    e = wb.load(target=layouts("qwen3"), draft=layouts("draft_zlab"), threads=THREADS)
    s = e.session(messages=[{"role": "user", "content": "t1 t2"}], policy=wb.AR(), max_new_tokens=5)
    s.run()
    assert chat["tokens"] == s.tokens


def test_hybrids_load_only_for_families_with_tree_verify():
    """Qwen3-Next / Qwen3.5 / Qwen3.6 hybrids verify through workbench.models.hybrid (tests/models/test_hybrid.py);
    another family with linear-attention layers is refused at load, naming the supported ones."""
    from types import SimpleNamespace

    from workbench.engine.loading import unverifiable

    assert unverifiable(SimpleNamespace(model_type="qwen3_next", layer_types=["linear_attention"])) is None
    assert unverifiable(SimpleNamespace(model_type="qwen3_5_text", layer_types=["linear_attention"])) is None
    why = unverifiable(SimpleNamespace(model_type="falcon_h1", layer_types=["linear_attention", "full_attention"]))
    assert why.startswith("a hybrid target") and "qwen3_next" in why and "\n" not in why
    assert unverifiable(SimpleNamespace(model_type="qwen3", layer_types=None)) is None


@pytest.mark.parametrize("msgs, needle", [
    ([{"role": "user", "content": None}], r"messages\[0\]\['content'\]=None is not text; give a str"),
    ([{"role": "user", "content": "t1 \ud800"}], r"messages\[0\]\['content'\] has a character that is not valid text"),
    ([{"role": "system", "content": "t2"}, {"role": "user", "content": 7}], r"messages\[1\]\['content'\]=7 is not text"),
    ([{"role": "", "content": "t1"}], r"messages\[0\]\['role'\] is empty"),
])
def test_chat_message_content_is_checked_before_the_template(engines, msgs, needle):
    """Through a real chat template, None would reach the model as the text 'None' and a lone surrogate
    would be tokenizers' TypeError: both are one line naming the message instead."""
    with pytest.raises(ValueError, match=needle):
        engines("qwen3").session(messages=msgs, policy=wb.AR(), max_new_tokens=2)
