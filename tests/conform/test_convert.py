"""Converters into the cycle dump: SGLang's verify input (built by SGLang's own released kernel and by ours)
and a vLLM-style per-request tree bias; every visibility form read back as the tree's ancestor closure."""
from __future__ import annotations

import pytest
import torch

from ddtree_kernels import compile_tree
from ddtree_kernels.eagle_tree import eagle_select, eagle_tree
from ddtree_kernels.mask_layout import flat_tree_mask
from ddtree_kernels.tree_build import Tree
from workbench.conform.convert import (ancestor_closure, bias_fields, dense_visibility, pack_flashinfer,
                                       parents_from_links, sglang_verify_fields)
from workbench.conform.dump import DumpWriter, make_header, read_dump


def random_tree(g: torch.Generator, n: int) -> torch.Tensor:
    """parents [n]: node i's parent drawn among 0..i-1 (any tree with parents before children)."""
    return torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])


def tree_of(parents_rows: list[torch.Tensor], g) -> Tree:
    bs, n = len(parents_rows), parents_rows[0].shape[0]
    parents = torch.stack(parents_rows)
    depth = torch.stack([torch.tensor(_depths(p)) for p in parents_rows])
    tokens = torch.randint(0, 50, (bs, n), generator=g)
    z = torch.zeros(bs, n)
    return Tree(tokens=tokens, parents=parents, depth=depth, rank=torch.zeros(bs, n, dtype=torch.long), score=z)


def _depths(p):
    d = [0] * len(p)
    for i in range(1, len(p)):
        d[i] = d[int(p[i])] + 1
    return d


def expected_visibility(parents: torch.Tensor, prefix: int) -> torch.Tensor:
    n = parents.shape[0]
    return torch.cat([torch.ones(n, prefix, dtype=torch.bool), ancestor_closure(parents)], dim=1)


def check_fields(fields: list[dict], tree: Tree, seq: list[int], mode: str):
    for b, f in enumerate(fields):
        assert f["tree_parents"].tolist() == tree.parents[b].tolist()
        assert f["tree_depths"].tolist() == tree.depth[b].tolist()
        assert f["tree_tokens"].tolist() == tree.tokens[b].tolist() == f["verify_ids"].tolist()
        assert f["verify_positions"].tolist() == (seq[b] + tree.depth[b]).tolist()
        assert f["context_len"] == seq[b] and f["root_token"] == int(tree.tokens[b, 0])
        want = expected_visibility(tree.parents[b], seq[b] if mode == "FULL_MASK" else 0)
        assert torch.equal(dense_visibility(f), want)


@pytest.mark.parametrize("mode", ["FULL_MASK", "QLEN_ONLY"])
def test_sglang_build_kernel_output_converts_to_the_tree(mode):
    """Tensors from SGLang 0.5.23's own build_tree_kernel_efficient kernel (Triton, interpreted on the CPU)."""
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    from ddtree_kernels.sglang_backend import build_tree_efficient

    g = torch.Generator().manual_seed(0)
    lp = torch.log_softmax(torch.randn(2, 6, 30, generator=g) * 3, dim=-1)
    topk, steps, n = 3, 4, 9
    sel = eagle_select(lp, topk, steps, n)
    tree = eagle_tree(sel, torch.tensor([7, 11]))
    seq = torch.tensor([5, 2])
    built = build_tree_efficient(sel.parent_list, sel.selected_index, seq, topk, steps, n, mode)
    fields, notes = sglang_verify_fields(tree.tokens.reshape(-1), built["positions"], built["retrieve_index"],
                                         built["retrieve_next_token"], built["retrieve_next_sibling"], seq,
                                         built["tree_mask"], mode)
    assert notes == []
    check_fields(fields, tree, seq.tolist(), mode)


@pytest.mark.parametrize("mode", ["FULL_MASK", "QLEN_ONLY"])
@pytest.mark.parametrize("seed", range(3))
def test_our_sglang_layout_converts_to_the_tree(mode, seed):
    """DDTree-shaped random trees through our compile + SGLang's flat mask layout (sized as SGLang allocates)."""
    from workbench.shapes.sglang_layout import custom_mask_elements

    g = torch.Generator().manual_seed(seed)
    n, seq = 7, [4, 0, 9]
    tree = tree_of([random_tree(g, n) for _ in seq], g)
    ct = compile_tree(tree, torch.tensor(seq), n - 1)
    mask = flat_tree_mask(ct.visibility, torch.tensor(seq), mode)
    assert mask.numel() == custom_mask_elements(seq, [n] * 3, mode).numel
    fields, notes = sglang_verify_fields(tree.tokens.reshape(-1), ct.positions.reshape(-1), ct.retrieve_index,
                                         ct.retrieve_next_token, ct.retrieve_next_sibling, seq, mask, mode)
    assert notes == []
    check_fields(fields, tree, seq, mode)


def test_bitpacked_qlen_only_mask_reads_back():
    """QLEN_ONLY_BITPACKING (SGLang's CUDA build only; its Triton build refuses it): one word per row, bit j =
    the row sees token j, words of the narrowest of uint8/16/32 that holds n bits."""
    g = torch.Generator().manual_seed(3)
    n, seq = 10, [2, 6]
    tree = tree_of([random_tree(g, n) for _ in seq], g)
    ct = compile_tree(tree, torch.tensor(seq), n - 1)
    words = (ct.visibility.long() << torch.arange(n)[None, None]).sum(-1).reshape(-1).to(torch.int16)  # [bs * n]
    fields, notes = sglang_verify_fields(tree.tokens.reshape(-1), ct.positions.reshape(-1), ct.retrieve_index,
                                         ct.retrieve_next_token, ct.retrieve_next_sibling, seq, words,
                                         "QLEN_ONLY_BITPACKING")
    assert notes == []
    check_fields(fields, tree, seq, "QLEN_ONLY")


def test_a_dropped_ancestor_shows_in_the_converted_visibility():
    g = torch.Generator().manual_seed(4)
    n, seq = 6, [3]
    parents = torch.tensor([-1, 0, 1, 2, 0, 4])
    tree = tree_of([parents], g)
    ct = compile_tree(tree, torch.tensor(seq), n - 1)
    vis = ct.visibility.clone()
    vis[0, 3, 1] = False  # node 3 loses its grandparent
    mask = flat_tree_mask(vis, torch.tensor(seq), "FULL_MASK")
    (f,), _ = sglang_verify_fields(tree.tokens.reshape(-1), ct.positions.reshape(-1), ct.retrieve_index,
                                   ct.retrieve_next_token, ct.retrieve_next_sibling, seq, mask)
    diff = (dense_visibility(f) != expected_visibility(parents, 3)).nonzero().tolist()
    assert diff == [[3, 3 + 1]]


def test_unreadable_sglang_fields_are_named_one_line_each():
    g = torch.Generator().manual_seed(5)
    n, seq = 5, [2, 3]
    tree = tree_of([random_tree(g, n) for _ in seq], g)
    ct = compile_tree(tree, torch.tensor(seq), n - 1)
    args = (tree.tokens.reshape(-1), ct.positions.reshape(-1), ct.retrieve_index, ct.retrieve_next_token,
            ct.retrieve_next_sibling, seq)
    for mask, mode, word in ((None, "FULL_MASK", "custom_mask: None"),
                             (torch.ones(7, dtype=torch.bool), "FULL_MASK", "custom_mask: 7 entries"),
                             (torch.ones(3, dtype=torch.uint8), "QLEN_ONLY_BITPACKING", "custom_mask: 3 words"),
                             (torch.ones(9, dtype=torch.bool), "BITS", "mask mode BITS")):
        fields, notes = sglang_verify_fields(*args, mask, mode)
        assert len(notes) == 1 and notes[0].startswith("custom_mask") and word in notes[0], notes
        assert all("visibility_form" not in f and "tree_parents" in f for f in fields)
    broken = ct.retrieve_next_sibling.clone()
    broken[1] = -1  # request 1 loses its siblings: some nodes unreachable
    if torch.equal(broken, ct.retrieve_next_sibling):
        pytest.skip("tree without siblings")
    fields, notes = sglang_verify_fields(*args[:4], broken, seq, None)
    assert any(x.startswith("request 1: retrive_next_token / retrive_next_sibling") for x in notes)
    assert "tree_parents" not in fields[1] and "tree_parents" in fields[0]
    with pytest.raises(ValueError, match="seq_lens has 1 entries for 2 requests"):
        sglang_verify_fields(*args[:5], [3])


def test_sglang_accept_outputs_convert():
    """SGLang's own verify kernel's accept_index / predicts -> accepted_nodes and bonus on the path."""
    pytest.importorskip("sglang", reason="sglang kernels are installed by the README set-up")
    from ddtree_kernels.sglang_backend import verify_tree_greedy

    g = torch.Generator().manual_seed(6)
    n, seq = 6, [4, 1]
    tree = tree_of([torch.tensor([-1, 0, 1, 0, 2, 3]), torch.tensor([-1, 0, 0, 1, 1, 2])], g)
    ct = compile_tree(tree, torch.tensor(seq), n - 1)
    V = 50
    logits = torch.randn(2, n, V, generator=g)
    # the target agrees with the tree along 0 -> 1 -> 2 in request 0, nowhere in request 1
    logits[0, 0, tree.tokens[0, 1]] = logits[0, 1, tree.tokens[0, 2]] = 100.0
    logits[1, 0, tree.tokens[1, 1:3]] = -100.0
    predict = logits.argmax(-1)
    acc, _, predicts = verify_tree_greedy(tree.tokens, ct.retrieve_index, ct.retrieve_next_token,
                                          ct.retrieve_next_sibling, predict, n - 1)
    fields, notes = sglang_verify_fields(tree.tokens.reshape(-1), ct.positions.reshape(-1), ct.retrieve_index,
                                         ct.retrieve_next_token, ct.retrieve_next_sibling, seq,
                                         flat_tree_mask(ct.visibility, torch.tensor(seq), "QLEN_ONLY"), "QLEN_ONLY",
                                         logits=logits.reshape(2 * n, V), topk=3, accept_index=acc, predict=predicts)
    assert fields[0]["accepted_nodes"].tolist() == [0, 1, 2] and fields[0]["bonus"] == int(predict[0, 2])
    assert fields[1]["accepted_nodes"].tolist() == [0] and fields[1]["bonus"] == int(predict[1, 0])
    assert fields[0]["target_choice"].tolist() == predict[0].tolist()
    assert fields[0]["target_topk_ids"].shape == (n, 3)


def test_bias_and_flashinfer_forms_through_a_dump_file(tmp_path):
    g = torch.Generator().manual_seed(7)
    n, ctx = 6, 5
    parents = random_tree(g, n)
    tokens, depth = torch.randint(0, 50, (n,), generator=g), torch.tensor(_depths(parents))
    closure = ancestor_closure(parents)
    bias = torch.where(closure, 0.0, float("-inf"))
    f, notes = bias_fields(tokens, ctx + depth, bias, ctx, parents)
    assert notes == []
    packed = pack_flashinfer(expected_visibility(parents, ctx))
    head = make_header({"name": "test"}, {"vocab_size": 50})
    with DumpWriter(tmp_path / "x.dump", head) as w:
        w.cycle("bias", 0, **f)
        w.cycle("fi", 0, tree_parents=parents, tree_tokens=tokens, visibility_form="flashinfer_packed",
                fi_packed_mask=packed, fi_mask_indptr=torch.tensor([0, packed.numel()]), fi_kv_len=ctx + n)
        w.cycle("fi-wrong-indptr", 0, tree_parents=parents, tree_tokens=tokens, visibility_form="flashinfer_packed",
                fi_packed_mask=packed[:-1], fi_mask_indptr=torch.tensor([1, packed.numel()]), fi_kv_len=ctx + n)
    r_bias, r_fi, r_bad = list(read_dump(tmp_path / "x.dump")[1])
    assert torch.equal(dense_visibility(r_bias), closure)
    assert torch.equal(dense_visibility(r_fi), expected_visibility(parents, ctx))
    with pytest.raises(ValueError, match=r"fi_packed_mask has \d+ bytes \(mask_indptr \[1, \d+\]\)"):
        dense_visibility(r_bad)
    _, notes = bias_fields(tokens, ctx + depth, bias[:, :3], ctx)
    assert [x.split(":")[0] for x in notes] == ["attn_bias", "tree_parents"]


def test_pack_flashinfer_matches_numpy_little_bitorder():
    import numpy as np

    g = torch.Generator().manual_seed(8)
    m = torch.rand(5, 11, generator=g) > 0.5
    assert pack_flashinfer(m).tolist() == np.packbits(m.reshape(-1).numpy(), bitorder="little").tolist()


def test_parents_from_links_refuses_a_cycle():
    with pytest.raises(ValueError, match="twice or out of range"):
        parents_from_links(torch.tensor([1, 0]), torch.tensor([-1, -1]))


def test_sglang_hook_on_a_stand_in_worker_module(tmp_path):
    """sglang_dump.install wraps eagle_sample where the worker calls it; a stand-in module plays SGLang's (the
    real worker needs a GPU): the dump holds each request's tree, visibility, target top-k and accept."""
    import types

    from ddtree_kernels.mask_layout import flat_tree_mask as flat
    from workbench.conform import sglang_dump

    g = torch.Generator().manual_seed(9)
    n, seq = 5, [3, 6]
    tree = tree_of([torch.tensor([-1, 0, 1, 0, 3]), torch.tensor([-1, 0, 0, 1, 2])], g)
    ct = compile_tree(tree, torch.tensor(seq), n - 1)
    vi = types.SimpleNamespace(draft_token=tree.tokens.reshape(-1), positions=ct.positions.reshape(-1),
                               custom_mask=flat(ct.visibility, torch.tensor(seq), "FULL_MASK"),
                               retrieve_index=ct.retrieve_index, retrieve_next_token=ct.retrieve_next_token,
                               retrieve_next_sibling=ct.retrieve_next_sibling)  # sglang 0.5.23's spelling
    logits = torch.randn(2 * n, 40, generator=g)
    accept_index = torch.tensor([[0, 1, -1, -1], [5, -1, -1, -1]], dtype=torch.int32)
    predict = torch.arange(2 * n, dtype=torch.int32)

    def eagle_sample(verify_input, batch, logits_output):  # what SGLang's returns: (predict, lens, accept_index)
        return predict, None, accept_index

    mod = types.ModuleType("stand_in_worker")
    mod.eagle_sample = eagle_sample
    dump = sglang_dump.install(tmp_path / "sg.dump", {"vocab_size": 40}, "DDTree(4)", module=mod, topk=3)
    batch = types.SimpleNamespace(seq_lens=torch.tensor(seq), reqs=[types.SimpleNamespace(rid="a"),
                                                                    types.SimpleNamespace(rid="b")])
    assert mod.eagle_sample(vi, batch, types.SimpleNamespace(next_token_logits=logits))[2] is accept_index
    sglang_dump.uninstall(mod)
    assert mod.eagle_sample is eagle_sample and dump.writer.closed
    head, recs = read_dump(tmp_path / "sg.dump")
    cycles = [r for r in recs if r.kind == "cycle"]
    assert head["engine"]["name"] == "sglang" and [c.request for c in cycles] == ["a", "b"]
    for b, c in enumerate(cycles):
        assert c["tree_parents"].tolist() == tree.parents[b].tolist()
        assert torch.equal(dense_visibility(c), expected_visibility(tree.parents[b], seq[b]))
        assert c["target_topk_ids"].tolist() == logits[b * n:(b + 1) * n].topk(3).indices.tolist()
    assert cycles[0]["accepted_nodes"].tolist() == [0, 1] and cycles[0]["bonus"] == 1
    assert cycles[1]["accepted_nodes"].tolist() == [0] and cycles[1]["bonus"] == 5
    assert "notes" not in cycles[0] and "draft (draft_topk_ids or draft_topk_values or draft_logits)" in cycles[0].missing()


def test_vllm_tree_hook_wraps_a_proposer_method(tmp_path):
    from workbench.conform.vllm_tree_dump import VllmTreeDump

    g = torch.Generator().manual_seed(10)
    parents = torch.tensor([-1, 0, 0, 1])
    tokens, depth = torch.randint(0, 30, (4,), generator=g), torch.tensor([0, 1, 1, 2])
    bias = torch.where(ancestor_closure(parents), 0.0, float("-inf"))

    class Proposer:  # stands in for a vLLM tree proposer
        def verify(self, step):
            return step

    p = Proposer()
    dump = VllmTreeDump(tmp_path / "v.dump", {"vocab_size": 30}, "DDTree(3)")
    dump.wrap(p, "verify", lambda args, kw, result: [dict(request_id="r", step=result, tokens=tokens,
                                                          positions=9 + depth, attn_bias=bias, context_len=9,
                                                          parents=parents if result == 0 else None)])
    assert p.verify(0) == 0 and p.verify(1) == 1
    dump.close()
    c0, c1 = [r for r in read_dump(tmp_path / "v.dump")[1] if r.kind == "cycle"]
    assert torch.equal(dense_visibility(c0), ancestor_closure(parents)) and c0["cycle"] == 0 and c1["cycle"] == 1
    assert c1["notes"].startswith("tree_parents:") and "tree_parents" in c1.missing()
