"""A real GatedDeltaNet layer (tiny Qwen3-Next and Qwen3.5) over a tree through the kernels == the layer's own
cached forward of every root-to-node path: outputs, and the conv window / recurrent state each node leaves."""
from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from ddtree_kernels import compile_tree
from shared_checks import random_tree
from tiny_hybrid import KINDS, hybrid_config
from workbench.models.gdn_layer import gdn_layer_tree_forward

BACKENDS = ["torch"] + (["sglang-triton"] if importlib.util.find_spec("sglang") and importlib.util.find_spec("triton")
                        else [])


@pytest.fixture(scope="module")
def models():
    from transformers import Qwen3_5ForCausalLM, Qwen3NextForCausalLM

    torch.manual_seed(0)
    return {"qwen3_next": Qwen3NextForCausalLM(hybrid_config("qwen3_next")).eval(),
            "qwen3_5": Qwen3_5ForCausalLM(hybrid_config("qwen3_5")).eval()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_layer_tree_forward_equals_its_own_path_forwards(models, kind, backend):
    from transformers import DynamicCache

    model = models[kind]
    layer = model.model.layers[0].linear_attn
    g = torch.Generator().manual_seed(1)
    bs, L, n, H = 2, 5, 6, model.config.hidden_size
    tree = random_tree(2, bs, n)
    c = compile_tree(tree, L)
    context, nodes = torch.randn(bs, L, H, generator=g), torch.randn(bs, n, H, generator=g)
    cache = DynamicCache(config=model.config)
    layer(context, cache_params=cache)  # prefill through the layer's own chunked path
    lc = cache.layers[0]
    got = gdn_layer_tree_forward(layer, nodes, lc.conv_states[0][..., 1:], lc.recurrent_states[0], tree.parents,
                                 c.retrieve_next_token, c.retrieve_next_sibling, backend)
    for b in range(bs):
        alone = DynamicCache(config=model.config)  # this request's own prefill
        layer(context[b : b + 1], cache_params=alone)
        parents = tree.parents[b].tolist()
        for i in range(n):
            path = [i]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            own = copy.deepcopy(alone)
            ref = layer(nodes[b : b + 1, path[::-1]], cache_params=own)[0, -1]
            assert (got.out[b, i] - ref).abs().max() < 1e-5, (b, i)
            assert torch.allclose(got.conv_windows[b, i], own.layers[0].conv_states[0][0, :, 1:], atol=1e-6)
            assert (got.states[b, i] - own.layers[0].recurrent_states[0][0]).abs().max() < 1e-5
