"""A dump never overwrites or interleaves silently: an existing path is refused unless
``dump_replace=True``, one writer per path in the process, the path probed for writing before the prefill,
a resumed session never appends to a file another writer replaced, and every record is numbered (``seq``)."""
from __future__ import annotations

import json

import pytest

import workbench as wb
from workbench.conform.dump import DumpWriter, make_header, read_dump

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = ["def add(a, b):", "for i in range(10):"]


def refuse_prefill(*a, **k):
    raise AssertionError("prefill ran before the dump path was refused")


@pytest.fixture
def no_prefill(monkeypatch):
    from workbench.engine.runner import Rows

    monkeypatch.setattr(Rows, "prefill", refuse_prefill)


def one_line(excinfo, words: str) -> None:
    msg = str(excinfo.value)
    assert "\n" not in msg and words in msg, msg


def test_an_existing_dump_is_refused_unless_replace_is_asked(engine, tmp_path, monkeypatch):
    path = tmp_path / "run.dump"
    path.write_text("someone's notes\n")
    with monkeypatch.context() as m:
        from workbench.engine.runner import Rows

        m.setattr(Rows, "prefill", refuse_prefill)
        for start in (lambda **kw: engine.session(PROMPTS[0], **kw), lambda **kw: engine.batch_session(PROMPTS, **kw)):
            with pytest.raises(ValueError) as e:
                start(dump=path)
            one_line(e, f"dump={str(path)!r} exists; pass dump_replace=True to overwrite it, or give another path")
        with pytest.raises(ValueError) as e:
            engine.session(PROMPTS[0], dump_replace=True)
        one_line(e, "dump_replace=True without dump=")
        with pytest.raises(ValueError) as e:
            engine.session(PROMPTS[0], dump=path, dump_replace="yes")
        one_line(e, "dump_replace='yes' must be True")
    assert path.read_text() == "someone's notes\n"
    engine.session(PROMPTS[0], policy=wb.DFlash(), max_new_tokens=4, dump=path, dump_replace=True).run()
    head, recs = read_dump(path)
    assert head["engine"]["name"] == "workbench" and len(list(recs)) >= 2 and recs.complete


def test_one_writer_per_path_while_it_is_open(engine, tmp_path):
    path = tmp_path / "shared.dump"
    first = engine.session(PROMPTS[0], policy=wb.DFlash(), max_new_tokens=6, dump=path)  # its writer is open
    for kw in ({}, {"dump_replace": True}):
        with pytest.raises(ValueError) as e:
            engine.batch_session(PROMPTS, dump=path, **kw)
        one_line(e, f"dump={str(path)!r} is still being written by DumpWriter(")
    with pytest.raises(ValueError, match="is still being written by"):
        DumpWriter(path, make_header({"name": "test"}, {}), replace=True)
    first.run()  # finished: its writer closed; the path may be replaced now, and only on request
    second = engine.session(PROMPTS[1], policy=wb.DFlash(), max_new_tokens=4, dump=path, dump_replace=True)
    second.run()
    _, recs = read_dump(path)
    assert {r.request for r in recs} == {"0"} and recs.complete
    first_len = len(path.read_text())
    # the first session resumed: its file is another run's now, so it stops dumping and says so
    with pytest.warns(UserWarning, match="changed since this writer closed it"):
        first.run(max_new_tokens=12)
    assert len(path.read_text()) == first_len and first.dump is None


@pytest.mark.parametrize("where,words", [
    ("/proc/x.dump", "dump='/proc/x.dump' cannot be written (No such file or directory); give a path in a folder "
                     "you can write to"),
    ("{tmp}/notes.txt/x.dump", "{tmp}/notes.txt is a file, not a folder"),
    ("{tmp}/notes.txt/sub/x.dump", "{tmp}/notes.txt is a file, not a folder"),
])
def test_an_unwritable_path_is_named_before_the_prefill(engine, tmp_path, no_prefill, where, words):
    (tmp_path / "notes.txt").write_text("")
    path = where.format(tmp=tmp_path)
    for start in (lambda: engine.session(PROMPTS[0], dump=path), lambda: engine.batch_session(PROMPTS, dump=path)):
        with pytest.raises(ValueError) as e:
            start()
        one_line(e, words.format(tmp=tmp_path))
        assert "does not exist" not in str(e.value)


def test_the_vllm_adapter_refuses_an_existing_dump_before_it_starts_a_request(tmp_path):
    from workbench.adapters.vllm_engine import VllmEngine

    path = tmp_path / "v.dump"
    path.write_text("")
    bare = object.__new__(VllmEngine)  # nothing of vLLM loaded: the path is checked first
    with pytest.raises(ValueError) as e:
        bare.session("def parse(line):", dump=path)
    one_line(e, "exists; pass dump_replace=True")


def test_every_record_is_numbered_by_the_writer_and_a_reopen_of_a_replaced_file_is_refused(tmp_path):
    path = tmp_path / "n.dump"
    w = DumpWriter(path, make_header({"name": "test"}, {}))
    w.request("a")
    w.cycle("a", 0, bonus=1)
    with pytest.raises(ValueError, match="'seq' is numbered by the writer"):
        w.cycle("a", 1, seq=7)
    w.close()
    w.reopen()  # the file as it left it: goes on, numbering on
    w.cycle("a", 1, bonus=2)
    w.close()
    assert [json.loads(line).get("seq") for line in path.read_text().splitlines()[1:-1]] == [0, 1, 2]
    _, recs = read_dump(path)
    assert [r["seq"] for r in recs] == [0, 1, 2] and recs.complete
    with DumpWriter(path, make_header({"name": "other"}, {}), replace=True) as other:
        other.request("b")
    with pytest.raises(ValueError) as e:
        w.reopen()
    one_line(e, "changed since this writer closed it")
    assert json.loads(path.read_text().splitlines()[0])["engine"]["name"] == "other"
