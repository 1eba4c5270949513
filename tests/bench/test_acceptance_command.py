"""``python -m workbench acceptance FILE ...`` (``workbench.bench.acceptance_command``, wired into the command line
by cli.py): a saved trace and a cycle dump give the records ``wb.analysis.acceptance`` gives; a file that is
neither is one line."""
from __future__ import annotations

import argparse
import io
import json

import pytest

import workbench as wb
from workbench.analysis.acceptance import AcceptanceError, acceptance
from workbench.bench import acceptance_command


def run(*argv) -> str:
    parser = argparse.ArgumentParser()
    acceptance_command.add_parser(parser.add_subparsers(dest="command"))
    out = io.StringIO()
    assert acceptance_command.run(parser.parse_args(["acceptance", *argv]), out, io.StringIO()) == 0
    return out.getvalue()


def test_a_trace_and_a_dump_give_their_records(engine, tmp_path):
    dump = tmp_path / "run.dump"
    s = engine.session("def parse(line):", policy=wb.DDTree(16), max_new_tokens=24, dump=dump)
    t = s.run()
    trace = t.save(tmp_path / "run.trace.jsonl")
    # the histogram's keys are strings in JSON, as AIPerf reads them
    want = json.loads(json.dumps(acceptance(t).records[0].to_dict()))
    out = json.loads(run(str(trace), "--json"))
    assert out["records"] == [{"request": "0", **want}]
    assert out["bench_serve"]["spec_decode_num_drafts"] == len(t.cycles)
    from_dump = json.loads(run(str(dump), "--json"))["records"]
    assert [r["request"] for r in from_dump] == ["0"]
    assert {k: v for k, v in from_dump[0].items() if k not in ("request", "engine")} == \
        {k: v for k, v in want.items() if k != "engine"}  # the dump and the trace of one run agree
    other = tmp_path / "other.trace.jsonl"
    engine.session("class Stack:", policy=wb.DDTree(16), max_new_tokens=24).run().save(other)
    both = json.loads(run(str(trace), str(other), "--json"))["records"]
    assert [r["request"] for r in both] == [f"{trace}:0", f"{other}:0"]  # two runs' "0" stay apart
    text = run(str(dump))
    assert "mean acceptance length" in text and "as vllm bench serve prints them: Acceptance length" in text


def test_a_file_that_is_neither_is_one_line(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text('{"hello": 1}\n')
    for path, words in ((other, "is neither a cycle dump"), (tmp_path / "none.dump", "no such file")):
        with pytest.raises(AcceptanceError) as e:
            run(str(path))
        assert words in str(e.value) and "\n" not in str(e.value)


def cli(*argv):
    """``workbench acceptance ...`` as the command line runs it: (exit code, stdout, stderr)."""
    from contextlib import redirect_stderr, redirect_stdout

    from workbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["acceptance", *argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def saved_run(engine, tmp_path_factory):
    """One DDTree run of three prompts, saved as its dump and as the first request's trace."""
    d = tmp_path_factory.mktemp("run")
    b = engine.batch_session(["def parse(line):", "class Stack:", "import os\n"], wb.DDTree(16), max_new_tokens=24,
                             dump=d / "run.dump")
    b.run()
    return d / "run.dump", b.sessions[0].trace.save(d / "run.trace.jsonl")


def test_a_dump_cut_before_its_first_cycle_is_refused(saved_run, tmp_path):
    dump, _ = saved_run
    lines = dump.read_bytes().split(b"\n")
    first_cycle = next(i for i, line in enumerate(lines) if b'"kind":"cycle"' in line)
    for name, body in (("requests.dump", b"\n".join(lines[:first_cycle]) + b"\n"),
                       ("mid.dump", b"\n".join(lines[:first_cycle]) + b"\n" + lines[first_cycle][:40])):
        cut = tmp_path / name
        cut.write_bytes(body)
        for args in ((str(cut),), (str(cut), "--whole-only")):
            rc, out, err = cli(*args)
            assert (rc, out) == (2, "") and err.count("\n") == 1, (args, err)
            assert "holds no cycle record" in err and "0 steps" not in err


def test_a_cut_dump_is_refused_unless_asked_to_read_what_is_whole(saved_run, tmp_path):
    dump, _ = saved_run
    lines = dump.read_bytes().split(b"\n")
    cycles = [i for i, line in enumerate(lines) if b'"kind":"cycle"' in line]
    cut = tmp_path / "cut.dump"
    cut.write_bytes(b"\n".join(lines[:cycles[4]]) + b"\n" + lines[cycles[4]][:60])
    rc, out, err = cli(str(cut))
    assert (rc, out) == (2, "") and err.count("\n") == 1
    assert "the last line is cut short" in err and "--whole-only" in err
    rc, out, err = cli(str(cut), "--whole-only")
    assert rc == 0 and f"read 4 whole cycles of {cut}, cut short at line {cycles[4] + 1}" in out
    assert json.loads(cli(str(cut), "--whole-only", "--json")[1])["bench_serve"]["spec_decode_num_drafts"] == 4
    with pytest.raises(AcceptanceError, match="whole_only=True"):
        from workbench.conform.dump import read_dump
        acceptance(read_dump(cut))


def test_a_run_given_twice_is_refused(saved_run, tmp_path):
    dump, trace = saved_run
    copy = tmp_path / "copy.dump"
    copy.write_bytes(dump.read_bytes())
    for files, words in (((dump, dump), "given twice"), ((dump, copy), "a copy"), ((trace, dump), "a copy"),
                         ((dump, trace), "a copy")):
        rc, out, err = cli(*map(str, files))
        assert (rc, out) == (2, "") and err.count("\n") == 1, (files, err)
        assert words in err and "new sample" in err


def test_two_pairs_are_not_pooled_into_one_line(saved_run, tmp_path):
    dump, trace = saved_run
    lines = dump.read_text().split("\n")
    head = json.loads(lines[0])
    head["pair"]["target"], head["pair"]["hybrid"] = "workbench/assets/hybrid/target", True
    head["pair"]["draft"] = "workbench/assets/hybrid/draft"
    other = tmp_path / "hybrid.dump"
    other.write_text("\n".join([json.dumps(head)] + lines[1:]))
    rc, out, err = cli(str(trace), str(other))
    assert (rc, out) == (2, "") and err.count("\n") == 1
    assert "workbench/assets/hybrid/target" in err and "one pair" in err
