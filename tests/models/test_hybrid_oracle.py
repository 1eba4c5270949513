"""The model-level tree-verify oracle on tiny hybrid targets: each node's logits from its own path are
self-consistent, while a naive flattened tree forward gives siblings wrong logits (a dense target: right)."""
from __future__ import annotations

import pytest
import torch

from ddtree_kernels import build_tree
from tiny_hybrid import KINDS, make_hybrid_target
from tiny_models import make_pair
from workbench.models.path_oracle import flattened_logits, path_logits


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("hybrid")
    dirs = {kind: make_hybrid_target(root, kind) for kind in KINDS}
    dirs["qwen3_dense"] = make_pair(root / "dense")[0]
    return {k: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for k, d in dirs.items()}


def case(model, seed: int, budget: int):
    """A 2-request context and a tree with siblings (the build's first path is the leading chain)."""
    g = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    lp = torch.log_softmax(torch.randn(2, 3, V, generator=g) * 3, -1)
    return torch.randint(0, V - 2, (2, 5), generator=g), build_tree(lp, torch.tensor([3, 4]), budget=budget)


def on_leading_chain(parents: list[int]) -> list[bool]:
    """Nodes whose flattened predecessors are exactly their ancestors (0, 1, ..., i each the next's parent)."""
    ok, out = True, []
    for i, p in enumerate(parents):
        ok = ok and p == i - 1
        out.append(ok)
    return out


@pytest.mark.parametrize("kind", [*KINDS, "qwen3_dense"])
def test_path_oracle_equals_one_uncached_forward_per_path(targets, kind):
    model = targets[kind]
    context, tree = case(model, 0, budget=3)
    logits = path_logits(model, context, tree)
    for b in range(2):
        parents = tree.parents[b].tolist()
        for i in range(tree.n):
            path = [i]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            ids = torch.cat([context[b], tree.tokens[b, path[::-1]]])[None]
            with torch.no_grad():
                ref = model(input_ids=ids).logits[0, -1]  # transformers' chunked path over the whole sequence
            assert (logits[b, i] - ref).abs().max() < 1e-4, (kind, b, i)


@pytest.mark.parametrize("kind", [*KINDS, "qwen3_dense"])
def test_naive_flattened_tree_forward_gives_hybrid_siblings_wrong_logits(targets, kind):
    """The numbers notebook 08 shows: max |naive - path oracle| per node, on and off the leading chain."""
    model = targets[kind]
    context, tree = case(model, 1, budget=7)
    err = (flattened_logits(model, context, tree) - path_logits(model, context, tree)).abs().amax(-1)  # [bs, n]
    chain = torch.tensor([on_leading_chain(p) for p in tree.parents.tolist()])
    assert (~chain).any()  # the case has siblings
    on, off = float(err[chain].max()), float(err[~chain].max())
    print(f"\n{kind}: naive-flatten max |dlogit| on the leading chain {on:.2e}, off it {off:.2f} "
          f"(min off {float(err[~chain].min()):.2f}); parents {tree.parents.tolist()}")
    assert on < 1e-4  # nodes whose flattened predecessors are their ancestors are right either way
    if kind == "qwen3_dense":
        assert off < 1e-4  # attention honours the tree mask
    else:
        assert float(err[~chain].min()) > 0.1 and off > 1.0  # every other node inherits another branch's state


def test_nested_text_config_layout_loads_as_its_text_model(tmp_path):
    """The Qwen3.5 / 3.6 shipping layout: AutoModelForCausalLM gives the text model, with the logits of the
    conditional-generation model it was saved from, and the path oracle runs on it."""
    from transformers import AutoModelForCausalLM, Qwen3_5ForConditionalGeneration

    d = make_hybrid_target(tmp_path, "qwen3_5", nested=True)
    assert '"text_config"' in (d / "config.json").read_text()
    full = Qwen3_5ForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    text = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    context, tree = case(text, 2, budget=3)
    with torch.no_grad():
        assert torch.equal(full(input_ids=context).logits, text(input_ids=context).logits)
    assert path_logits(text, context, tree).shape == (2, tree.n, text.config.vocab_size)
    with pytest.raises(ValueError, match="nested"):
        make_hybrid_target(tmp_path, "qwen3_next", nested=True)
