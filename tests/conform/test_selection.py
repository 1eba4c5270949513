"""A checker for real runs: ``conform(dump, cycles=(A, B), requests=[...])`` and ``conform
--cycles A:B --requests ID,...`` judge a slice of a long dump, reading every record before it for the history
two contracts need (the committed context; the positions the drafter took in); a slice that is malformed or
outside the dump is refused in one line before any model loads; a long check prints its progress on stderr.

One short batch dump (two requests) is written for the module; the slices replay a few cycles each."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import workbench as wb
from workbench.cli import main
from workbench.conform.check import ConformInputError, conform
from workbench.conform.progress import Progress, duration

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = ["def parse(line):", "class Stack:"]


@pytest.fixture(scope="module")
def batch_dump(engine, tmp_path_factory):
    """Two requests batched, DDTree(16): at least five steps each."""
    path = tmp_path_factory.mktemp("selection") / "batch.dump"
    b = engine.batch_session(PROMPTS, wb.DDTree(16), max_new_tokens=40, record_topk=16, dump=path)
    b.run()
    assert all(len(s.trace.cycles) >= 5 for s in b.sessions), [len(s.trace.cycles) for s in b.sessions]
    return path


@pytest.fixture
def no_models(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded or a cycle replayed before the bad slice was refused")

    monkeypatch.setattr("workbench.engine.loading.load_models", refuse)
    monkeypatch.setattr("workbench.models.drafter_reference.Reference.__init__", refuse)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def steps_of(path: Path, request: str | None = None) -> list[int]:
    return [o["step"] for o in records(path) if o.get("kind") == "cycle" and request in (None, o["request"])]


def refused(path, match: str, **kw) -> str:
    with pytest.raises(ConformInputError) as e:
        conform(path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and match in msg, msg
    return msg


def test_a_malformed_or_empty_slice_is_refused_in_one_line_before_any_model_loads(batch_dump, no_models, capsys):
    last = max(steps_of(batch_dump))
    for cycles, words in (("5", "cycles='5': give engine steps A to B - 1 as (A, B) or 'A:B'"),
                          ("a:b", "cycles='a:b'"), ((3, 3), "the slice ends at step 3, not after its start 3"),
                          ((-1, 4), "steps are whole numbers from 0"), ((True, 4), "steps are whole numbers"),
                          (7, "cycles=7: give engine steps")):
        refused(batch_dump, words, cycles=cycles)
    msg = refused(batch_dump, f"cycles 500:600 select no cycle of {batch_dump}", cycles=(500, 600))
    assert f"run from step 0 to step {last}; give a slice that meets them (e.g. --cycles 0:{last + 1})" in msg
    refused(batch_dump, f"cycles {last + 1}: select no cycle", cycles=(last + 1, None))
    refused(batch_dump, "requests '7', 'x' are not in", requests=["7", "x"])
    refused(batch_dump, "its 2 request(s) with cycles: '0', '1'", requests=[7])
    refused(batch_dump, "requests=[] selects no request", requests=[])
    refused(batch_dump, "requests holds None", requests=[None])
    assert main(["conform", str(batch_dump), "--cycles", "500:600"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "select no cycle" in err, err
    assert main(["conform", str(batch_dump), "--requests", "0,,1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "requests holds ''" in err, err


def test_a_slice_judges_its_own_cycles_and_reads_the_history_before_it(engine, batch_dump, tmp_path):
    """A clean dump checked from step 3: the drafter-context contract passes, which it can only if the positions
    the drafter took in before the slice were read, and every contract that needs the committed context passes,
    which it can only if the tokens committed before the slice were read. A fault planted before the slice is
    not judged; the same fault inside it is."""
    objs = records(batch_dump)
    r = conform(batch_dump, models=engine, cycles=(3, 5))
    in_slice = [o for o in objs if o.get("kind") == "cycle" and 3 <= o["step"] < 5]
    assert r.cycles == len(in_slice) == 4 and r.requests == 2
    assert r.broken == [], str(r)
    for name in ("drafter context", "drafter output", "target logits", "committed tokens"):
        assert r.results[name].checked == 4, (name, r.results[name].to_dict())
    assert any(n.startswith("a slice was checked: steps 3 to 4, 4 of the dump's") for n in r.notes), r.notes
    assert r.to_dict()["selection"] == {"cycles": [3, 5], "requests": None}
    assert "4 cycles of 2 request(s)" in str(r).splitlines()[0]

    # the root's position written one on in request 0's step-1 record: the verify-positions contract breaks there
    from workbench.records.tensor_codec import pack_tensor, unpack_tensor

    bad = [dict(o) for o in objs]
    i = next(k for k, o in enumerate(bad) if o.get("kind") == "cycle" and o["step"] == 1 and o["request"] == "0")
    bad[i]["verify_positions"] = pack_tensor(unpack_tensor(bad[i]["verify_positions"]) + 1)
    path = tmp_path / "fault.dump"
    path.write_text("".join(json.dumps(o) + "\n" for o in bad))
    assert conform(path, models=engine, cycles=(2, 3)).broken == []  # before the slice: read, not judged
    r = conform(path, models=engine, cycles=(1, 2))
    assert r.broken == ["verify positions"] and r.results["verify positions"].first["step"] == 1, str(r)


def test_requests_select_their_cycles_and_both_together_meet(engine, batch_dump, no_models):
    from workbench.conform.selection import check_against, extent, selection

    ext = extent(batch_dump)
    one = steps_of(batch_dump, "1")
    kept = check_against(selection(None, ["1"]), ext, batch_dump)
    assert (kept.cycles, kept.requests) == (len(one), 1)
    assert "request(s) '1'" in kept.note and "steps" not in kept.note.split(",")[0]
    kept = check_against(selection("2:4", [1]), ext, batch_dump)  # an int id as the workbench numbers requests
    assert (kept.cycles, kept.requests) == (2, 1)
    kept = check_against(selection("4:", None), ext, batch_dump)
    assert kept.cycles == sum(s >= 4 for s in steps_of(batch_dump))
    assert selection((None, 3), None) == selection(":3", None) == selection((0, 3), None)
    over = max(steps_of(batch_dump)) + 50
    kept = check_against(selection((2, over), None), ext, batch_dump)
    assert f"(the dump's records end at step {max(steps_of(batch_dump))})" in kept.note


def test_the_cli_checks_a_slice_of_requests_and_shows_progress_on_long_checks(batch_dump, capsys):
    steps = steps_of(batch_dump, "0")
    assert main(["conform", str(batch_dump), "--requests", "0", "--cycles", "0:2", "--json"]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["cycles"] == 2 and out["requests"] == 1 and out["selection"] == {"cycles": [0, 2], "requests": ["0"]}
    assert "checking" not in cap.err  # two cycles: no progress lines
    everything = steps_of(batch_dump)
    assert len(steps) <= 8 < len(everything)
    assert main(["conform", str(batch_dump), "--cycles", "1:"]) == 0  # more than a few cycles: progress lines
    err = capsys.readouterr().err
    n = sum(s >= 1 for s in everything)
    assert f"conform: checking {n} cycles of {len(everything)}\n" in err, err
    assert f"conform: {n}/{n} cycles checked in" in err, err
    assert main(["conform", str(batch_dump), "--cycles", "1:", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_progress_lines_say_how_far_how_long_and_about_how_long_is_left():
    now = [0.0]
    said: list[str] = []
    p = Progress(said.append, 40, clock=lambda: now[0])
    p.start(" of 100")
    for _ in range(20):
        now[0] += 0.5
        p.tick()
    now[0] += 30.0  # a slow cycle: a line once 10 s have passed, whatever the count
    p.tick()
    for _ in range(19):
        now[0] += 0.5
        p.tick()
    assert said == ["checking 40 cycles of 100", "16/40 cycles checked in 8 s, about 12 s left",
                    "21/40 cycles checked in 40 s, about 36 s left", "37/40 cycles checked in 48 s, about 4 s left",
                    "40/40 cycles checked in 50 s"], said
    few: list[str] = []
    p = Progress(few.append, 8)
    p.start()
    for _ in range(8):
        p.tick()
    assert few == []
    assert [duration(s) for s in (42, 210, 9000)] == ["42 s", "3.5 min", "2.5 h"]
