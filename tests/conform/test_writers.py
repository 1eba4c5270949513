"""The workbench's engine writes cycle dumps (dense and hybrid pairs, DDTree and DFlash, batch 1 and 4): every
record agrees with the session's own trace and tokens, and with dumping off nothing of the writer runs."""
from __future__ import annotations

import pytest
import torch

import workbench as wb
from workbench.conform import engine_dump
from workbench.conform.dump import read_dump

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = ["def add(a, b):", "The capital of France is", "for i in range(10):", "Once upon a time"]


@pytest.fixture(scope="module")
def hybrid_engine():
    return wb.load("hybrid")


def cycles_by_request(path):
    head, recs = read_dump(path)
    reqs, cycles = {}, {}
    for r in recs:
        if r.kind == "request":
            reqs[r.request] = r
        else:
            cycles.setdefault(r.request, []).append(r)
    assert recs.complete and recs.truncated is None
    return head, reqs, cycles


def check_request(req, cycles, session, block_size):
    """One request's records against its session: trace fields, the drafter's context chain, the tokens."""
    assert req["prompt_ids"].tolist() == session.prompt_ids and req["first_token"] == session.generated[0]
    assert [c["cycle"] for c in cycles] == list(range(len(session.trace.cycles)))
    seq = session.prompt_ids + session.generated
    committed, drafted_to = [], 0
    for i, (rec, cyc) in enumerate(zip(cycles, session.trace.cycles)):
        assert rec["context_len"] == cyc.start and rec["root_token"] == cyc.root_token == seq[cyc.start]
        for name, attr in (("tree_tokens", "tokens"), ("tree_parents", "parents"), ("tree_depths", "depth"),
                           ("verify_positions", "position_ids"), ("visibility", "visibility"),
                           ("target_choice", "target_choice"), ("accepted_nodes", "accepted_nodes"),
                           ("target_topk_ids", "target_top2_tokens")):
            assert torch.equal(rec[name], getattr(cyc, attr)), (i, name)
        if cyc.draft_topk_tokens.numel():  # a row that keeps no drafted slot (at its token limit) has none
            assert torch.equal(rec["draft_topk_ids"], cyc.draft_topk_tokens) and rec["draft_values"] == "logprobs"
        else:
            assert "draft_topk_ids" not in rec
        assert rec["bonus"] == cyc.bonus and rec["visibility_form"] == "dense"
        # the drafter took in exactly the tokens committed since its last draft, at their own positions
        if "draft_context_positions" in rec:
            assert rec["draft_context_positions"].tolist() == list(range(drafted_to, cyc.start)), i
            assert rec["draft_context_tokens"].tolist() == seq[drafted_to: cyc.start]
            assert rec["draft_block_positions"].tolist() == list(range(cyc.start, cyc.start + block_size))
            assert rec["draft_block_tokens"][0] == cyc.root_token
            # the features the drafter's forward was handed for those rows, one per row (whole: a small pair)
            assert rec["draft_context_features"].shape[0] == cyc.start - drafted_to
            drafted_to = cyc.start
        else:  # no draft forward ran this step (the request's last token: nothing to draft)
            assert cyc.draft_topk_tokens.numel() == 0 and i == len(cycles) - 1
        assert torch.equal(rec["kv_kept_nodes"], cyc.accepted_nodes)
        if i + 1 < len(cycles):
            assert rec["next_context_len"] == cycles[i + 1]["context_len"]
        committed += rec["committed_tokens"].tolist()
    assert committed == session.generated[1:]


@pytest.mark.parametrize("policy", [wb.DDTree(8), wb.DFlash()], ids=str)
def test_session_dump_matches_its_trace(engine, tmp_path, policy):
    s = engine.session(PROMPTS[0], policy=policy, max_new_tokens=24, dump=tmp_path / "run.dump")
    s.run()
    head, reqs, cycles = cycles_by_request(tmp_path / "run.dump")
    assert head["engine"]["name"] == "workbench" and head["policy"] == str(policy)
    assert head["pair"]["vocab_size"] == 4096 and head["pair"]["block_size"] == engine.models.block_size
    assert head["pair"]["hybrid"] is False
    assert head["features"] == {"form": "rows", "layers": 4, "hidden": 256}  # the drafter reads 4 layers of 256
    assert list(reqs) == ["0"] and [c["step"] for c in cycles["0"]] == list(range(len(s.trace.cycles)))
    check_request(reqs["0"], cycles["0"], s, engine.models.block_size)
    assert all("state_from" not in c for c in cycles["0"])
    # what this writer leaves out: the other visibility forms' companions and the recurrent-state parents
    assert cycles["0"][0].missing() == ["sglang_mask_mode", "fi_mask_indptr", "fi_kv_len", "state_from"]


@pytest.mark.parametrize("policy", [wb.DDTree(8), wb.DFlash()], ids=str)
def test_batch_of_four_dump_one_record_per_row_per_step(engine, tmp_path, policy):
    b = engine.batch_session(PROMPTS, policy=policy, max_new_tokens=[12, 20, 16, 24], dump=tmp_path / "b.dump")
    b.run()
    head, reqs, cycles = cycles_by_request(tmp_path / "b.dump")
    assert head["batch"] == 4 and sorted(reqs) == ["0", "1", "2", "3"]
    for i, s in enumerate(b.sessions):
        check_request(reqs[str(i)], cycles[str(i)], s, engine.models.block_size)
    # the rows of one step share it; the batch shrinks as requests finish
    by_step = {}
    for rs in cycles.values():
        for r in rs:
            by_step.setdefault(r["step"], []).append(r)
    assert len(by_step) == len(b.cycles)
    for step, rs in by_step.items():
        assert sorted(r["row"] for r in rs) == list(range(len(rs))) and {r["rows"] for r in rs} == {len(rs)}
        assert len(rs) == len(b.cycles[step].requests)


@pytest.mark.parametrize("policy", [wb.DDTree(6), wb.DFlash()], ids=str)
def test_hybrid_dump_holds_recurrent_state_parents(hybrid_engine, tmp_path, policy):
    b = hybrid_engine.batch_session(PROMPTS[:4] if isinstance(policy, wb.DDTree) else PROMPTS[:1], policy=policy,
                                    max_new_tokens=12, dump=tmp_path / "h.dump")
    b.run()
    head, reqs, cycles = cycles_by_request(tmp_path / "h.dump")
    assert head["pair"]["hybrid"] is True
    for i, s in enumerate(b.sessions):
        check_request(reqs[str(i)], cycles[str(i)], s, hybrid_engine.models.block_size)
        for rec, cyc in zip(cycles[str(i)], s.trace.cycles):
            assert torch.equal(rec["state_from"], cyc.state_from)


def test_static_shapes_dump_reads_the_same_context(engine, tmp_path):
    s = engine.session(PROMPTS[1], policy=wb.DDTree(8), max_new_tokens=20, static_shapes=True,
                       dump=tmp_path / "s.dump")
    s.run()
    _, reqs, cycles = cycles_by_request(tmp_path / "s.dump")
    assert cycles_by_request and reqs["0"]  # noqa: the checks below
    check_request(reqs["0"], cycles["0"], s, engine.models.block_size)


def test_dump_off_by_default_runs_nothing(engine, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the dump writer ran with dumping off")

    for name in ("__init__", "on_begin", "on_draft_input", "on_committed", "on_record"):
        monkeypatch.setattr(engine_dump.EngineDump, name, boom)
    s = engine.session(PROMPTS[2], policy=wb.DDTree(8), max_new_tokens=12)
    assert s.dump is None and not s.hook_points  # no hook on the request: the cycle runs no hook code at all
    s.run()
    b = engine.batch_session(PROMPTS[:2], policy=wb.DFlash(), max_new_tokens=8)
    b.run()
    assert all(x.dump is None for x in b.sessions)


def test_stopped_early_then_closed_and_resumed(engine, tmp_path):
    s = engine.session(PROMPTS[3], policy=wb.DDTree(8), max_new_tokens=16, dump=tmp_path / "r.dump")
    s.step()
    _, recs = read_dump(tmp_path / "r.dump")
    assert [r.kind for r in recs] == ["request", "cycle"] and not recs.complete  # readable mid-run
    s.run()
    recs = read_dump(tmp_path / "r.dump")[1]
    assert len(list(recs)) == 1 + len(s.trace.cycles) and recs.complete and s.dump.writer.closed
    s.run(max_new_tokens=30)  # a finished session resumed: the file reopens, and closes again at the end
    _, reqs, cycles = cycles_by_request(tmp_path / "r.dump")
    check_request(reqs["0"], cycles["0"], s, engine.models.block_size)


def test_bad_dump_path_refused_in_one_line_before_the_prefill(engine, tmp_path, monkeypatch):
    from workbench.engine.runner import Rows

    def no_prefill(*a, **k):
        raise AssertionError("prefill ran before the dump path was checked")

    monkeypatch.setattr(Rows, "prefill", no_prefill)
    for bad, match in ((tmp_path / "missing" / "x.dump", "folder .* does not exist"),
                       (tmp_path, "is a directory"), (3, "dump=3 must be a path")):
        with pytest.raises(ValueError, match=match) as e:
            engine.session(PROMPTS[0], dump=bad)
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match=match):
            engine.batch_session(PROMPTS[:2], dump=bad)


@pytest.mark.slow  # loading vLLM's CPU build: 5 s idle, a minute on a busy machine
def test_vllm_dflash_session_writes_a_chain_dump(tmp_path):
    from workbench.adapters import vllm_tap

    vllm_tap.check_version()  # one line naming the fix when vLLM is missing
    e = wb.load(engine="vllm")
    try:
        s = e.session("def parse(line):\n    ", max_new_tokens=20, dump=tmp_path / "v.dump")
        s.run()
    finally:
        e.close()
    head, reqs, cycles = cycles_by_request(tmp_path / "v.dump")
    (rid,) = reqs
    assert head["engine"]["name"] == "vllm" and head["pair"]["vocab_size"] == 4096
    assert head["features"] == {"form": "rows", "layers": 4, "hidden": 256}
    seq = s.prompt_ids + s.generated
    committed, drafted_to = [], 0
    for rec, cyc in zip(cycles[rid], s.trace.cycles):
        n = cyc.tokens.shape[0]
        assert rec["tree_parents"].tolist() == list(range(-1, n - 1))  # a chain is a tree
        assert rec["tree_tokens"].tolist() == cyc.tokens.tolist() and rec["context_len"] == cyc.start
        # vLLM's proposer context: the rows committed since its last proposal, at their positions
        assert rec["draft_context_positions"].tolist() == list(range(drafted_to, cyc.start))
        assert rec["draft_context_tokens"].tolist() == seq[drafted_to:cyc.start]
        drafted_to = cyc.start
        assert rec["draft_block_positions"][0] == cyc.start and rec["draft_block_tokens"][0] == cyc.root_token
        assert rec["draft_values"] == "logits"
        # what vLLM's proposer was handed for those rows: the target's layers 1-4 side by side, 4 x 256 wide
        assert list(rec["draft_context_features"].shape) == [len(rec["draft_context_positions"]), 1024]
        assert rec["draft_topk_ids"][: n - 1, 0].tolist() == cyc.tokens[1:].tolist()  # greedy drafts: the top-1
        assert rec["target_topk_ids"][:, 0].tolist() == cyc.target_choice.tolist()
        assert rec["accepted_nodes"].tolist() == cyc.accepted_nodes.tolist() and rec["bonus"] == cyc.bonus
        assert "verify_positions" in rec["notes"] and "verify_positions" in rec.missing()
        committed += rec["committed_tokens"].tolist()
    assert committed == s.generated[1:]
    if len(s.generated) == 20:  # the last step met the limit: vLLM cut its accepted path, and the record says so
        assert "reached max_new_tokens=20" in cycles[rid][-1]["notes"]
        assert all("max_new_tokens" not in r["notes"] for r in cycles[rid][:-1])


def test_the_engine_imports_no_writer_and_refuses_dump_when_none_is_registered(engine, tmp_path, monkeypatch):
    """The dump's writer reaches the engine through the session-observer registry (workbench.engine.observers),
    registered by workbench.conform.engine_dump as it is imported; without it, dump= is refused in one line."""
    from workbench.engine import observers

    assert observers.observer("dump").attach is engine_dump.attach  # registered by `import workbench`
    monkeypatch.setattr(observers, "OBSERVERS", {})
    for start in (lambda: engine.session(PROMPTS[0], dump=tmp_path / "x.dump"),
                  lambda: engine.batch_session(PROMPTS[:2], dump=tmp_path / "x.dump")):
        with pytest.raises(ValueError) as e:
            start()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("dump= has no observer registered") and \
            "workbench.conform.engine_dump" in msg, msg
    assert not (tmp_path / "x.dump").exists()
