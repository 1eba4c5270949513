"""The checker (``wb.conform``): contracts on plain tensors, clean runs that name nothing, planted faults named by
their own contract first, missing fields reported as not checked, and bad input refused in one line before any
model loads."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import workbench as wb
from workbench.conform import contracts as C
from workbench.conform.check import ConformInputError, chain_logits, conform
from workbench.cli import main
from workbench.conform.dump import DumpFileError
from workbench.records.tensor_codec import pack_tensor

sys.path.insert(0, str(Path(__file__).parent))
import faults  # noqa: E402  (tests/conform/faults.py: test-only)

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["def parse(line):", "class Stack:", "import os\n", "for i in range(10):"]
NEW = 20


@pytest.fixture(scope="module")
def hybrid_engine():
    return wb.load("hybrid")


def write_dump(engine, path, policy, batch: int = 1, new: int = NEW) -> Path:
    k = 16  # every rank a DDTree(16) can use: the tree check rebuilds it exactly
    if batch == 1:
        engine.session(PROMPTS[0], policy=policy, max_new_tokens=new, record_topk=k, dump=path).run()
    else:
        engine.batch_session(PROMPTS[:batch], policy, max_new_tokens=new, record_topk=k, dump=path).run()
    return path


# ------------------------------------------------------------------------------------------ contracts alone
def test_each_contract_function_names_its_own_fault_on_plain_tensors():
    tokens, parents = [7, 3, 4, 5, 6], [-1, 0, 0, 1, 3]  # root; two children; a chain under the first
    assert C.tree_shape_problem(tokens, parents, [0, 1, 1, 2, 3]) is None
    assert "depth" in C.tree_shape_problem(tokens, parents, [0, 1, 1, 2, 2])
    assert C.positions_problem([10, 11, 11, 12, 13], parents, 10, tokens, tokens) is None
    assert "node 2 is verified at position 12, the reference's 11" in C.positions_problem([10, 11, 12, 13, 14],
                                                                                           parents, 10)
    vis = C.ancestor_closure(parents)
    assert C.visibility_problem(vis, parents, 10) is None
    assert C.visibility_problem(torch.cat([torch.ones(5, 10, dtype=torch.bool), vis], 1), parents, 10) is None
    lost = vis.clone()
    lost[4, 1] = False
    assert "node 4 does not see its ancestor 1" in C.visibility_problem(lost, parents, 10)
    leak = vis.clone()
    leak[2, 1] = True
    assert "node 2 sees node 1, which is not its ancestor" in C.visibility_problem(leak, parents, 10)
    assert C.state_parents_problem(parents, parents) is None
    assert "node 2 continued the recurrent state of node 1" in C.state_parents_problem([-1, 0, 1, 1, 3], parents)
    choice = [3, 5, 9, 6, 8]  # root chose 3 (node 1), node 1 chose 5 (node 3), node 3 chose 6 (node 4)
    assert C.accept_problem(tokens, parents, choice, [0, 1, 3, 4], 8) is None
    assert "the walk along its own choices gives [0, 1, 3, 4]" in C.accept_problem(tokens, parents, choice, [0, 1], 5)
    assert C.accept_problem(tokens, parents, choice, [0, 1], 5, last=True) is None  # the limit stopped the walk
    assert C.commit_problem([3, 5, 6, 8], [7, 3, 5, 6], 8, [0, 1, 3, 4], [0, 1, 3, 4], 14, 10, False) is None
    assert C.commit_problem([3, 5], [7, 3, 5, 6], 8, None, [0, 1, 3, 4], None, 10, True) is None  # cut at the limit
    assert "kept are nodes [0, 1, 2, 3]" in C.commit_problem(None, [7, 3, 5, 6], 8, [0, 1, 2, 3], [0, 1, 3, 4], None,
                                                              10, False)
    assert "counts 13 tokens" in C.commit_problem(None, [7, 3, 5, 6], 8, None, [0, 1, 3, 4], 13, 10, False)
    committed = list(range(20))
    assert C.drafter_context_problem({q: q for q in range(12)}, committed, 12) is None
    assert "never reached the drafter (first: 5)" in C.drafter_context_problem(
        {q: q for q in range(12) if q != 5}, committed, 12)
    assert "position 3 holds token 4" in C.drafter_context_problem({q: q + (q == 3) for q in range(12)}, committed, 12)
    assert C.block_problem([9, 1, 1], [12, 13, 14], 9, 1, 12) is None
    assert "block slot 0 is at position 13" in C.block_problem(None, [13, 14, 15], 9, 1, 12)


def test_topk_tells_a_near_tie_from_a_fault_and_values_beyond_the_tolerance():
    tol = C.tolerance("float32")
    ref = torch.tensor([[5.0, 4.9995, 0.0], [1.0, 3.0, 2.0]])
    near, n = C.topk_problem(torch.tensor([[1, 0], [1, 2]]), torch.tensor([[5.0, 5.0], [3.0, 2.0]]), ref, tol, "node",
                             "logit")
    assert near is None and n == 1  # node 0's flip is within the near tie
    bad, _ = C.topk_problem(torch.tensor([[0, 1], [2, 1]]), torch.tensor([[5.0, 4.9995], [2.0, 3.0]]), ref, tol,
                            "node", "logit")
    assert bad.startswith("node 1: the engine's top-1 is token 2, the reference's 1")
    off, _ = C.topk_problem(torch.tensor([[0, 1]]), torch.tensor([[5.01, 4.9995]]), ref[:1], tol, "node", "logit")
    assert "is 5.01, the reference's 5" in off


def test_the_tree_check_rebuilds_the_exact_best_tree_from_the_engines_own_drafter_output():
    lp = torch.log_softmax(torch.randn(4, 12, generator=torch.Generator().manual_seed(0)), -1)
    policy = wb.DDTree(6)
    want = C.reference_tree(lp, 3, policy)
    assert len(want["tokens"]) == 7
    assert C.tree_problem(want["tokens"], want["parents"], want) is None
    # the same tree in another node order is the same tree
    order = [0] + sorted(range(1, 7), key=lambda i: (C.depths_from(want["parents"])[i], -i))
    pos = {old: new for new, old in enumerate(order)}
    shuffled = ([want["tokens"][i] for i in order], [-1] + [pos[want["parents"][i]] for i in order[1:]])
    assert C.tree_problem(*shuffled, want) is None
    chain = C.reference_tree(lp, 3, wb.DFlash())
    assert "the tree lacks" in C.tree_problem(chain["tokens"], chain["parents"], want)


def test_the_tree_oracle_over_each_slots_best_tokens_is_the_oracle_over_the_vocabulary():
    from ddtree_kernels.oracles import build_tree_greedy_exact

    g = torch.Generator().manual_seed(1)
    for trial in range(12):
        x = torch.randn(5, 40, generator=g)
        if trial % 2:
            x = (x * 2).round() / 2  # many equal log-probs: the tie rule decides
        lp = torch.log_softmax(x, -1)
        for budget, width in ((8, None), (12, 3), (3, None)):
            got = C.reference_tree(lp, 3, wb.DDTree(budget, width=width))
            want = build_tree_greedy_exact(lp, 3, budget, width)
            assert (got["tokens"], got["parents"]) == (want["tokens"], want["parents"]), (trial, budget, width)


def test_the_batched_chain_oracle_is_the_path_oracle(tiny_engines):
    from ddtree_kernels import Tree
    from workbench.models.path_oracle import path_logits

    e = tiny_engines["l4-h32"]
    s = e.session(prompt_ids=[5, 9, 3, 7, 2], policy=wb.DDTree(8), max_new_tokens=6)
    c = s.step()
    tok, par = c.tokens.tolist(), c.parents.tolist()
    ctx = [5, 9, 3, 7, 2]
    z = torch.zeros(1, len(tok), dtype=torch.long)
    want = path_logits(e.models.target, torch.tensor([ctx]), Tree(torch.tensor([tok]), torch.tensor([par]), z, z,
                                                                  z.double()))[0]
    got = chain_logits(e.models.target, ctx, tok, par)
    assert len(tok) > 3 and torch.allclose(got, want, atol=1e-5), float((got - want).abs().max())


# ------------------------------------------------------------------------------------------ clean runs
@pytest.mark.parametrize("pair,policy,batch", [("dense", "ddtree:16", 1), ("dense", "ddtree:16", 4),
                                               ("dense", "dflash", 1), ("dense", "dflash", 4),
                                               pytest.param("hybrid", "ddtree:16", 1, marks=pytest.mark.slow),
                                               pytest.param("hybrid", "dflash", 4, marks=pytest.mark.slow)])
def test_a_clean_run_breaks_no_contract(pair, policy, batch, engine, hybrid_engine, tmp_path):
    e = engine if pair == "dense" else hybrid_engine
    path = write_dump(e, tmp_path / "run.dump", wb.parse_policy(policy), batch, new=NEW if pair == "dense" else 10)
    r = conform(path, models=e.models)
    assert r.broken == [] and r.causes == {} and "diagnosis (" not in str(r), str(r)
    assert r.requests == batch and r.cycles >= batch
    for name, res in r.results.items():
        if name == "recurrent-state parents" and pair == "dense":
            assert res.status == "not checked" and "attention-only" in next(iter(res.not_checked))
        else:
            assert res.status == "passed" and res.checked >= r.cycles - batch, (name, res)


# ------------------------------------------------------------------------------------------ planted faults
def assert_cause(r, fault: str) -> None:
    """The planted fault's first contract diagnosed as its own cause (faults.CAUSE), reproduced in the reference, or
    as reproduced by no candidate, said so."""
    first, cause = r.broken[0], faults.CAUSE[fault]
    found = [c.name for c in r.causes[first]]
    if cause is None:
        assert found == [] and f"  {first}: no candidate reproduces it" in str(r), str(r)
    else:
        assert found == [cause] and f"  {first}: {cause} -- " in str(r), str(r)


@pytest.mark.parametrize("fault", sorted(faults.FAULTS))
def test_a_planted_fault_is_named_by_its_own_contract_first(fault, engine, tmp_path, monkeypatch):
    want = faults.FAULTS[fault](monkeypatch)
    path = write_dump(engine, tmp_path / "run.dump", wb.DDTree(16))
    monkeypatch.undo()  # the checker runs on the same models, fault-free
    r = conform(path, models=engine.models)
    assert r.broken and r.broken[0] == want, str(r)
    first = r.results[want].first
    assert isinstance(first["reference_accept"], int) and isinstance(first["engine_accept"], int)
    assert f"1. {want}: request 0, cycle {first['cycle']}" in str(r)
    assert_cause(r, fault)


@pytest.mark.parametrize("fault", ["target_layer_off_by_one", "features_off_by_a_row"])
def test_a_features_digest_names_the_same_fault_as_whole_rows(fault, engine, tmp_path, monkeypatch):
    """A large model's dump holds a digest of each row (workbench.conform.features): clean, it breaks nothing;
    with a features fault, the same contract and cause are named as from whole rows."""
    from workbench.conform import features

    monkeypatch.setattr(features, "ROWS_MAX_WIDTH", 0)  # the embedded pair's rows as a large model's: digested
    clean = write_dump(engine, tmp_path / "clean.dump", wb.DDTree(16), new=10)
    want = faults.FAULTS[fault](monkeypatch)
    path = write_dump(engine, tmp_path / "run.dump", wb.DDTree(16), new=10)
    monkeypatch.undo()
    head = json.loads(path.read_text().splitlines()[0])
    assert head["features"]["form"] == "digest" and head["features"]["seed"] == features.DIGEST_SEED
    assert '"draft_context_features"' not in path.read_text() and '"draft_context_features_proj"' in path.read_text()
    assert conform(clean, models=engine.models).broken == []
    r = conform(path, models=engine.models)
    assert r.broken[0] == want, str(r)
    assert_cause(r, fault)


def test_features_read_before_the_final_norm_are_named_on_a_pair_that_reads_the_last_layer(tmp_path, monkeypatch):
    """vLLM 0.32's loss, planted in the workbench's engine: only a drafter that reads the target's last layer
    (tests/vllm_pairs.last_layer_pair) can show it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from vllm_pairs import last_layer_pair

    t, d = last_layer_pair(tmp_path / "pair")
    e = wb.load(str(t), str(d))
    clean = e.session(PROMPTS[0], policy=wb.DDTree(8), max_new_tokens=6, record_topk=8, dump=tmp_path / "c.dump")
    clean.run()
    fault = "features_before_final_norm"
    want = getattr(faults, fault)(monkeypatch)
    e.session(PROMPTS[0], policy=wb.DDTree(8), max_new_tokens=6, record_topk=8, dump=tmp_path / "f.dump").run()
    monkeypatch.undo()
    assert conform(tmp_path / "c.dump", models=e.models).broken == []
    r = conform(tmp_path / "f.dump", models=e.models)
    assert r.broken[0] == want and "before the final norm" in r.results[want].first["evidence"], str(r)
    assert_cause(r, fault)


@pytest.mark.slow
@pytest.mark.parametrize("fault,evidence", [("stale_state_parent", "continued the recurrent state of node"),
                                            ("recurrent_state_from_wrong_node", "the state this step committed"),
                                            ("kv_out_of_path_order", "the state this step committed")])
def test_a_state_fault_is_named_on_the_hybrid_pair(hybrid_engine, tmp_path, monkeypatch, fault, evidence):
    """Stale state parents, a recurrent state committed from the wrong node, and K/V rows kept in tree order with
    the recurrent state right: each diagnosed as its own cause by reproducing it, not by the target's kind."""
    want = getattr(faults, fault)(monkeypatch)
    path = write_dump(hybrid_engine, tmp_path / "run.dump", wb.DDTree(16), new=12)
    monkeypatch.undo()
    r = conform(path, models=hybrid_engine.models)
    assert r.broken[0] == want, str(r)
    assert evidence in r.results[want].first["evidence"]
    assert_cause(r, fault)


# ------------------------------------------------------------------------------------------ missing fields
def rewrite(path: Path, out: Path, edit) -> Path:
    """The dump with ``edit(record dict)`` applied to every cycle line (the header, requests and end kept)."""
    lines = path.read_text().splitlines()
    body = []
    for line in lines:
        obj = json.loads(line)
        if obj.get("kind") == "cycle":
            edit(obj)
        body.append(json.dumps(obj))
    out.write_text("\n".join(body) + "\n")
    return out


def test_missing_fields_are_reported_not_checked_never_passed(engine, tmp_path):
    path = write_dump(engine, tmp_path / "run.dump", wb.DDTree(16), new=10)
    bare = rewrite(path, tmp_path / "bare.dump",
                   lambda o: [o.pop(k, None) for k in ("target_topk_ids", "target_topk_values", "visibility",
                                                         "visibility_form", "kv_kept_nodes")])
    r = conform(bare, models=engine.models)
    for name in ("target logits", "visibility"):
        res = r.results[name]
        assert res.status == "not checked" and res.checked == 0 and res.not_checked, (name, res)
    assert "no target_topk_ids, target_topk_values" in str(r) and "no visibility_form" in str(r)
    assert r.results["tree"].status == "passed" and r.broken == []


# ------------------------------------------------------------------------------------------ bad input
@pytest.fixture
def small_dump(engine, tmp_path):
    return write_dump(engine, tmp_path / "run.dump", wb.DFlash(), new=6)


def no_models(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr("workbench.engine.loading.load_models", refuse)


def edit_header(path: Path, out: Path, **pair) -> Path:
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    for k, v in pair.items():
        if k == "version":
            head["version"] = v
        else:
            head["pair"][k] = v
    out.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    return out


@pytest.mark.parametrize("change,field", [({"vocab_size": 32000}, "pair.vocab_size"),
                                          ({"block_size": 8}, "pair.block_size")])
def test_a_dump_of_another_pair_is_refused_naming_the_field_before_loading(small_dump, tmp_path, monkeypatch,
                                                                            change, field):
    no_models(monkeypatch)
    other = edit_header(small_dump, tmp_path / "other.dump", **change)
    with pytest.raises(ConformInputError) as e:
        conform(other)
    msg = str(e.value)
    assert "\n" not in msg and field in msg and "another pair" in msg, msg


def test_foreign_truncated_unknown_version_and_unreadable_layouts_are_one_line_each(small_dump, tmp_path,
                                                                                     monkeypatch):
    no_models(monkeypatch)
    foreign = tmp_path / "foreign.dump"
    foreign.write_text('{"format": "something-else"}\n')
    cut = tmp_path / "cut.dump"
    cut.write_bytes(small_dump.read_bytes()[:40])
    version = edit_header(small_dump, tmp_path / "v9.dump", version=9)
    form = rewrite(small_dump, tmp_path / "form.dump", lambda o: o.update(visibility_form="rle"))
    dtype = rewrite(small_dump, tmp_path / "dtype.dump",
                    lambda o: o.update(tree_parents={"dtype": "float32", "shape": [1], "as": "float32", "z": ""}))
    slots = rewrite(small_dump, tmp_path / "slots.dump", lambda o: o.update(
        draft_topk_ids=pack_tensor(torch.zeros(20, 4, dtype=torch.long)),
        draft_topk_values=pack_tensor(torch.zeros(20, 4))))
    vocab = rewrite(small_dump, tmp_path / "vocab.dump", lambda o: o.update(tree_tokens=pack_tensor(
        torch.full((2,), 99999))))
    for path, words in ((foreign, "not a ddtree-workbench-dump"), (cut, "no whole header line"),
                        (version, "dump version 9"), (form, "visibility_form 'rle'"),
                        (dtype, "tree_parents has dtype float32"),
                        (slots, "draft_topk_ids has 20 drafted slots; the pair's block of 16"),
                        (vocab, "tree_tokens holds token 99999, outside the pair's vocabulary of 4096")):
        with pytest.raises((ConformInputError, DumpFileError)) as e:
            conform(path)
        assert "\n" not in str(e.value) and words in str(e.value), (path.name, str(e.value))


def test_features_of_another_digest_or_width_are_refused_in_one_line_before_loading(small_dump, tmp_path,
                                                                                   monkeypatch):
    """A digest made with another projection seed or size, whole rows of another width than the
    drafter's target layers, a digest under a header without its projection: one line each, before any model
    loads (ConformInputError, a ValueError; the CLI's exit 2)."""
    from workbench.conform import features

    no_models(monkeypatch)
    lines = small_dump.read_text().splitlines()
    head = json.loads(lines[0])

    def variant(name: str, header: dict | None, edit=None) -> Path:
        body = [json.dumps(header if header is not None else head)]
        for line in lines[1:]:
            obj = json.loads(line)
            if edit is not None and obj.get("kind") == "cycle" and "draft_context_features" in obj:
                edit(obj)
            body.append(json.dumps(obj))
        out = tmp_path / name
        out.write_text("\n".join(body) + "\n")
        return out

    def as_digest(seed, dims):
        def edit(o):
            from workbench.records.tensor_codec import unpack_tensor

            rows = unpack_tensor(o.pop("draft_context_features"))
            x = rows.reshape(rows.shape[0], 4, -1) @ torch.randn(256, dims, generator=torch.Generator().manual_seed(seed))
            o.update(draft_context_features_rms=pack_tensor(rows.reshape(rows.shape[0], 4, -1).pow(2).mean(-1).sqrt()),
                     draft_context_features_proj=pack_tensor(x))
        return edit

    digest = {**head, "features": {"form": "digest", "layers": 4, "hidden": 256, "seed": 7, "dims": 8}}
    small = {**head, "features": {"form": "digest", "layers": 4, "hidden": 256, "seed": features.DIGEST_SEED,
                                  "dims": 4}}
    cases = (
        (variant("seed.dump", digest, as_digest(7, 8)), "the features digest was made with projection seed 7 and 8 "
         f"dims; this checker's digest is seed {features.DIGEST_SEED} with 8 dims"),
        (variant("dims.dump", small, as_digest(features.DIGEST_SEED, 4)), "made with projection seed "
         f"{features.DIGEST_SEED} and 4 dims"),
        (variant("width.dump", None, lambda o: o.update(draft_context_features=pack_tensor(torch.zeros(2, 1280)))),
         "draft_context_features [2, 1280] are 1280 values a row, but the drafter reads 4 target layers of hidden "
         "size 256 = 1024"),
        (variant("nohead.dump", {k: v for k, v in head.items() if k != "features"}),
         "the record holds drafter features but the header has no 'features'"),
        (variant("layers.dump", {**head, "features": {"form": "rows", "layers": 3, "hidden": 256}}),
         "the header's features hold 3 target layers a row but the pair's drafter reads 4"),
    )
    for path, words in cases:
        with pytest.raises(ConformInputError) as e:
            conform(path)
        assert "\n" not in str(e.value) and words in str(e.value), (path.name, str(e.value))
    assert main(["conform", str(cases[0][0])]) == 2


def test_a_dump_cut_short_mid_record_is_checked_up_to_its_last_whole_record(engine, small_dump, tmp_path):
    data = small_dump.read_bytes()
    cut = tmp_path / "cut.dump"
    cut.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) - 30])  # the end line gone, a record cut short
    r = conform(cut, models=engine.models)
    assert any("cut short" in n for n in r.notes) and r.cycles >= 1 and r.broken == []


def test_the_cli_checks_a_dump_and_refuses_bad_input_in_one_line(small_dump, tmp_path, capsys):
    rc = main(["conform", str(small_dump), "--quiet", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    data = json.loads(out.out)
    assert data["broken"] == [] and [c["contract"] for c in data["contracts"]] == list(C.CONTRACTS)
    other = edit_header(small_dump, tmp_path / "other.dump", vocab_size=5)
    rc = main(["conform", str(other)])  # refused before the pair loads: in this process
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "pair.vocab_size" in err, err


# ------------------------------------------------------------------------------------------ cost
@pytest.mark.slow
def test_checking_64_cycles_of_the_embedded_pair_takes_under_a_minute(engine, tmp_path):
    """The bound docs/conformance.md states for 64 cycles (it has the measured figure and its command)."""
    import time

    path = tmp_path / "run.dump"
    engine.batch_session(PROMPTS, wb.DDTree(16), max_new_tokens=80, record_topk=16, dump=path).run()
    short = tmp_path / "64.dump"  # the first 64 cycle records (and the requests they belong to)
    lines = path.read_text().splitlines()
    cycles = [i for i, line in enumerate(lines) if '"kind":"cycle"' in line]
    assert len(cycles) >= 64
    kept = lines[: cycles[63] + 1]
    short.write_text("\n".join(kept + [json.dumps({"kind": "end", "records": len(kept) - 1})]) + "\n")
    t0 = time.perf_counter()
    r = conform(short)  # the pair loaded from the dump's header: loading counts
    seconds = time.perf_counter() - t0
    assert r.cycles == 64 and r.broken == [], str(r)
    assert seconds < 60, f"{r.cycles} cycles checked in {seconds:.1f} s"


# ------------------------------------------------------------------------------------------ vLLM
@pytest.mark.slow
def test_vllm_cpu_dflash_shows_each_known_loss_under_the_drafter_contracts(tmp_path):
    """vLLM 0.32 CPU's two silent losses (workbench.adapters.vllm_workarounds), each left in alone: the shared
    k_norm breaks the drafter's output and nothing else the dump holds; the last layer's feature read before the
    final norm is named by the drafter features first (what its proposer was handed), matched to its cause; with
    both worked around no contract breaks."""
    from workbench.adapters import vllm_workarounds

    sys.path.insert(0, str(ROOT / "tests"))
    from vllm_pairs import last_layer_pair

    t, d = last_layer_pair(tmp_path / "pair")
    reports = {}
    for left_in in ("per_layer_k_norm", "last_layer_feature", None):
        fixes = [n for n in vllm_workarounds.PATCHES if n != left_in]
        if left_in is not None:
            vllm_workarounds.apply(fixes)  # the other loss fixed: this one alone is left in
        try:
            e = wb.load(str(t), str(d), engine="vllm", workarounds=left_in is None)
            path = tmp_path / f"{left_in}.dump"
            e.session(PROMPTS[0], max_new_tokens=12, dump=path).run()
            e.close()
        finally:
            vllm_workarounds.undo()
        reports[left_in] = conform(path)
    for left_in, want in (("per_layer_k_norm", ["drafter output"]),
                          ("last_layer_feature", ["drafter features", "drafter output"])):
        r = reports[left_in]
        assert r.broken == want, (left_in, str(r))
        for name in ("drafter context", "tree", "target logits", "accept walk", "committed tokens"):
            assert r.results[name].status == "passed", (left_in, name, str(r))
        assert r.results["verify positions"].status == "not checked"  # vLLM's tap reads no verify positions
    assert reports["per_layer_k_norm"].results["drafter features"].status == "passed"
    assert [c.name for c in reports["last_layer_feature"].causes["drafter features"]] == [
        faults.CAUSE["features_before_final_norm"]], str(reports["last_layer_feature"])
    assert reports[None].broken == [], str(reports[None])


@pytest.mark.slow
def test_vllm_with_shifted_block_positions_is_named_under_the_drafter_context(tmp_path, monkeypatch):
    """Shifted block positions planted into vLLM with both known losses worked around: the dump's
    block positions name it, and the drafter's output is the first thing it spoils."""
    sys.path.insert(0, str(ROOT / "tests"))
    from vllm_pairs import last_layer_pair

    t, d = last_layer_pair(tmp_path / "pair")
    want = faults.vllm_block_positions_shifted(monkeypatch)
    e = wb.load(str(t), str(d), engine="vllm", workarounds=True)
    try:
        e.session(PROMPTS[0], max_new_tokens=12, dump=tmp_path / "v.dump").run()
    finally:
        e.close()
    r = conform(tmp_path / "v.dump")
    assert r.broken[0] == want, str(r)
    assert "block slot 0 is at position" in r.results[want].first["evidence"]
    assert [c.name for c in r.causes[want]] == ["the drafter's block at shifted positions (RoPE phase skew)"], str(r)


# ------------------------------------------------------------------------------------------ visibility forms
def as_form(form: str, cut_byte: bool = False):
    """A cycle-record edit: the dense visibility rewritten as SGLang's flat mask, FlashInfer's packed bits or a bias."""
    from workbench.conform.convert import pack_flashinfer
    from workbench.records.tensor_codec import unpack_tensor

    def edit(o):
        vis = unpack_tensor(o.pop("visibility")).bool()  # [n, n]
        n, start = vis.shape[0], o["context_len"]
        if form == "sglang_mask":
            full = torch.cat([torch.ones(n, start, dtype=torch.bool), vis], 1)
            o.update(sglang_custom_mask=pack_tensor(full.reshape(-1)), sglang_mask_mode="FULL_MASK")
        elif form == "flashinfer_packed":
            packed = pack_flashinfer(vis)[: -1 if cut_byte else None]  # a wrong indptr hands over a byte too few
            o.update(fi_packed_mask=pack_tensor(packed), fi_kv_len=n,
                     fi_mask_indptr=pack_tensor(torch.tensor([0, packed.numel()])))
        else:
            o.update(attn_bias=pack_tensor(torch.zeros(n, n).masked_fill(~vis, float("-inf"))))
        o["visibility_form"] = form
    return edit


def test_visibility_is_checked_from_whichever_form_the_engine_held(engine, tmp_path):
    path = write_dump(engine, tmp_path / "run.dump", wb.DDTree(16), new=8)
    for form in ("sglang_mask", "flashinfer_packed", "bias"):
        r = conform(rewrite(path, tmp_path / f"{form}.dump", as_form(form)), models=engine.models)
        assert r.broken == [] and r.results["visibility"].checked == r.cycles, (form, str(r))
    r = conform(rewrite(path, tmp_path / "cut.dump", as_form("flashinfer_packed", cut_byte=True)), models=engine.models)
    assert r.broken[0] == "visibility" and "indptr" in r.results["visibility"].first["evidence"], str(r)
