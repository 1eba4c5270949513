"""python -m workbench.train.pair_head: every flag refused up front in one line naming the flag and its
value; the head written to exactly --out, atomically, and an existing one replaced only with --replace."""
from __future__ import annotations

import os

import pytest

from workbench.engine.policies.pair_head import load_head
from workbench.train import pair_head
from workbench.train.corpus import SourceFile


@pytest.fixture()
def small_corpus(monkeypatch):
    """Two tiny training files in place of the standard library (the head's making, not its quality)."""
    files = [SourceFile("a.py", "def f(x):\n    return x + 1\n" * 20), SourceFile("b.py", "import os\nprint(os.sep)\n")]
    monkeypatch.setattr(pair_head.corpus, "list_sources", lambda *a, **k: files)


def refused(capsys, argv) -> str:
    assert pair_head.main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("pair_head: "), err
    return err[0]


@pytest.mark.parametrize("argv,msg", [
    (["--out", "{tmp}"], "pair_head: --out '{tmp}' is a directory"),
    (["--out", "{tmp}/x.txt"], "pair_head: --out {tmp}/x.txt: a pair head is an .npz file; give a name ending in .npz"),
    (["--out", "/proc/x"], "pair_head: --out '/proc/x' cannot be written"),
    (["--out", "{tmp}/old.npz"], "pair_head: --out {tmp}/old.npz exists; give --replace to write over it"),
    (["--out", "{tmp}/h.npz", "--successors", "0"], "pair_head: --successors 0: must be 1 or more"),
    (["--out", "{tmp}/h.npz", "--smoothing", "1.5"], "pair_head: --smoothing 1.5: must be in (0, 1)"),
    (["--out", "{tmp}/h.npz", "--target", "/nonexistent"], "pair_head: --target /nonexistent: neither dense nor hybrid"),
])
def test_flags_are_refused_up_front(tmp_path, capsys, monkeypatch, argv, msg):
    def refuse(*_a, **_k):
        raise AssertionError("the work started before the flags were checked")
    monkeypatch.setattr(pair_head.corpus, "list_sources", refuse)
    (tmp_path / "old.npz").write_bytes(b"old")
    assert refused(capsys, [a.format(tmp=tmp_path) for a in argv]).startswith(msg.format(tmp=tmp_path))
    assert (tmp_path / "old.npz").read_bytes() == b"old" and not (tmp_path / "x.txt.npz").exists()


def test_the_head_is_written_to_out_atomically_and_replaced_only_when_asked(tmp_path, capsys, monkeypatch,
                                                                            small_corpus):
    out = tmp_path / "h.npz"
    replaced = []
    monkeypatch.setattr("workbench.records.files.os.replace", lambda a, b: replaced.append(b) or os.rename(a, b))
    assert pair_head.main(["--out", str(out), "--successors", "4"]) == 0
    assert replaced == [out] and [p.name for p in tmp_path.iterdir()] == ["h.npz"]
    assert load_head(out).succ_ids.shape[1] == 4 and f"-> {out} (" in capsys.readouterr().out
    assert "exists; give --replace" in refused(capsys, ["--out", str(out), "--successors", "2"])
    assert pair_head.main(["--out", str(out), "--successors", "2", "--replace"]) == 0
    assert load_head(out).succ_ids.shape[1] == 2 and [p.name for p in tmp_path.iterdir()] == ["h.npz"]
