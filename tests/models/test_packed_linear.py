"""The own forwards' oneDNN-packed linear layers: the same products as nn.Linear up to rounding, the same
choices, repacked when a weight changes, off by default for a model the loader did not enable."""
from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from workbench.models import dense_forward, packed_linear

SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, head_dim=16, attn_implementation="sdpa")


def _model(seed=0):
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**SMALL)).eval()


def _logits(model, ids):
    with torch.inference_mode():
        out = dense_forward.forward(model, ids, torch.arange(ids.shape[1])[None], DynamicCache(config=model.config),
                                    None, None)
    return out[0]


def test_packed_products_match_nn_linear_up_to_rounding_on_random_inputs():
    lin = nn.Linear(64, 200)
    packed = packed_linear.PackedLinears()
    for rows in (1, 5, 17, 33, 65):
        x = torch.randn(1, rows, 64)
        with torch.inference_mode():
            torch.testing.assert_close(packed(lin, x), lin(x), rtol=1e-5, atol=1e-5)
    x = torch.randn(1, packed_linear.MAX_PACKED_ROWS + 1, 64)  # a prefill's rows: nn.Linear's own product
    with torch.inference_mode():
        assert torch.equal(packed(lin, x), lin(x))


def test_an_enabled_model_gives_the_plain_forward_s_choices_and_a_disabled_one_its_bits():
    model, ids = _model(), torch.randint(0, 300, (1, 40))
    plain = _logits(model, ids)
    assert packed_linear.enable(model)
    try:
        packed = _logits(model, ids)
    finally:
        packed_linear.disable(model)
    torch.testing.assert_close(packed, plain, rtol=1e-4, atol=1e-4)
    assert torch.equal(packed.argmax(-1), plain.argmax(-1))
    assert torch.equal(_logits(model, ids), plain)  # disabled again: nn.Linear's own products


def test_a_weight_changed_in_place_or_replaced_is_packed_again():
    lin, packed, x = nn.Linear(64, 32, bias=False), packed_linear.PackedLinears(), torch.randn(3, 64)
    with torch.inference_mode():
        before = packed(lin, x)
    with torch.no_grad():
        lin.weight.mul_(2)  # in place: the version counter moves
    with torch.inference_mode():
        torch.testing.assert_close(packed(lin, x), 2 * before, rtol=1e-5, atol=1e-5)
    lin.weight = nn.Parameter(torch.zeros(32, 64))  # replaced: another tensor
    with torch.inference_mode():
        assert torch.count_nonzero(packed(lin, x)) == 0


def test_a_hook_on_a_linear_layer_makes_the_own_forward_step_aside():
    model = _model(1)
    packed_linear.enable(model)
    try:
        handle = model.model.layers[0].mlp.up_proj.register_forward_hook(lambda *a: None)
        with torch.inference_mode():
            got = dense_forward.forward(model, torch.randint(0, 300, (1, 4)), torch.arange(4)[None],
                                        DynamicCache(config=model.config), None, None)
        handle.remove()
    finally:
        packed_linear.disable(model)
    assert got is None  # the model's own forward runs instead, and the hook sees its call


def test_packing_is_refused_with_its_reason():
    model = _model(2)
    assert packed_linear.why_not(model) is None
    assert packed_linear.why_not(model.to(torch.bfloat16)) == "weights not in float32"
    assert packed_linear.enable(model) is False


def test_the_loader_packs_the_embedded_pair_s_linear_layers(engine):
    for model in (engine.models.target, engine.models.draft):
        assert isinstance(packed_linear.linear_for(model), packed_linear.PackedLinears)
