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
    both = json.loads(run(str(trace), str(dump), "--json"))["records"]
    assert [r["request"] for r in both] == [f"{trace}:0", f"{dump}:0"]
    assert {k: v for k, v in both[1].items() if k not in ("request", "engine")} == \
        {k: v for k, v in want.items() if k != "engine"}  # the dump and the trace of one run agree
    text = run(str(dump))
    assert "mean acceptance length" in text and "as vllm bench serve prints them: Acceptance length" in text


def test_a_file_that_is_neither_is_one_line(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text('{"hello": 1}\n')
    for path, words in ((other, "is neither a cycle dump"), (tmp_path / "none.dump", "no such file")):
        with pytest.raises(AcceptanceError) as e:
            run(str(path))
        assert words in str(e.value) and "\n" not in str(e.value)
