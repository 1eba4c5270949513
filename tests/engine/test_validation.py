"""Nothing silent: one line naming the value, from Python and from the command line alike, damaged
traces refused at load with file:line, outputs checked before any work."""
from __future__ import annotations

import json
import os
import stat

import pytest
import torch

import workbench as wb
from workbench.__main__ import main
from workbench.records.cycle import Trace, TraceFileError

PAIR = "l4-h32"  # block size 8: the drafter drafts 7 slots


@pytest.fixture(scope="module")
def pair(tiny_pairs):
    return tiny_pairs[PAIR]


@pytest.fixture(scope="module")
def eng(tiny_engines):
    return tiny_engines[PAIR]


@pytest.fixture(scope="module")
def pair_args(pair):
    t, d = pair
    return ["--target", str(t), "--draft", str(d), "--threads", "1"]


def one_line_error(capsys, argv, *needles) -> str:
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 2, (rc, cap.out, cap.err)
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def one_line_value_error(fn, *needles) -> str:
    with pytest.raises(ValueError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


# ------------------------------------------------------------------------------- item 5: API and CLI agree
@pytest.mark.parametrize("kw, needle", [
    ({"device": "meta"}, "device='meta'"),
    ({"dtype": torch.float8_e4m3fn}, "float8_e4m3fn"),
    ({"threads": 0}, "threads=0"),
])
def test_load_refuses_before_loading(pair, kw, needle):
    t, d = pair
    one_line_value_error(lambda: wb.load(target=t, draft=d, **kw), needle)


@pytest.mark.parametrize("kw, needle", [
    ({"prompt": "t1 \ud800 t2"}, "index 3"),
    ({"capture": "yes"}, "capture='yes'"),
    ({"temperature": float("inf")}, "temperature=inf"),
    ({"record_topk": 0}, "record_topk=0"),
    ({"policy": wb.EagleTree(topk=2, steps=50, num_draft_tokens=8)}, "steps=50"),
])
def test_session_refuses_at_once(eng, kw, needle):
    args = {"prompt": "t1 t2 t3", **kw}
    msg = one_line_value_error(lambda: eng.session(args.pop("prompt"), **args), needle)
    assert "max_budget" not in msg


def test_seed_assignment_is_checked_and_applied(eng):
    def run(reseed):
        s = eng.session("t1 t2 t3", wb.DDTree(4), temperature=1.0, seed=5, max_new_tokens=24)
        if reseed is not None:
            s.seed = reseed  # after the prefill: the next cycles draw from the new seed
        return s.run().accept_lengths, s.tokens, s

    a, b, c = run(11), run(11), run(None)
    assert a[:2] == b[:2] and a[:2] != c[:2]
    s = a[2]
    one_line_value_error(lambda: setattr(s, "seed", -3), "seed=-3")
    with pytest.raises(ValueError, match="steps=50"):
        s.policy = wb.EagleTree(topk=2, steps=50, num_draft_tokens=8)


def test_server_port_checked_from_python(eng):
    from workbench.serve import EngineServer

    one_line_value_error(lambda: EngineServer(eng, port=99999), "port=99999")


@pytest.mark.parametrize("argv, needle", [
    (["serve", "--port", "99999"], "port=99999"),
    (["run", "--prompt", "caf\udce9"], "index 3"),  # non-UTF-8 byte 0xe9 as Python's argv holds it
    (["run", "--prompt", "x", "--temperature", "inf"], "temperature=inf"),
    (["run", "--prompt", "x", "--seed", "-3"], "seed=-3"),
    (["run", "--prompt", "x", "--threads", "0"], "threads=0"),
    (["run", "--prompt", "x", "--device", "meta"], "device='meta'"),
])
def test_cli_same_line_before_loading(capsys, argv, needle):
    one_line_error(capsys, argv, needle)


def test_cli_refuses_policy_the_drafter_cannot_fill(capsys, pair_args):
    one_line_error(capsys, ["run", "--prompt", "t1 t2", "--policy", "EagleTree(2, 50, 8)", *pair_args], "steps=50")


def test_cli_dtype_names_the_value(capsys, pair_args):
    one_line_error(capsys, ["run", "--prompt", "t1", "--dtype", "float8_e4m3fn", *pair_args], "float8_e4m3fn")


# ------------------------------------------------------------------------------- item 4: outputs first
@pytest.mark.parametrize("cmd", ["run", "bench", "report"])
def test_missing_output_folder_refused_before_work_nothing_created(capsys, tmp_path, pair_args, cmd, monkeypatch):
    import workbench.engine.core as engine_mod

    monkeypatch.setattr(engine_mod, "load", lambda *a, **k: pytest.fail("models loaded before the output check"))
    dest = tmp_path / "no" / "such" / "out.jsonl"
    argv = {"run": ["run", "--prompt", "t1", "--trace", str(dest), *pair_args],
            "bench": ["bench", "--limit", "1", "--out", str(dest), *pair_args],
            "report": ["report", str(tmp_path / "x.jsonl"), "--out", str(dest)]}[cmd]
    (tmp_path / "x.jsonl").write_text("{}\n")
    line = one_line_error(capsys, argv, str(dest), "does not exist")
    assert ".tmp" not in line
    assert not (tmp_path / "no").exists()


def test_unwritable_output_refused_before_work(capsys, tmp_path, pair_args, monkeypatch):
    if os.geteuid() == 0:  # root writes anywhere; a file in place of the folder stands in
        (tmp_path / "ro").write_text("")
        dest = tmp_path / "ro" / "t.jsonl"
        needle = "is not a directory"
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        dest = tmp_path / "ro" / "t.jsonl"
        needle = "cannot be written"
    import workbench.engine.core as engine_mod

    monkeypatch.setattr(engine_mod, "load", lambda *a, **k: pytest.fail("models loaded before the output check"))
    one_line_error(capsys, ["run", "--prompt", "t1", "--trace", str(dest), *pair_args], str(dest), needle)


def test_write_error_names_the_path_not_the_temp_file(tmp_path, monkeypatch):
    from workbench.records.files import write_text_atomic

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError) as e:
        write_text_atomic(tmp_path / "out.html", "x")
    assert str(tmp_path / "out.html") in str(e.value) and ".tmp" not in str(e.value)
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too


def test_trace_saved_with_the_mode_of_other_outputs(eng, tmp_path):
    from workbench.records.files import write_text_atomic

    t = eng.generate("t1 t2", wb.DDTree(4), max_new_tokens=4)
    a = t.save(tmp_path / "t.jsonl")
    b = write_text_atomic(tmp_path / "b.html", "x")
    assert stat.S_IMODE(a.stat().st_mode) == stat.S_IMODE(b.stat().st_mode) == 0o666 & ~_umask()
    with pytest.raises(ValueError, match="does not exist"):
        t.save(tmp_path / "missing" / "t.jsonl")
    assert not (tmp_path / "missing").exists()


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


# ------------------------------------------------------------------------------- item 4: traces checked at load
@pytest.fixture(scope="module")
def saved(eng, tmp_path_factory):
    t = eng.generate("t1 t2 t3 t4", wb.DDTree(6), max_new_tokens=16)  # random weights: nothing accepted
    return t.save(tmp_path_factory.mktemp("tr") / "good.jsonl")


def _damage(saved, tmp_path, fn, line_no=2):
    lines = saved.read_text().splitlines()
    rec = json.loads(lines[line_no - 1])
    fn(rec)
    lines[line_no - 1] = json.dumps(rec)
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def _rejecting_line(saved) -> int:
    """A cycle line whose walk stopped at the root (so a child of the root can be made to match)."""
    lines = saved.read_text().splitlines()
    return next(i + 1 for i, ln in enumerate(lines[1:-1], 1) if len(json.loads(ln)["accepted_nodes"]["data"]) == 1)


def _set(rec, field, data):
    rec[field]["data"] = data
    rec[field]["shape"] = [len(data)] if data and not isinstance(data[0], list) else [len(data), len(data[0])]


DAMAGE = {
    "parents shorter than tokens": (lambda r: _set(r, "parents", r["parents"]["data"][:-1]), "parents has shape"),
    "token outside the vocabulary": (lambda r: r["tokens"]["data"].__setitem__(-1, 99999), "token 99999"),
    "child before parent": (lambda r: r["parents"]["data"].__setitem__(1, 3), "every parent comes before"),
    "depth off": (lambda r: r["depth"]["data"].__setitem__(1, 5), "depth 5"),
    "walk stops though a child matches": (
        lambda r: r["target_choice"]["data"].__setitem__(0, r["tokens"]["data"][1]), "stops at node 0"),
    "accepted path is not a root path": (lambda r: r["accepted_nodes"].update(data=[1], shape=[1]),
                                         "starts at node 1"),
    "bonus is not the choice": (lambda r: r.__setitem__("bonus", (r["bonus"] + 1) % 64), "bonus"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_inconsistent_trace_refused_with_file_and_line(saved, tmp_path, case):
    fn, needle = DAMAGE[case]
    no = _rejecting_line(saved)
    p = _damage(saved, tmp_path, fn, no)
    with pytest.raises(TraceFileError) as e:
        Trace.load(p)
    assert str(e.value).startswith(f"{p}:{no}: "), str(e.value)
    assert needle in str(e.value)


def test_report_exits_2_on_an_inconsistent_trace(capsys, saved, tmp_path):
    p = _damage(saved, tmp_path, DAMAGE["token outside the vocabulary"][0], 2)
    out = tmp_path / "r.html"
    one_line_error(capsys, ["report", str(p), "--out", str(out)], f"{p}:2:", "99999")
    assert not out.exists()


def test_consistent_trace_loads(saved):
    assert Trace.load(saved).new_tokens == 16


# ------------------------------------------------------------------------------- item 8: progress by default
def test_bench_shows_progress_on_a_non_terminal_stderr_unless_quiet(capsys, pair_args, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "t1 t5 t9"}\n')
    argv = ["bench", "--policies", "ar,ddtree:4", "--prompts", str(prompts), "--max-new-tokens", "6",
            "--repeats", "1", *pair_args]
    assert main(argv) == 0
    err = capsys.readouterr().err  # capsys: stderr is not a terminal
    assert "bench" in err and "warm-up" in err
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("ids, needle", [
    ([1.7, 2.2], "prompt_ids[0]=1.7 is not a token id; give integers"),  # not silently [1, 2]
    ([3, True], "prompt_ids[1]=True is not a token id"),
    ([], "prompt_ids=[] is empty; give at least one token id"),  # not 'prompt_ids=None'
    (torch.tensor([2.5, 3.0]), "prompt_ids[0]=tensor(2.5000) is not a token id"),
])
def test_prompt_ids_must_be_integers(eng, ids, needle):
    one_line_value_error(lambda: eng.session(prompt_ids=ids, max_new_tokens=2), needle)
    assert eng.session(prompt_ids=torch.tensor([3, 5]), max_new_tokens=2).prompt_ids == [3, 5]  # integer tensors do
