"""The checker never judges what it cannot (its input and its arguments): a dump with nothing to
check, a file not as its writer wrote it, a dump of another pair (down to the weights) and a header that says
the target is not what it is are refused in one line naming the value and the fix, before any model loads
where the file alone shows it; a check that judged nothing is no verdict; the report names the pair it used
and every policy the run used.

One short batch dump is written for the module and edited copy by copy; only two tests replay cycles."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import workbench as wb
from workbench.cli import main
from workbench.conform.check import ConformInputError, conform
from workbench.engine.loading import ASSETS

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = ["def parse(line):", "class Stack:"]


@pytest.fixture(scope="module")
def batch_dump(engine, tmp_path_factory):
    """Two requests (prompts of different lengths) batched, DDTree(16), a few steps each."""
    path = tmp_path_factory.mktemp("refusals") / "batch.dump"
    b = engine.batch_session(PROMPTS, wb.DDTree(16), max_new_tokens=16, record_topk=16, dump=path)
    b.run()
    assert all(len(s.trace.cycles) >= 3 for s in b.sessions)  # the edits below take a request's second cycle
    return path


@pytest.fixture
def no_models(monkeypatch):
    """Refusals come before any pair loads, and nothing is replayed."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded or a cycle replayed before the bad input was refused")

    monkeypatch.setattr("workbench.engine.loading.load_models", refuse)
    monkeypatch.setattr("workbench.models.drafter_reference.Reference.__init__", refuse)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def save(objs: list[dict], out: Path, fix_end: bool = True) -> Path:
    """Write ``objs`` as a dump; the end line's count made to agree (an edit that keeps the file's own count
    honest, as a user's reproduction would)."""
    if fix_end and objs[-1].get("kind") == "end":
        objs[-1]["records"] = len(objs) - 2
    out.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return out


def cycle_at(objs: list[dict], request: str, k: int) -> int:
    """The index in ``objs`` of request ``request``'s k-th cycle record."""
    return [i for i, o in enumerate(objs) if o.get("kind") == "cycle" and o["request"] == request][k]


def refused(path, match: str, **kw) -> str:
    with pytest.raises(ConformInputError) as e:
        conform(path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and match in msg, msg
    return msg


# ------------------------------------------------------------------------------------------ nothing to check
def test_a_header_only_dump_is_refused_and_the_cli_exits_2(batch_dump, tmp_path, no_models, capsys):
    objs = lines(batch_dump)
    empty = save([objs[0], {"kind": "end", "records": 0}], tmp_path / "empty.dump")
    refused(empty, "holds no cycle record (0 request record(s), the end line): nothing to check")
    requests_only = save([o for o in objs if o.get("kind") != "cycle"], tmp_path / "requests.dump")
    refused(requests_only, "holds no cycle record (2 request record(s)")
    assert main(["conform", str(empty), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing to check" in err, err


def test_a_dump_whose_cycles_hold_no_contracts_fields_is_refused_before_loading(batch_dump, tmp_path, no_models,
                                                                                 capsys):
    keep = {"kind", "seq", "request", "step", "cycle", "row", "rows", "policy", "context_len", "root_token"}
    objs = [{k: v for k, v in o.items() if k in keep} if o.get("kind") == "cycle" else o for o in lines(batch_dump)]
    bare = save(objs, tmp_path / "bare.dump")
    refused(bare, "holds the fields any contract reads")
    assert main(["conform", str(bare), "--quiet"]) == 2
    assert "nothing could be checked" in capsys.readouterr().err


def test_a_check_that_judged_nothing_is_refused_not_reported_passed(engine, batch_dump, tmp_path):
    """The tree's own fields alone: the tree contract needs the drafter's output too, so every contract ends
    not checked on replay, and that is no verdict."""
    keep = {"kind", "seq", "request", "step", "cycle", "row", "rows", "tree_tokens", "tree_parents"}
    objs = [{k: v for k, v in o.items() if k in keep} if o.get("kind") == "cycle" else o for o in lines(batch_dump)]
    refused(save(objs, tmp_path / "tree-only.dump"), "no contract could be checked", models=engine.models)


# ------------------------------------------------------------------------------------------ the file as written
def test_records_missing_repeated_or_out_of_order_are_named_by_their_number(batch_dump, tmp_path, no_models):
    objs = lines(batch_dump)
    i = cycle_at(objs, "0", 1)
    seq = objs[i]["seq"]
    gone = save(objs[:i] + objs[i + 1:], tmp_path / "gone.dump")
    refused(gone, f"record {seq} is missing (record {seq - 1} is at {gone}:{i})")
    twice = save(objs[:i + 1] + [objs[i]] + objs[i + 1:], tmp_path / "twice.dump")
    refused(twice, f"{twice}:{i + 2}: record {seq} appears twice (first at {twice}:{i + 1})")
    swapped = save(objs[:i] + [objs[i + 1], objs[i]] + objs[i + 2:], tmp_path / "swapped.dump")
    refused(swapped, f"{swapped}:{i + 1}: record {seq + 1} where record {seq} was due (record {seq} is at "
                     f"{swapped}:{i + 2}): records out of order")


def test_an_unnumbered_dump_with_a_record_lost_is_named_by_the_requests_cycle_numbers(batch_dump, tmp_path,
                                                                                      no_models):
    """A dump from before ``seq`` (or a writer without it): each request's cycle numbers still show the loss."""
    objs = [{k: v for k, v in o.items() if k != "seq"} for o in lines(batch_dump)]
    i = cycle_at(objs, "0", 1)
    refused(save(objs[:i] + objs[i + 1:], tmp_path / "old.dump"), "request '0''s cycle 2 where its cycle 1 was next")


def test_a_dump_without_a_requests_record_is_refused(batch_dump, tmp_path, no_models):
    objs = lines(batch_dump)
    j = next(i for i, o in enumerate(objs) if o.get("kind") == "request" and o["request"] == "1")
    lost = objs[:j] + objs[j + 1:]
    refused(save(lost, tmp_path / "lost.dump"), f"record {objs[j]['seq']} is missing")  # the numbers say it first
    for n, o in enumerate(o for o in lost if "seq" in o):  # a writer that never wrote it: numbered without it
        o["seq"] = n
    refused(save(lost, tmp_path / "never.dump"), "a cycle of request '1' with no request record before it")


def test_two_rows_request_ids_swapped_are_refused_by_each_requests_context(batch_dump, tmp_path, no_models):
    objs = lines(batch_dump)
    a, b = cycle_at(objs, "0", 1), cycle_at(objs, "1", 1)
    assert objs[a]["step"] == objs[b]["step"]  # two rows of one step
    objs[a]["request"], objs[b]["request"] = "1", "0"  # the lines stay where they were: seq cannot see it
    msg = refused(save(objs, tmp_path / "ids.dump"), "this record of request '1' (step")
    assert "continues request '0''s context" in msg
    assert "the rows' request ids are swapped or mislabelled" in msg and f"ids.dump:{min(a, b) + 1}" in msg


# ------------------------------------------------------------------------------------------ another pair
def edit_pair(path: Path, out: Path, **changes) -> Path:
    objs = lines(path)
    for k, v in changes.items():
        if v is None:
            objs[0]["pair"].pop(k, None)
        else:
            objs[0]["pair"][k] = v
    return save(objs, out, fix_end=False)


def test_a_header_that_says_attention_only_over_a_hybrid_target_is_refused_and_the_reverse(batch_dump, tmp_path,
                                                                                         no_models):
    hybrid = {"target": str(ASSETS / "hybrid" / "target"), "draft": str(ASSETS / "hybrid" / "draft")}
    refused(batch_dump, "(pair.hybrid false) but the target here", **hybrid)  # the dense dump on the hybrid pair
    unsaid = edit_pair(batch_dump, tmp_path / "unsaid.dump", hybrid=None)  # as the SGLang hook's example header
    msg = refused(unsaid, "(pair.hybrid absent) but the target here", **hybrid)
    assert 'write "hybrid": true in the header' in msg
    said = edit_pair(batch_dump, tmp_path / "said.dump", hybrid=True)
    refused(said, "says the target is hybrid (pair.hybrid true) but the target here")


def test_a_dump_checked_on_another_pair_is_refused_by_its_weights_before_any_replay(engine, batch_dump, tmp_path,
                                                                                   monkeypatch):
    """The dense target with the hybrid pair's drafter: vocabulary, block, mask token and target layers all
    agree with the header, the weights do not (the pair is loaded to see them, nothing is replayed)."""
    def no_replay(*a, **k):
        raise AssertionError("a cycle was replayed on the wrong pair")

    monkeypatch.setattr("workbench.models.drafter_reference.Reference.__init__", no_replay)
    msg = refused(batch_dump, "and the drafter's weights differ", target=str(ASSETS / "target"),
                  draft=str(ASSETS / "hybrid" / "draft"))
    assert "written with target workbench/assets/target, draft workbench/assets/draft" in msg
    assert "the pair here is target workbench/assets/target, draft workbench/assets/hybrid/draft" in msg
    fp = lines(batch_dump)[0]["pair"]["fingerprint"]
    other = edit_pair(batch_dump, tmp_path / "fp.dump", fingerprint={**fp, "target": "0" * 16})
    refused(other, "the target's weights differ", models=engine.models)


# ------------------------------------------------------------------------------------------ what the report says
def test_the_report_names_every_policy_used_the_pair_used_and_a_missing_fingerprint(engine, tmp_path):
    """One full check: a session whose policy changed mid-run, checked with the engine itself as models=, its
    header naming the target by another path and holding no fingerprint (an older writer's)."""
    path = tmp_path / "changed.dump"
    s = engine.session(PROMPTS[0], policy=wb.DDTree(8), max_new_tokens=14, record_topk=16, dump=path)
    s.step()
    s.step()
    s.policy = wb.DFlash()
    s.run()
    edited = edit_pair(path, tmp_path / "edited.dump", target="/elsewhere/target", fingerprint=None)
    r = conform(edited, models=engine)  # the workbench engine itself: its .models
    text = str(r)
    assert r.policies == ["DDTree(8)", "DFlash"] and ", policies DDTree(8) and DFlash, " in text.splitlines()[0]
    assert ("pair: target workbench/assets/target, draft workbench/assets/draft (float32); the dump names target "
            "/elsewhere/target") in text
    assert r.notes[0].startswith("pair not checked: no fingerprint of the weights in the header")
    assert r.broken == [], text


# ------------------------------------------------------------------------------------------ the arguments
def test_arguments_that_are_not_a_dump_a_pair_or_a_device_are_one_line_each(batch_dump, tmp_path, no_models,
                                                                          capsys):
    from workbench.adapters.vllm_engine import VllmEngine
    from workbench.serve.client import RemoteEngine

    for bad, words in ((None, "dump=None must be the path of a cycle dump"),
                       (123, "dump=123 must be the path of a cycle dump")):
        with pytest.raises(ConformInputError, match="wb.conform\\('run.dump'\\)") as e:
            wb.conform(bad)
        assert words in str(e.value)
    remote = object.__new__(RemoteEngine)  # what wb.connect returns, without a server to reach
    refused(batch_dump, "models= is a remote engine (wb.connect(...))", models=remote)
    refused(batch_dump, "models= is the vllm engine, not the workbench's", models=object.__new__(VllmEngine))
    refused(batch_dump, "models='x' is not a loaded pair", models="x")
    refused(batch_dump, "give models= or target= / draft=, not both", models="x", target="t")
    refused(batch_dump, "device='tpu' is not a device this workbench runs on", device="tpu")
    refused(batch_dump, "progress=3 must be a callable", progress=3)
    assert main(["conform", str(batch_dump), "--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "use cpu, cuda or cuda:N" in err and "Expected one of" not in err, err

