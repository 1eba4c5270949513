"""The engine's own dense forward (workbench/models/dense_forward.py) against the model's own forward.

Bit for bit: logits, the hidden states the drafter reads and the keys/values written, for a prefill, a
tree verify over a cache and a padded batch, in float32 and bfloat16, on every family it takes. And it
steps aside whenever it might not be the model's own forward: other families, sliding windows, eager
attention, hooks on the modules it bypasses.
"""
from __future__ import annotations

import pytest
import torch
from transformers import (AutoModelForCausalLM, DynamicCache, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

from workbench.records.forward import ForwardMode
from workbench.models.run import run_target
from workbench.models import dense_forward

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa")


def _model(cls, cfg_cls, seed=0, dtype=torch.float32, **kw):
    torch.manual_seed(seed)
    return cls(cfg_cls(**{**SMALL, **kw})).to(dtype).eval()


TINY_MODEL_OF_FAMILY = {
    "qwen3": lambda dtype: _model(Qwen3ForCausalLM, Qwen3Config, dtype=dtype, head_dim=16),
    "qwen3_moe": lambda dtype: _model(Qwen3MoeForCausalLM, Qwen3MoeConfig, 1, dtype, head_dim=16, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                                      mlp_only_layers=[0]),
    "qwen2": lambda dtype: _model(Qwen2ForCausalLM, Qwen2Config, 2, dtype),  # q/k/v biases, no q/k norms
    "llama3": lambda dtype: _model(LlamaForCausalLM, LlamaConfig, 3, dtype, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": lambda dtype: _model(MistralForCausalLM, MistralConfig, 4, dtype, sliding_window=None, head_dim=16),
}


def _tree_mask(P: int, parents: list[int], dtype) -> torch.Tensor:
    """Additive [1, 1, n, P + n]: every node sees the prefix, itself and its ancestors."""
    n = len(parents)
    vis = torch.zeros(n, P + n, dtype=torch.bool)
    vis[:, :P] = True
    for i, p in enumerate(parents):
        if p >= 0:
            vis[i] = vis[p]
        vis[i, P + i] = True
    return torch.zeros(1, 1, n, P + n, dtype=dtype).masked_fill_(~vis, float("-inf"))


def _both(model, ids, pos, mask, prefix_cache, layer_ids):
    """(own forward's TargetOutput, model forward's output, both caches after), from copies of one cache."""
    import copy

    a, b, c = (copy.deepcopy(prefix_cache) for _ in range(3))
    with torch.inference_mode():
        own = dense_forward.forward(model, ids, pos, a, mask, [i + 1 for i in layer_ids])
        assert own is not None  # it ran (transformers' own inactive recorders do not make it step aside)
        ours = run_target(model, ids, pos, c, ForwardMode.TARGET_VERIFY, layer_ids, mask)
        assert torch.equal(ours.logits, own[0]) and torch.equal(ours.features, torch.cat(own[1], -1))
        theirs = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=b, use_cache=True,
                       output_hidden_states=True)
    return ours, theirs, a, b


def _equal_caches(a, b):
    for la, lb in zip(a.layers, b.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", sorted(TINY_MODEL_OF_FAMILY))
def test_own_forward_is_bit_identical_to_the_models(family, dtype):
    from dflash.model import extract_context_feature

    model = TINY_MODEL_OF_FAMILY[family](dtype)
    layer_ids = [0, 2]  # the last layer's entry is after the final norm: both ends covered
    g = torch.Generator().manual_seed(5)
    P = 11
    prompt = torch.randint(0, 96, (1, P), generator=g)
    # Prefill: causal from an empty cache (no mask).
    ours, theirs, ca, cb = _both(model, prompt, torch.arange(P)[None], None, DynamicCache(config=model.config),
                                 layer_ids)
    assert torch.equal(ours.logits, theirs.logits)
    assert torch.equal(ours.features, extract_context_feature(theirs.hidden_states, layer_ids))
    _equal_caches(ca, cb)
    # A tree verify over that prefix: siblings, a chain, a tree mask.
    parents = [-1, 0, 0, 1, 1, 3, 2]
    depth = [0, 1, 1, 2, 2, 3, 2]
    ids = torch.randint(0, 96, (1, len(parents)), generator=g)
    pos = (torch.tensor(depth) + P)[None]
    ours, theirs, va, vb = _both(model, ids, pos, _tree_mask(P, parents, dtype), ca, layer_ids)
    assert torch.equal(ours.logits, theirs.logits)
    assert torch.equal(ours.features, extract_context_feature(theirs.hidden_states, layer_ids))
    _equal_caches(va, vb)
    assert ours.record.outputs["hidden_states"]["shape"] == [4, 1, len(parents), 64]  # as the model reports it
    # One decode token: no mask.
    ours, theirs, _, _ = _both(model, ids[:, :1], pos[:, :1], None, ca, layer_ids)
    assert torch.equal(ours.logits, theirs.logits)


def test_own_forward_matches_on_a_padded_batch_in_the_engines_cache():
    """Two rows of different lengths in KVBuffers (a scatter write) against the model's forward row by row."""
    from workbench.models.kv_buffers import KVBuffers
    from workbench.models.masks import additive

    model = TINY_MODEL_OF_FAMILY["qwen3"](torch.float32)
    g = torch.Generator().manual_seed(9)
    lens = [9, 6]
    ids = torch.randint(0, 96, (2, 9), generator=g)
    col = torch.arange(9)
    visible = (col[None, None] <= col[None, :, None]) & (col[None, None] < torch.tensor(lens)[:, None, None])
    cache = KVBuffers(model.config, [0, 0])
    with torch.inference_mode():
        ours = run_target(model, ids, torch.arange(9).expand(2, 9), cache, ForwardMode.EXTEND, [1],
                          additive(visible[:, None], torch.float32))
        for b, n in enumerate(lens):
            theirs = model(input_ids=ids[b : b + 1, :n], use_cache=True, output_hidden_states=True)
            assert torch.allclose(ours.logits[b, :n], theirs.logits[0], atol=1e-5)  # padding changes the GEMM
            for layer, keys in zip(cache.layers, theirs.past_key_values.layers):
                assert torch.allclose(layer._k[b, :, :n], keys.keys[0], atol=1e-5)


def test_own_forward_steps_aside_where_it_would_not_be_the_models():
    assert dense_forward.plan(TINY_MODEL_OF_FAMILY["qwen3"](torch.float32)) is not None
    sliding = _model(Qwen3ForCausalLM, Qwen3Config, head_dim=16, use_sliding_window=True, sliding_window=4,
                     max_window_layers=1)
    eager = _model(Qwen3ForCausalLM, Qwen3Config, head_dim=16, attn_implementation="eager")
    assert dense_forward.plan(sliding) is None and dense_forward.plan(eager) is None
    assert dense_forward.plan(_model(MistralForCausalLM, MistralConfig, sliding_window=8, head_dim=16)) is None


def test_a_hook_on_a_bypassed_module_runs_the_models_own_forward(tmp_path):
    from real_layouts import write_deepseek_v3

    model = TINY_MODEL_OF_FAMILY["llama3"](torch.float32)
    seen = []
    handle = model.model.layers[1].register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    ids = torch.arange(5)[None]
    with torch.inference_mode():
        assert dense_forward.forward(model, ids, torch.arange(5)[None], DynamicCache(config=model.config), None,
                                     [1]) is None
        run_target(model, ids, torch.arange(5)[None], DynamicCache(config=model.config), ForwardMode.EXTEND, [0])
    assert seen == [torch.Size([1, 5, 64])]  # the hook saw its layer
    handle.remove()
    with torch.inference_mode():
        assert dense_forward.forward(model, ids, torch.arange(5)[None], DynamicCache(config=model.config), None,
                                     [1]) is not None
    # MLA (DeepSeek-V3) keeps the model's own forward.
    mla = AutoModelForCausalLM.from_pretrained(write_deepseek_v3(tmp_path / "ds"))
    assert dense_forward.plan(mla) is None


def test_own_drafter_forward_is_bit_identical_to_dflashs(tmp_path):
    """Two block forwards (a cache in between) of a z-lab-layout DFlash drafter, without a mask (one row)
    and with the batch's additive mask, against dflash's own forward; DFlash 2 and windowed drafters
    keep dflash's."""
    from dflash.model import DFlash2DraftModel, DFlashDraftModel
    from real_layouts import write_draft

    draft = DFlashDraftModel.from_pretrained(write_draft(tmp_path / "z")).eval()
    assert dense_forward.draft_plan(draft) is not None
    assert dense_forward.draft_plan(DFlashDraftModel.from_pretrained(write_draft(tmp_path / "s", "sliding"))) is None
    assert dense_forward.draft_plan(DFlash2DraftModel.from_pretrained(write_draft(tmp_path / "d", "dflash2"))) is None
    g = torch.Generator().manual_seed(2)
    H, F = draft.config.hidden_size, draft.fc.in_features
    for bs, masked in ((1, False), (2, True)):
        ours_cache, their_cache = DynamicCache(config=draft.config), DynamicCache(config=draft.config)
        start = 0
        for m, n in ((5, 6), (3, 6)):
            noise = torch.randn(bs, n, H, generator=g)
            context = torch.randn(bs, m, F, generator=g)
            pos = torch.arange(start, start + m + n)[None].expand(bs, -1)
            mask = None
            if masked:
                mask = torch.zeros(bs, 1, n, start + m + n)
                mask[1, :, :, 1] = float("-inf")  # row 1 hides one key
            with torch.inference_mode():
                ours = dense_forward.draft_forward(draft, noise, pos, context, ours_cache, mask)
                theirs = draft(position_ids=pos, noise_embedding=noise, target_hidden=context,
                               past_key_values=their_cache, use_cache=True, attention_mask=mask)
            assert ours is not None and torch.equal(ours, theirs), (bs, m)
            _equal_caches(ours_cache, their_cache)
            ours_cache.crop(-n)  # as the engine drops the block's own keys
            their_cache.crop(-n)
            start += m
